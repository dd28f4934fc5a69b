"""The ship bundle: per component the one accepted artifact the target should run, a runtime.json
an app loads (graphs, I/O, the host loop's data and rules, the parity evidence of exactly these
files and their sha256, validated by schemas/runtime.schema.json) and a README for app developers.

Written at the end of every build into OUT/bundle/ (recorded in the manifest's "bundle", shown in
the reports), or by `omni-export bundle OUT [--into DIR] [--pick COMPONENT=FORMAT:PRECISION]`.
Only accepted builds are ever bundled. Files are hard-linked when the bundle lies inside OUT (ONNX
external data excepted: artifacts/store.link_or_copy), else
copied; the bundle is made in a scratch directory beside its destination and renamed into place.
docs/bundle.md describes the policy and every runtime.json field.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..core import UsageError

RUNTIME = "runtime.json"
README = "README.md"
GRAPHS_DIR = "graphs"
SCHEMA_FILE = Path(__file__).resolve().parents[1] / "schemas" / "runtime.schema.json"
RUNTIME_BYTES = 16 << 20
PRECISION_ORDER = ("fp32", "fp16", "w8a16-mixed", "w8a16", "w8a8-mixed", "w8a8", "w4a16-mixed", "w4a16")  # highest first
# Which format an app runs on each unit, best first: a context binary loads straight into the HTP
# (no on-device compile); a DLC is compiled on the phone; ONNX runs through ONNX Runtime (its QNN EP
# on the HTP); .pte through ExecuTorch.
FORMAT_PREFERENCE = {"htp": ("ctx", "dlc", "onnx", "pte"), "gpu": ("onnx", "dlc", "pte", "ctx"),
                     "cpu": ("pte", "onnx", "ctx", "dlc")}
POLICY = ("per component, the accepted build in the first format its unit runs best (HTP: context binary, "
          "DLC, ONNX, .pte; GPU: ONNX, DLC, .pte; CPU: .pte, ONNX) that has one, the smallest accepted in "
          "that format (a tie goes to the lower precision: fp32 > fp16 > w8a16 > w8a8 > w4a16); a graph that "
          "must stay fp32 (fp32_on_cpu) takes its fp32 build; --pick COMPONENT=FORMAT:PRECISION overrides")
RUNTIMES = {"ctx": ("qnn-htp", "ONNX Runtime with the QNN execution provider (EPContext model; the *_qnn.bin "
                               "beside it is the raw QNN context binary for QNN's own runtime)"),
            "onnx": ("ort-cpu", "ONNX Runtime (CPU, or the QNN EP for the HTP, or the GPU)"),
            "pte": ("executorch", "ExecuTorch runtime (XNNPACK delegate)"),
            "dlc": ("qnn-dlc", "QNN runtime: compile the DLC for the HTP on the device (qnn-context-binary-generator)")}


@dataclass
class Bundle:
    """What a recipe adds to the bundle: its host loop's data (runtime.json "host") and files."""
    host: dict | None = None
    copies: list = field(default_factory=list)     # (relative path in the bundle, source Path, role)
    blobs: list = field(default_factory=list)      # (relative path in the bundle, bytes or a writer(path), role)
    readme: str = ""                               # the recipe's section of README.md
    note: str = ""                                 # what the recipe does not bundle yet


def source_checkpoint(m: dict, out: Path, need: tuple[str, ...]) -> Path:
    """The checkpoint build OUT (manifest `m`) recorded, where a recipe's bundle hook reads its host
    data: each file of `need` (relative to it) must be there, and a weight file among them must still
    have the sha256 manifest.json recorded. UsageError (one line) otherwise."""
    from .store import sha256_file

    path = Path(m["checkpoint"]["path"])
    weights = {w["path"]: w.get("sha256") for w in m["checkpoint"].get("weights", [])}
    missing = next((n for n in need if not (path / n).is_file()), None)
    if missing:
        raise UsageError(f"{out}: its checkpoint {path} is gone (no {missing}); the bundle takes the host's "
                         f"tables, config and tokenizer from it (rebuild, or restore the checkpoint there)")
    for n in need:
        if weights.get(n) and sha256_file(path / n) != weights[n]:
            raise UsageError(f"{path / n} is not the checkpoint {out} was built from (its sha256 differs from "
                             f"manifest.json's); rebuild")
    return path


# ------------------------------------------------------------------------------------------ choosing

def parse_picks(texts) -> dict[str, tuple[str, str]]:
    """--pick COMPONENT=FORMAT:PRECISION items -> {component: (format, precision)}."""
    picks = {}
    for text in texts or ():
        comp, eq, rest = text.partition("=")
        fmt, colon, prec = rest.partition(":")
        if not (eq and colon and comp.strip() and fmt.strip() and prec.strip()):
            raise UsageError(f"--pick expects COMPONENT=FORMAT:PRECISION like code2wav=ctx:fp16, got '{text}'")
        picks[comp.strip()] = (fmt.strip(), prec.strip())
    return picks


def choose(m: dict, picks: dict | None = None) -> dict[str, tuple[dict, str]]:
    """{component: (build entry, why)}: the build each component ships (POLICY), components without an
    accepted build left out; UsageError for a --pick that names no accepted build."""
    picks = dict(picks or {})
    out = {}
    for comp, (fmt, prec) in picks.items():
        if comp not in m["components"]:
            raise UsageError(f"--pick {comp}={fmt}:{prec}: the build has no component {comp} (it has "
                             f"{', '.join(m['components'])})")
        b = next((b for b in m["builds"] if (b["component"], b["format"], b["precision"]) == (comp, fmt, prec)), None)
        if b is None or b["status"] != "accepted" or not b.get("files"):
            accepted = sorted(f"{x['format']}:{x['precision']}" for x in m["builds"]
                              if x["component"] == comp and x["status"] == "accepted" and x.get("files"))
            what = "was not built" if b is None else f"was {b['status']}"
            raise UsageError(f"--pick {comp}={fmt}:{prec}: that build {what}; accepted {comp} builds: "
                             f"{', '.join(accepted) or 'none'}")
        out[comp] = (b, "--pick")
    placement = _placement(m)
    default_unit = "htp" if (m.get("target") or {}).get("htp_arch") else "cpu"
    for comp, info in m["components"].items():
        if comp in out:
            continue
        ok = [b for b in m["builds"] if b["component"] == comp and b["status"] == "accepted" and b.get("files")]
        if info.get("fp32_on_cpu") and any(b["precision"] == "fp32" for b in ok):
            ok = [b for b in ok if b["precision"] == "fp32"]
        for fmt in FORMAT_PREFERENCE.get(placement.get(comp, default_unit), FORMAT_PREFERENCE["cpu"]):
            mine = [b for b in ok if b["format"] == fmt]
            if mine:
                out[comp] = (min(mine, key=_ship_rank), "policy")
                break
    return out


def _ship_rank(b: dict) -> tuple:
    """Smallest first, then the lower precision. By bytes, not by precision name: a repaired build
    (w8a8-mixed, ...) that had to keep most blocks in float can be larger than a plain w8a16 or even
    the fp16 build of the same format (Spark's demo: ctx w8a8-mixed 710 KB, 1.9 % of its weight bytes
    still 8-bit, beside w8a16 510 KB and fp16 726 KB)."""
    return (sum(int(f.get("bytes") or 0) for f in b.get("files") or ()), -PRECISION_ORDER.index(b["precision"]))


# ------------------------------------------------------------------------------------------ writing

def write(out: Path, m: dict, host, into: Path | None = None, picks: dict | None = None) -> dict:
    """Make the bundle of build OUT (manifest `m`) in `into` (default OUT/bundle); returns its record
    for the manifest: {path, bytes, files, graphs: {component: FORMAT/PRECISION}, note}. `host(m, out)`
    is what the recipe adds (a Bundle: recipes.bundle_host). UsageError when no component has an
    accepted build, or the recipe's host data cannot be read (its checkpoint is gone)."""
    from ..weights import require_regular_file
    from .store import sha256_file

    out = Path(out)
    into = Path(into) if into is not None else out / "bundle"
    chosen = choose(m, picks)
    if not chosen:
        raise UsageError(f"{out}: no component has an accepted build; nothing to bundle")
    extra = host(m, out)
    inside = within(into, out)
    _check_into(into)
    into.parent.mkdir(parents=True, exist_ok=True)
    for stale in into.parent.glob(f".{into.name}.*-*"):     # a killed run's scratch (its pid is in the name)
        if re.fullmatch(rf"\.{re.escape(into.name)}\.(tmp|old)-\d+", stale.name) and stale.is_dir() \
                and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    tmp = into.parent / f".{into.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        files, graphs = [], {}
        for comp, (b, why) in chosen.items():
            rels = []
            for f in b["files"]:
                rel = f"{GRAPHS_DIR}/{Path(f['path']).name}"
                _put(out / f["path"], tmp / rel, link=inside)
                if sha256_file(tmp / rel) != f["sha256"]:
                    raise UsageError(f"{out / f['path']} does not match its sha256 in manifest.json; "
                                     f"`omni-export verify {out}` says what changed")
                files.append({"path": rel, "sha256": f["sha256"], "bytes": int(f["bytes"]), "role": f"graph {comp}"})
                rels.append(rel)
            graphs[comp] = _graph(m, comp, b, why, rels)
        for rel, src, role in extra.copies:
            require_regular_file(Path(src), role)      # a FIFO or device in a checkpoint is never read
            _put(Path(src), tmp / rel, link=False)
            files.append({"path": rel, "sha256": sha256_file(tmp / rel), "bytes": (tmp / rel).stat().st_size, "role": role})
        for rel, data, role in extra.blobs:        # bytes, or a writer of the file
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            data(tmp / rel) if callable(data) else (tmp / rel).write_bytes(data)
            files.append({"path": rel, "sha256": sha256_file(tmp / rel), "bytes": (tmp / rel).stat().st_size,
                          "role": role})
        rt = runtime(m, graphs, files, extra)
        error = schema_error(rt)
        if error:                                    # a writer bug, never a user's
            raise ValueError(f"runtime.json would not be valid: {error}")
        (tmp / RUNTIME).write_text(json.dumps(rt, indent=2, allow_nan=False) + "\n")
        (tmp / README).write_text(readme(rt, extra))
        for p in tmp.rglob("*"):
            if p.is_file():
                os.chmod(p, 0o644)
        _swap(tmp, into)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    listing = [*files, *({"path": n, "sha256": sha256_file(into / n), "bytes": (into / n).stat().st_size,
                          "role": r} for n, r in ((RUNTIME, "runtime"), (README, "readme")))]
    where = Path(os.path.relpath(into, out)).as_posix() if inside else str(into)
    if inside:                                # the manifest lists them relative to OUT (verify checks them)
        listing = [{**f, "path": f"{where}/{f['path']}"} for f in listing]
    return {"path": where, "bytes": sum(f["bytes"] for f in listing), "files": listing,
            "graphs": {c: f"{g['format']}/{g['precision']}" for c, g in graphs.items()},
            **({"note": extra.note} if extra.note else {})}


def _graph(m: dict, comp: str, b: dict, why: str, rels: list[str]) -> dict:
    from .scores import gated_outputs, min_snr_db

    info = m["components"][comp]
    p = b.get("parity") or {}
    gated = gated_outputs(m, comp)
    kind, how = RUNTIMES[b["format"]]
    t = m["target"]
    runtime = {"kind": kind, "how": how}
    placement = "cpu" if info.get("fp32_on_cpu") and b["precision"] == "fp32" else _placement(m).get(comp)
    if b["format"] == "ctx" or (b["format"] == "onnx" and placement == "htp"):
        runtime["provider_options"] = provider_options(t, b["precision"], (m.get("options") or {}).get("htp_optimization"))
    outs = [{"name": o["name"], **{k: o[k] for k in ("snr_db", "psnr_db", "agreement") if k in o},
             "gated": not gated or o["name"] in gated} for o in p.get("outputs") or []]
    return {"build": b["name"], "format": b["format"], "precision": b["precision"],
            "placement": placement, "picked_by": why, "runtime": runtime, "files": rels,
            "inputs": info.get("inputs", []), "outputs": info.get("outputs", []),
            "parity": {"verdict": b["status"], "reason": p.get("reason") or "",
                       "runner": ((p.get("runner") or {}).get("label") or ""), "samples": p.get("samples"),
                       "threshold_db": p.get("threshold_db"), "min_snr_db": min_snr_db(p.get("outputs") or [], gated),
                       **({"outputs_from": b["outputs_from"]} if b.get("outputs_from") else {}),
                       "outputs": outs}}


def provider_options(target: dict, precision: str, finalize: str | None) -> dict:
    """The QNN execution provider options a graph was scored with on the HTP simulator, and that an
    app passes on the phone (the simulator is the same backend library)."""
    from .. import qnn_ep

    return qnn_ep.provider_options(target["soc_model"], target["htp_arch"], fp16=precision == "fp16", finalize=finalize)


def runtime(m: dict, graphs: dict, files: list, extra: Bundle) -> dict:
    from ..core import strict_json

    t = m["target"]
    ck = m.get("checkpoint") or {}
    rt = {"schema_version": 1, "tool": "omni-export", "created": m.get("created", ""),
          "recipe": {k: m["recipe"][k] for k in ("name", "version", "doc") if k in m["recipe"]},
          "target": {**{k: t.get(k) for k in ("name", "device", "soc", "soc_model", "htp_arch")},
                     "htp_optimization": (m.get("options") or {}).get("htp_optimization")},
          "checkpoint": {"label": ck.get("label", ""), "tts_model_type": ck.get("tts_model_type"),
                         "weights": [{"path": w["path"], "sha256": w["sha256"]} for w in ck.get("weights", [])
                                     if w.get("sha256")]},
          "toolchain": m.get("toolchain") or {}, "policy": POLICY, "graphs": graphs, "files": files,
          "host": extra.host, **({"note": extra.note} if extra.note else {})}
    return strict_json(rt)


def readme(rt: dict, extra: Bundle) -> str:
    t = rt["target"]
    lines = [f"# {rt['recipe']['name']} for {t['name']} ({t['device']})", "",
             f"Made by omni-export {rt['toolchain'].get('omni-export') or ''} "
             f"({(rt['toolchain'].get('omni-export-git') or '')[:12]}) from {rt['checkpoint']['label']}. "
             "`runtime.json` describes everything below (schema: omni_export/schemas/runtime.schema.json; "
             "fields: docs/bundle.md); check each file's sha256 there before loading it.", "",
             "## Graphs", "", "| component | file(s) | format | precision | runs on | parity (held-out samples, runner) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for comp, g in rt["graphs"].items():
        p = g["parity"]
        lines.append(f"| {comp} | {', '.join(f'`{f}`' for f in g['files'])} | {g['format']} | {g['precision']} | "
                     f"{g['runtime']['kind']} | {p['verdict']}: {p['reason']} ({p['samples']} samples, {p['runner']}) |")
    lines += ["", "I/O names, shapes and dtypes are in `runtime.json` under `graphs.<component>.inputs/outputs`; a "
              "context binary (`*.ctx.onnx` + `*_qnn.bin`, kept side by side) opens in ONNX Runtime with the QNN "
              "execution provider and `graphs.<component>.runtime.provider_options`.", ""]
    if extra.readme:
        lines += [extra.readme.rstrip(), ""]
    if extra.note:
        lines += [f"Not bundled yet: {extra.note}.", ""]
    return "\n".join(lines)


def remove(into: Path) -> None:
    """Remove a bundle this module wrote (a directory holding runtime.json), nothing else."""
    if into.is_dir() and not into.is_symlink() and (into / RUNTIME).is_file():
        shutil.rmtree(into, ignore_errors=True)


def _put(src: Path, dest: Path, link: bool) -> None:
    from .store import link_or_copy

    dest.parent.mkdir(parents=True, exist_ok=True)
    if link:
        link_or_copy(src, dest)
    else:
        shutil.copyfile(src, dest)


def within(path: Path, root: Path) -> bool:
    p, r = Path(os.path.abspath(path)), Path(os.path.abspath(root))
    return p == r or r in p.parents


def _check_into(into: Path) -> None:
    if into.is_symlink() or (into.exists() and not into.is_dir()):
        raise UsageError(f"--into {into} is a file or a symlink; pass a directory")
    if into.is_dir() and any(into.iterdir()) and not (into / RUNTIME).is_file():
        raise UsageError(f"--into {into} is not empty and holds no bundle (no runtime.json); choose a new "
                         f"or empty directory (omni-export never removes files it did not write)")


def _swap(tmp: Path, into: Path) -> None:
    """Put the finished bundle at `into`: a directory this module wrote (holding runtime.json) is
    replaced; anything else there is refused (omni-export never removes files it did not write)."""
    _check_into(into)
    if into.is_dir():
        old = into.parent / f".{into.name}.old-{os.getpid()}"
        os.rename(into, old)
        os.rename(tmp, into)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, into)


# ------------------------------------------------------------------------------------------ reading

def read_runtime(bundle: Path) -> dict:
    """DIR/runtime.json checked before anything of the bundle is used: a regular file within
    RUNTIME_BYTES, strict JSON valid against schemas/runtime.schema.json, every path it names inside
    the bundle (no '..', no absolute path, no symlink leading out), and every file's sha256 as listed.
    UsageError (one line) naming the file and the rule otherwise."""
    from .manifest import parse_manifest, path_outside
    from .store import sha256_file
    from ..weights import require_regular_file

    bundle = Path(bundle)
    file = bundle / RUNTIME
    if not bundle.is_dir():
        raise UsageError(f"--bundle {bundle} is not a directory; pass the directory `omni-export bundle` wrote")
    if not (file.exists() or file.is_symlink()):
        raise UsageError(f"--bundle {bundle}: no runtime.json (not a bundle `omni-export bundle` wrote)")
    require_regular_file(file, "runtime.json")
    if file.stat().st_size > RUNTIME_BYTES:
        raise UsageError(f"{file} is larger than {RUNTIME_BYTES >> 20} MiB; not a runtime.json omni-export wrote")
    rt = parse_manifest(file.read_bytes(), file)
    error = schema_error(rt)
    if error:
        raise UsageError(f"{file}: {error}")
    listed = {f["path"]: f for f in rt["files"]}
    named = [*listed, *(p for g in rt["graphs"].values() for p in g["files"]),
             *(((rt.get("host") or {}).get("tokenizer") or {}).get("files") or []),
             *(((rt.get("host") or {}).get("model_config") or {}).values()),
             *([((rt.get("host") or {}).get("tables") or {})["file"]] if (rt.get("host") or {}).get("tables") else [])]
    for rel in named:
        why = path_outside(bundle, rel)
        if why:
            raise UsageError(f"{file}: the path {json.dumps(rel)[:200]} {why.replace('the output directory', 'the bundle')}; "
                             f"a bundle's files lie inside it")
        if rel not in listed:
            raise UsageError(f"{file}: {rel} is not listed in files[] (with its sha256)")
    for rel, rec in listed.items():
        p = bundle / rel
        if not p.is_file():
            raise UsageError(f"{file}: {rel} is missing from the bundle")
        if sha256_file(p) != rec["sha256"]:
            raise UsageError(f"{bundle / rel} does not match its sha256 in runtime.json; the bundle was changed "
                             f"after it was made: make it again with `omni-export bundle`")
    return rt


def schema_error(rt) -> str | None:
    """The most specific violation of schemas/runtime.schema.json, as `json.path: what`, or None."""
    from .manifest import schema_error as first_violation

    return first_violation(rt, SCHEMA_FILE)


def _placement(m: dict) -> dict:
    """The manifest's {component: unit}, or {} when a damaged manifest holds something else there."""
    p = (m.get("target") or {}).get("placement")
    return p if isinstance(p, dict) else {}
