"""What a build keeps so its artifacts can be re-scored or sent to a device later without rebuilding.

parity-inputs/<component>.npz
    held-out sample i, tensor n: `input.{i}.{n}` (the graph input) and `reference.{i}.{n}` (the
    fp32 output of the traced model). The same layout `omni-export verify --rescore` reads.
parity-inputs/<component>.calibration.npz
    calibration sample i: `input.{i}.{n}` (what local QDQ calibrated on; AI Hub's quantize job gets
    the same set).
sources/{recipe}-{component}-{fp32|w8a16|w8a8}-{target}.onnx
    the ONNX a QNN build was compiled from (the HTP-rewritten fp32 graph, or the QDQ graph of a
    quantized precision): what `omni-export hub submit` uploads to AI Hub. Kept for components with
    an accepted build AI Hub takes.

Every file is written atomically with fixed zip timestamps (same inputs, same bytes), and recorded
in the manifest under the component as {path, sha256, bytes, samples}; readers check the hash.
"""
from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import numpy as np

from ..core import Format, Precision
from .store import atomic_write_bytes, sha256_file

INPUTS_DIR = "parity-inputs"
SOURCES_DIR = "sources"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


# ------------------------------------------------------------------------------------------- write

def keep_inputs(root: Path, traced) -> dict:
    """Write the held-out inputs + fp32 references and the calibration inputs of one component;
    returns the manifest fields {"parity_inputs": record, "calibration_inputs": record | None}."""
    held = {}
    for i, (sample, ref) in enumerate(zip(traced.heldout, traced.reference)):
        held.update({f"input.{i}.{n}": sample[n] for n in traced.input_names})
        held.update({f"reference.{i}.{n}": ref[n] for n in traced.output_names})
    out = {"parity_inputs": _write(root, f"{INPUTS_DIR}/{traced.name}.npz", held, len(traced.heldout)),
           "calibration_inputs": None}
    if traced.calibration:
        calib = {f"input.{i}.{n}": s[n] for i, s in enumerate(traced.calibration) for n in traced.input_names}
        out["calibration_inputs"] = _write(root, f"{INPUTS_DIR}/{traced.name}.calibration.npz", calib,
                                           len(traced.calibration))
    return out


def source_key(precision: Precision) -> str:
    """Which ONNX a build of this precision is compiled from: fp32 (fp32 and fp16) or its QDQ."""
    return "fp32" if precision in (Precision.FP32, Precision.FP16) else precision.value


def keep_sources(root: Path, recipe: str, target, lowering, entries: list[dict]) -> dict:
    """Copy the source ONNX of every accepted build AI Hub takes into sources/ (a quantized one
    also keeps fp32, which AI Hub's quantize job starts from); returns {key: record}."""
    keys = set()
    for e in entries:
        place = target.place(e["component"])
        if e["status"] == "accepted" and Format(e["format"]) in place.hub_runtimes:
            p = Precision(e["precision"])
            keys |= {source_key(p), "fp32"}
    out = {}
    for key in sorted(keys):
        src = lowering.onnx(Precision(key))          # memoised: already built for the accepted build
        if src.with_name(src.name + ".data").exists():
            out[key] = {"error": "ONNX with external data is not kept yet"}
            continue
        rel = f"{SOURCES_DIR}/{recipe}-{lowering.traced.name}-{key}-{target.name}.onnx"
        dest = Path(root) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(dest)
        out[key] = {"path": rel, "sha256": sha256_file(dest), "bytes": dest.stat().st_size}
    return out


def npz_bytes(arrays: dict) -> bytes:
    """An .npz numpy.load reads, entries in name order with fixed timestamps (byte-stable)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(arrays):
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, npy.getvalue())
    return buf.getvalue()


def _write(root: Path, rel: str, arrays: dict, samples: int) -> dict:
    data = npz_bytes(arrays)
    atomic_write_bytes(Path(root) / rel, data)
    import hashlib

    return {"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "samples": samples}


# -------------------------------------------------------------------------------------------- read

class InputsError(ValueError):
    """A kept file is missing or does not match its recorded hash."""


def checked(root: Path, record: dict | None, what: str) -> Path:
    """The path of a recorded file after checking it exists with its sha256."""
    if not record or "path" not in record:
        raise InputsError(f"the manifest records no {what}; rebuild to keep it")
    path = Path(root) / record["path"]
    if not path.is_file():
        raise InputsError(f"{record['path']} ({what}) is missing")
    if sha256_file(path) != record["sha256"]:
        raise InputsError(f"{record['path']} ({what}) does not match the sha256 in manifest.json")
    return path


def read_samples(path: Path) -> tuple[list[dict], list[dict]]:
    """(inputs, references) one dict per sample; references are empty dicts for calibration files."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    n = 1 + max((int(k.split(".")[1]) for k in arrays), default=-1)
    inputs: list[dict] = [{} for _ in range(n)]
    refs: list[dict] = [{} for _ in range(n)]
    for k, a in arrays.items():
        kind, i, name = k.split(".", 2)
        (inputs if kind == "input" else refs)[int(i)][name] = a
    return inputs, refs
