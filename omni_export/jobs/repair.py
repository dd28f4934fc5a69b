"""Precision repair: from a rejected quantized build, the most-quantized variant that passes the same gate.

The search starts from the per-block attribution of the rejected precision (jobs/work.attribute: each
block of the component's BlockChain lowered alone at that precision and scored on the fp32 activations
in front of it). Each step keeps one more block in float -- the worst-scoring block not yet kept: a
block that failed or gave NaN/Inf first, then by SNR, lowest first -- re-quantizes the graph with
those blocks' nodes left out of quantization (float in the QDQ graph; fp16 on the HTP, where the QNN
EP runs the float islands between the quantized ones), compiles it for the build's own runner (the
HTP simulator for an HTP target, ORT CPU otherwise), and scores it on the held-out samples against
the same gate. The first step that passes is the result; it becomes a build of its own precision,
`<precision>-mixed` (w8a16-mixed, ...), lowered to each ONNX-family format the rejected precision was
asked in and scored like any build. The search stops at the step budget (--repair-steps) or when every
block is kept; then the rejection stands, with the search table as its evidence.

What it records per repaired precision (the component record's `repair`): the blocks in the order
they would be kept, every step's score, verdict and share of weight bytes still at the base
precision's integer width, and the result.
"""
from __future__ import annotations

from ..core import Format, Precision

DEFAULT_STEPS = 4
MODES = ("auto", "off")
ONNX_FAMILY = (Format.ONNX, Format.DLC, Format.CTX)


def block_order(rows: list[dict]) -> list[int]:
    """Positions of the ranked blocks' rows (attribution's or sensitivity's, in chain order), in the
    order repair keeps them: a block that failed or gave NaN/Inf first, then by SNR, lowest first."""
    def rank(i: int):
        r = rows[i]
        if r.get("error") or r.get("finite") is False or r.get("snr_db") is None:
            return (0, 0.0, i)
        return (1, float(r["snr_db"]), i)

    return sorted((i for i, r in enumerate(rows) if r.get("block") != "*"), key=rank)


def search_primary(builds, precision: Precision, has_htp: bool) -> Format | None:
    """The format whose runner the search scores on: the context binary's (the HTP simulator) when one
    is built at `precision` for an HTP target, else the ONNX's (ORT CPU); None when neither is."""
    formats = {b.format for b in builds if b.precision == precision}
    if has_htp and Format.CTX in formats:
        return Format.CTX
    if has_htp and Format.DLC in formats:
        return Format.DLC
    return Format.ONNX if Format.ONNX in formats else None


def wants_repair(entries: list[dict], precision: Precision, primary: Format) -> bool:
    """The build a user would ship at `precision` (its primary format's) was judged and rejected (not
    a lowering or runner failure: those are diagnosed, not repaired)."""
    e = next((e for e in entries if e["precision"] == precision.value and e["format"] == primary.value), None)
    return e is not None and e["status"] == "rejected" and not e.get("error")


def integer_share(bits: dict) -> float | None:
    """The share of the weight bytes still quantized (at an integer width: the plain build's 4/8-bit
    weights and 16-bit tables), the rest kept in float (exporters.onnx.weight_bits)."""
    if not bits:
        return None
    return round(sum(v for k, v in bits.items() if k in ("4", "8", "16")), 4)
