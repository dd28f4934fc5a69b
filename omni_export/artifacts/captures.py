"""Capture cache: the inputs captured from the fp32 model's generations, kept across runs.

Calibration and held-out inputs are captured by running the fp32 model over the recipe's prompts
(Qwen3-TTS: 20 generations, 480 predictor frames on the demo checkpoint; minutes at real sizes).
They are a deterministic function of the checkpoint's bytes, the recipe, its options, the seeds
and the code that generates them (tests/test_reproducibility.py shows the bytes repeat), so a run
whose key matches a stored capture reads it instead of generating again: a rebuild into a new
--out, with other formats or precisions, or with --force (which rebuilds every build, not its
inputs).

The key is sha256 over: what the recipe names (recipe, version, every option value), every file
of the checkpoint by sha256, omni-export's own source digest (any code change is a new key), and
the torch / numpy versions. Entries are an .npz of plain arrays (read with allow_pickle=False) and
a JSON index holding the structure and the .npz's sha256, checked before use; a damaged or
mismatched entry is ignored and replaced.

Where: $OMNI_EXPORT_CACHE_DIR/captures, else $XDG_CACHE_HOME/omni-export/captures (~/.cache).
OMNI_EXPORT_CAPTURE_CACHE=off turns it off. Captures past MAX_BYTES are not stored, and only the
KEEP most recently used entries are kept.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

ENV_DIR = "OMNI_EXPORT_CACHE_DIR"
ENV_SWITCH = "OMNI_EXPORT_CAPTURE_CACHE"
FORMAT = 1
MAX_BYTES = 1 << 30
KEEP = 8


def directory() -> Path | None:
    """Where captures are kept, or None when the cache is turned off."""
    return None if switched_off(ENV_SWITCH) else cache_root() / "captures"


def switched_off(env: str) -> bool:
    """Whether an on/off environment switch is set to off (0, off, no, false)."""
    return os.environ.get(env, "").strip().lower() in ("0", "off", "no", "false")


def cache_root() -> Path:
    """omni-export's per-user cache: $OMNI_EXPORT_CACHE_DIR, else $XDG_CACHE_HOME/omni-export (~/.cache)."""
    root = os.environ.get(ENV_DIR)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omni-export"
    return Path(root)


def checkpoint_files(checkpoint: Path, weights: list[dict]) -> list:
    """(path, sha256) of every file under the checkpoint; weights' sha256s as already taken at load."""
    from .store import sha256_file

    known = {w["path"]: w["sha256"] for w in weights}
    out = []
    for p in sorted(checkpoint.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(checkpoint).as_posix()
        out.append([rel, known.get(rel) or sha256_file(p)])
    return out


def key(**parts) -> str:
    import torch

    from ..numerics import VERSIONS

    material = {"format": FORMAT, "capture": VERSIONS["capture"], "torch": torch.__version__,
                "numpy": np.__version__, **parts}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _encode(obj, arrays: list):
    from ..captured import Sample

    if isinstance(obj, Sample):                        # kept compact, as it is held
        stored, shapes = obj.compact()
        return {"s": [_encode(stored, arrays), {k: list(v) for k, v in shapes.items()}]}
    if isinstance(obj, np.ndarray):
        arrays.append(obj)
        return {"a": len(arrays) - 1}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("capture dict keys must be strings")
        return {"d": {k: _encode(v, arrays) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return {"t" if isinstance(obj, tuple) else "l": [_encode(v, arrays) for v in obj]}
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return {"v": obj}
    raise TypeError(f"cannot keep a {type(obj).__name__} in the capture cache")


def _decode(node, arrays):
    (kind, value), = node.items()
    if kind == "a":
        return arrays[f"a{value}"]
    if kind == "s":
        from ..captured import Sample

        return Sample.from_compact(_decode(value[0], arrays), value[1])
    if kind == "d":
        return {k: _decode(v, arrays) for k, v in value.items()}
    if kind in ("l", "t"):
        items = [_decode(v, arrays) for v in value]
        return tuple(items) if kind == "t" else items
    return value


def load(k: str):
    """The stored capture for key `k`, or None (absent, turned off, damaged)."""
    d = directory()
    if d is None:
        return None
    index, data = d / f"{k}.json", d / f"{k}.npz"
    try:
        meta = json.loads(index.read_text())
        from .store import sha256_file

        if meta.get("format") != FORMAT or meta.get("key") != k or sha256_file(data) != meta["sha256"]:
            return None
        with np.load(data, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
        tree = _decode(meta["tree"], arrays)
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None
    try:
        os.utime(index)                               # most recently used (pruning keeps it)
    except OSError:                                   # a read-only cache still serves
        pass
    return tree


def store(k: str, tree) -> str:
    """Keep `tree` under key `k`; returns what happened ("stored", "not stored: ...", "off", "failed: ...")."""
    d = directory()
    if d is None:
        return "off"
    arrays: list = []
    encoded = _encode(tree, arrays)
    size = sum(a.nbytes for a in arrays)
    if size > MAX_BYTES:
        return f"not stored: {size / 2**30:.2f} GiB is past the {MAX_BYTES >> 20} MB limit"
    from .store import sha256_file

    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{k}.{os.getpid()}.npz"
        with open(tmp, "wb") as f:
            np.savez(f, **{f"a{i}": a for i, a in enumerate(arrays)})
        meta = {"format": FORMAT, "key": k, "sha256": sha256_file(tmp), "bytes": tmp.stat().st_size,
                "tree": encoded}
        tmp_index = d / f".{k}.{os.getpid()}.json"
        tmp_index.write_text(json.dumps(meta))
        os.replace(tmp, d / f"{k}.npz")
        os.replace(tmp_index, d / f"{k}.json")        # the index last: it names a complete .npz
    except OSError as e:
        for p in d.glob(f".{k}.{os.getpid()}.*"):
            p.unlink(missing_ok=True)
        return f"failed: {e.strerror or e}"
    _prune(d)
    return "stored"


def _mtime(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:                                   # replaced or pruned by another run meanwhile
        return 0


def _prune(d: Path) -> None:
    entries = sorted(d.glob("*.json"), key=_mtime, reverse=True)
    for index in entries[KEEP:]:
        for p in (index, index.with_suffix(".npz")):
            p.unlink(missing_ok=True)
