"""What a build keeps so its accepted builds can be sent to AI Hub later without rebuilding.

sources/{recipe}-{component}-{fp32|w8a16|w8a8}-{target}.onnx
    the ONNX a device build is compiled from: the (HTP-rewritten) fp32 graph for fp32 and fp16
    builds, the QDQ graph of a quantized precision. Kept for components with an accepted build AI
    Hub takes; what `omni-export hub submit` uploads.
parity-inputs/<component>.calibration.npz
    calibration sample i, tensor n: `input.{i}.{n}` (what local QDQ calibrated on; AI Hub's
    quantize job gets the same set). Kept when an accepted quantized build AI Hub takes exists.

The held-out inputs and fp32 references (parity-inputs/<component>.npz) are the pipeline's own
(artifacts/reproducibility.py). Every file goes through the build's Store (journal, atomic
rename) and is recorded in the manifest under its component as {path, sha256, bytes}; readers
check the hash.
"""
from __future__ import annotations

from pathlib import Path

from ..core import Format, Precision
from .reproducibility import npz_bytes, read_parity_inputs
from .store import sha256_file

INPUTS_DIR = "parity-inputs"
SOURCES_DIR = "sources"


def source_key(precision: Precision) -> str:
    """Which ONNX a build of this precision is compiled from: fp32 (fp32 and fp16) or its QDQ."""
    return "fp32" if precision in (Precision.FP32, Precision.FP16) else precision.value


def hub_sources(target, entries: list[dict]) -> tuple[set[str], bool]:
    """(source keys, quantized): the source ONNX every accepted build AI Hub takes is compiled from
    (a quantized one also needs fp32, which AI Hub's quantize job starts from), and whether any of
    them is quantized (then the calibration inputs are kept too)."""
    keys, quantized = set(), False
    for e in entries:
        if e["status"] == "accepted" and Format(e["format"]) in target.place(e["component"]).hub_runtimes:
            p = Precision(e["precision"])
            keys |= {source_key(p), "fp32"}
            quantized = quantized or p.quantized
    return keys, quantized


def keep_for_hub(store, recipe: str, target, component: str, sources: dict, calibration, quantized: bool) -> dict:
    """Put each source ONNX (`sources`: key -> a single-file ONNX, or {"error": why} when it cannot
    be kept) into sources/, and the calibration inputs when `quantized`; returns the component's
    manifest fields {"sources": {key: record}, "calibration_inputs": record}."""
    out: dict = {"sources": {}}
    for key in sorted(sources):
        src = sources[key]
        if isinstance(src, dict):
            out["sources"][key] = src
            continue
        rel = f"{SOURCES_DIR}/{recipe}-{component}-{key}-{target.name}.onnx"
        out["sources"][key] = store.put_file(rel, Path(src)).to_json()
    if quantized and calibration:
        arrays = {f"input.{i}.{n}": (lambda s=s, n=n: s[n]) for i, s in enumerate(calibration) for n in s}
        rec = store.put_bytes(f"{INPUTS_DIR}/{component}.calibration.npz", npz_bytes(arrays))
        out["calibration_inputs"] = {**rec.to_json(), "samples": len(calibration)}
    return out


class InputsError(ValueError):
    """A kept file is missing or does not match its recorded hash."""


def checked(root: Path, record: dict | None, what: str) -> Path:
    """The path of a recorded file after checking it exists with its sha256."""
    if not record or "path" not in record:
        why = (record or {}).get("error") or "rebuild to keep it"
        raise InputsError(f"the manifest records no {what} ({why})")
    path = Path(root) / record["path"]
    if not path.is_file():
        raise InputsError(f"{record['path']} ({what}) is missing")
    if sha256_file(path) != record["sha256"]:
        raise InputsError(f"{record['path']} ({what}) does not match the sha256 in manifest.json")
    return path


def read_samples(path: Path) -> tuple[list[dict], list[dict]]:
    """(inputs, references), one dict per sample; references are empty for calibration files."""
    return read_parity_inputs(path)
