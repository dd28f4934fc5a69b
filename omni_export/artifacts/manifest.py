"""Manifest schema and provenance: who built what, from which weights, with which toolchain."""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SCHEMA_VERSION = 1
TOOL_PACKAGES = ("omni-export", "torch", "executorch", "torchao", "onnx", "onnxscript", "onnxruntime",
                 "onnxruntime-qnn", "qai-hub", "numpy", "safetensors")


# What is left after a JSON error when the text was cut inside its last token: a prefix of a literal or
# a number (the empty string too).
_INCOMPLETE_TOKEN = re.compile(r"-?[0-9.eE+-]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|N(aN?)?|-?I(n(f(i(n(i(ty?)?)?)?)?)?)?")


# A precision repair step's (and result's) key listing the modules it raised, per raise (jobs/repair.RAISES).
RAISED_KEY = {"float": "kept_float", "int16": "weights_16bit", "int8": "weights_8bit"}


def raised_names(step: dict) -> tuple[list[str], str]:
    """(the modules a recorded repair step or result raised, how: "at 16-bit weights", "kept in float")."""
    for key, how in (("weights_16bit", "at 16-bit weights"), ("weights_8bit", "at 8-bit weights")):
        if step.get(key):
            return list(step[key]), how
    return list(step.get("kept_float") or []), "kept in float"


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    """The omni-export source revision (with '-dirty' when the tree has local changes)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) if sha else None


def toolchain() -> dict:
    from ..qnn_ep import qnn_version

    versions = {name: package_version(name) for name in TOOL_PACKAGES}
    versions["qnn"] = qnn_version()
    versions["python"] = platform.python_version()
    versions["omni-export-git"] = git_sha()
    return versions


def host() -> dict:
    """The building host; its CPU's model and flags decide some scores (cpu.py: XNNPACK's fp16
    accumulation), so they are kept with every build."""
    from ..cpu import cpu_facts

    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "torch_threads": _torch_threads(), **cpu_facts()}


def weight_files(checkpoint: Path) -> list[dict]:
    """sha256 and size of every .safetensors under a checkpoint, for the manifest. Symlinks are
    followed (the Hugging Face cache links snapshot files to blobs/ outside the snapshot); the
    resolved path is recorded for each one, and `outside_checkpoint` when it leaves the directory."""
    from ..weights import require_regular_file
    from .store import sha256_file

    root = checkpoint.resolve()
    out = []
    for p in sorted(checkpoint.rglob("*.safetensors")):
        require_regular_file(p, "weight file")
        entry = {"path": p.relative_to(checkpoint).as_posix(), "sha256": sha256_file(p), "bytes": p.stat().st_size}
        real = p.resolve()
        if p.is_symlink() or real != root / p.relative_to(checkpoint):
            entry["resolved"] = str(real)
            entry["outside_checkpoint"] = root not in real.parents
        out.append(entry)
    return out


def _torch_threads() -> int | None:
    if "torch" not in sys.modules:
        return None
    return sys.modules["torch"].get_num_threads()


def hash_arrays(samples: list[dict]) -> str:
    """A content hash of a list of {name: ndarray} samples (names, dtypes, shapes and bytes)."""
    import numpy as np

    h = hashlib.sha256()
    for s in samples:
        for k in sorted(s):
            a = np.ascontiguousarray(s[k])
            h.update(f"{k}|{a.dtype.str}|{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def dumps(obj) -> str:
    return json.dumps(obj, indent=2)


# ------------------------------------------------------------------------------- reading a manifest
#
# `report`, `parity`, `diff`, `synth --build`, `hub submit` and `hub status` read OUT/manifest.json
# through read_manifest(): a damaged or hostile manifest is one UsageError line naming the file and
# what is wrong (unparseable at line/column, a schema violation at its JSON path, an artifact path
# that leaves OUT), never a traceback further on and never a file read outside OUT.

MANIFEST_BYTES = 64 << 20       # a 0.6B build with AI Hub records is well under 1 MiB (docs/errors.md)
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "schemas" / "manifest.schema.json"
_NON_FINITE = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}


def read_manifest(out: str | Path, file: str | Path | None = None) -> dict:
    """OUT's manifest.json (or `file`), checked before anything uses it: a regular file within
    MANIFEST_BYTES, UTF-8 JSON without duplicated keys, an omni-export manifest of SCHEMA_VERSION
    valid against schemas/manifest.schema.json, and every artifact path it lists inside OUT
    (check_paths). Non-finite numbers of older manifests (bare NaN / Infinity, not JSON) are read as
    the words the writer uses now ("nan", "inf", "-inf"). Raises UsageError (one line)."""
    from ..core import UsageError
    from ..weights import require_regular_file

    out = Path(out)
    file = Path(file) if file is not None else out / "manifest.json"
    require_regular_file(file, "manifest")
    try:
        with open(file, "rb") as f:
            data = f.read(MANIFEST_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{file} cannot be read ({e.strerror})") from None
    if len(data) > MANIFEST_BYTES:
        raise UsageError(f"{file} is larger than {MANIFEST_BYTES >> 20} MiB; not a manifest omni-export wrote")
    m = parse_manifest(data, file)
    check_manifest(m, file, out)
    return m


def parse_manifest(data: bytes, file: str | Path) -> dict:
    """The JSON of a manifest; UsageError naming the line and column where it stops being JSON."""
    from ..core import UsageError

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{file}: not UTF-8 text (byte {e.start}); the file is damaged") from None
    try:
        m = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_NON_FINITE.__getitem__,
                       parse_float=_finite_float)
    except json.JSONDecodeError as e:
        what = e.msg
        if what.startswith("Unterminated string"):
            what = "a string starts here and never ends"
        # the text ends early: nothing after the error, or only the cut last token (`tr`, `-`, `1e`)
        ends = what != e.msg or _INCOMPLETE_TOKEN.fullmatch(text[e.pos:].strip()) is not None
        raise UsageError(f"{file}: not valid JSON at line {e.lineno} column {e.colno}: {what}"
                         + (" (the text ends early: truncated?)" if ends else "")) from None
    except _DuplicateKey as e:
        raise UsageError(f"{file}: {e}") from None
    except RecursionError:
        raise UsageError(f"{file}: nested too deeply to be a manifest") from None
    try:
        json.dumps(m, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{file}: {_surrogate_path(m)}: a string holds a lone surrogate (\\ud800-\\udfff), "
                         f"not Unicode text") from None
    return m


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(f"the key {json.dumps(twice)} appears twice in one object (which one holds?)")
    return d


def _finite_float(text: str) -> float | str:
    x = float(text)
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")    # 1e999: what json reads as inf


def _surrogate_path(obj, path: tuple = ()) -> str:
    if isinstance(obj, str):
        return json_path(path) if _has_surrogate(obj) else ""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        if isinstance(k, str) and _has_surrogate(k):
            return json_path(path) or "(top level)"
        found = _surrogate_path(v, (*path, k))
        if found:
            return found
    return ""


def _has_surrogate(s: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in s)


def check_manifest(m, file: str | Path, out: str | Path) -> None:
    """An omni-export manifest of SCHEMA_VERSION, valid against the published schema, listing no
    path outside OUT; UsageError naming the first violation's JSON path otherwise."""
    from ..core import UsageError

    if not isinstance(m, dict) or m.get("tool") != "omni-export" or m.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(f"{file} is not an omni-export manifest with schema_version {SCHEMA_VERSION}")
    error = schema_error(m)
    if error:
        raise UsageError(f"{file}: {error}")
    check_paths(m, file, out)


def schema_error(m: dict, schema_file: Path = SCHEMA_FILE) -> str | None:
    """The most specific violation of schemas/manifest.schema.json (or another published schema: the
    bundle's runtime.schema.json), as `json.path: what`, or None."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(schema_file).iter_errors(m))
    if error is None:
        return None
    where = json_path(error.absolute_path)
    return f"{where}: {_what(error)}" if where else _what(error)


@functools.lru_cache(maxsize=4)
def _validator(schema_file: Path = SCHEMA_FILE):
    from jsonschema.validators import validator_for

    schema = json.loads(schema_file.read_text())
    return validator_for(schema)(schema)


def _what(error) -> str:
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        if missing:
            return f"the key {json.dumps(missing[0])} is missing"
    if error.validator == "type":
        want = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"{_short(error.instance)} is not of type {' or '.join(repr(t) for t in want)}"
    text = error.message
    full = repr(error.instance)
    if len(full) > 60 and full in text:
        text = text.replace(full, _short(error.instance))
    return " ".join(text.split())                    # one line, whatever the schema's words


def _short(x, width: int = 60) -> str:
    if isinstance(x, dict):
        return "an object" if x else "{}"
    if isinstance(x, list):
        return f"an array of {len(x)}" if x else "[]"
    text = repr(x)
    return text if len(text) <= width else text[:width - 3] + "..."


def json_path(path) -> str:
    """builds[3].files[0].sha256 for the deque/tuple ('builds', 3, 'files', 0, 'sha256')."""
    out = ""
    for k in path:
        if isinstance(k, int):
            out += f"[{k}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", k):
            out += f".{k}" if out else k
        else:
            out += f"[{json.dumps(k)}]"
    return out


def check_paths(m: dict, file: str | Path, out: str | Path) -> None:
    """Every artifact path the manifest lists (store.listed_files: build files, samples, parity and
    calibration inputs, sources, AI Hub results) names a file inside OUT: relative, not leaving OUT
    through `..` or a symlinked directory, and not a symlink to something outside OUT (path_outside).
    UsageError naming the manifest, the record's JSON path and the path otherwise."""
    from ..core import UsageError
    from .store import listed_files

    records = listed_files(m)
    if not records:
        return
    where = _record_paths(m)
    for rec in records:
        why = path_outside(Path(out), rec.get("path"))
        if why:
            at = where.get(id(rec), "")
            raise UsageError(f"{file}: {at + '.path' if at else 'path'} {_short(rec.get('path'), 240)} {why}; "
                             f"a manifest lists files inside its output directory {Path(out)}")


def path_outside(out: Path, rel) -> str | None:
    """Why `rel`, a path a manifest lists, does not name a file inside OUT (None when it does): not a
    non-empty relative path, its directory resolves outside OUT (`..`, a symlinked directory; the rule
    integrity.check_files applies for `verify`), or it is a symlink whose target lies outside OUT."""
    if not isinstance(rel, str) or not rel.strip() or "\0" in rel:
        return "is not a file name"
    if os.path.isabs(rel):
        return "is an absolute path"
    root = out.resolve()
    p = out / rel
    try:
        parent = p.parent.resolve()
        if parent != root and root not in parent.parents:
            return "leaves the output directory" + (" through a symlink" if ".." not in Path(rel).parts else "")
        if p.is_symlink():
            real = p.resolve()
            if real != root and root not in real.parents:
                return f"is a symlink to {real}, outside the output directory"
    except (OSError, RuntimeError, ValueError):      # a symlink loop, a name the OS refuses
        return "cannot be resolved (a symlink loop?)"
    return None


def _record_paths(m: dict) -> dict[int, str]:
    """id(dict) -> its JSON path, for every object in the manifest (to name a listed file's record)."""
    found: dict[int, str] = {}
    stack: list = [(m, ())]
    while stack:
        obj, path = stack.pop()
        if isinstance(obj, dict):
            found[id(obj)] = json_path(path)
            stack += [(v, (*path, k)) for k, v in obj.items() if isinstance(v, (dict, list))]
        elif isinstance(obj, list):
            stack += [(v, (*path, i)) for i, v in enumerate(obj) if isinstance(v, (dict, list))]
    return found
