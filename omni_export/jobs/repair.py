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

from ..artifacts.manifest import RAISED_KEY
from ..core import Format, Precision

DEFAULT_STEPS = 4
MODES = ("auto", "off")
ONNX_FAMILY = (Format.ONNX, Format.DLC, Format.CTX)
# What a step raises a kept module to, and that width: "float" leaves its nodes out of quantization
# (fp16 on the HTP); "int16" / "int8" quantize its weights at that width, every node still quantized.
RAISES = {"float": None, "int16": 16, "int8": 8}


def raise_for(base: Precision, ranked_by: str) -> str:
    """What a search raises its modules to: over w4a16's int4 weights, 8-bit weights (`w4a16-mixed` mixes
    4- and 8-bit blocks and stays integer all the way); an output-ranked search (a transformer at real
    size) 16-bit weights (a float island runs in fp16 on the HTP without the fp16 graph's safe forms);
    otherwise the block in float."""
    if base == Precision.W4A16:
        return "int8"
    return "int16" if ranked_by == "outputs" else "float"


def raised(raise_to: str, names: list[str]) -> dict:
    """A step's or result's record of the modules it raised: {kept_float: names} for a float raise, else
    {weights_<n>bit: names, kept_float: []}."""
    key = RAISED_KEY[raise_to]
    return {key: list(names)} if key == "kept_float" else {key: list(names), "kept_float": []}




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


def base_share(bits: dict, base: Precision) -> float | None:
    """The share of the weight bytes at the base precision's weight width (8 bits for w8a16 / w8a8,
    4 for w4a16): what a raise to 16-bit weights takes away while integer_share stays whole."""
    if not bits:
        return None
    return round(float(bits.get("4" if base == Precision.W4A16 else "8", 0.0)), 4)


def noise(db: float) -> float:
    """An SNR in dB as the output's noise power relative to its signal."""
    return 10.0 ** (-db / 10.0)


def _added_noise(rows: list[dict]) -> tuple[list[int], list[int], dict[int, float]]:
    """(scored, broken, added): positions with a finite score, those without, and per scored position
    the noise power its outputs add beyond the worst before it (relative to signal)."""
    scored = [i for i, r in enumerate(rows) if r.get("snr_db") is not None and r.get("finite", True) is not False]
    broken = [i for i, r in enumerate(rows) if i not in scored]
    added: dict[int, float] = {}
    before = 0.0
    for i in scored:
        n = noise(float(rows[i]["snr_db"]))
        added[i] = max(0.0, n - before)
        before = max(before, n)
    return scored, broken, added


# what the estimate of a step must clear the gate by (0.6B talker prefill, per-channel linears and five
# layers at 16-bit weights: estimated 30.70 dB, measured 30.68 on the HTP simulator)
REACH_MARGIN_DB = 0.25
# at most this share of the ranked modules raised (kept in float, or at 16-bit weights): past it, a
# "repaired" build is mostly the higher precision
MAX_RAISED_SHARE = 0.5


def to_reach(rows: list[dict], gate_db: float, kept: set[int] = frozenset(),
             margin_db: float = REACH_MARGIN_DB) -> tuple[list[int], dict]:
    """The fewest more modules to raise (keep in float, or at 16-bit weights), from a rejected graph's
    per-output scores (`rows` as for by_added_noise; `kept`: positions already raised): the largest
    adders upstream of the worst output,
    until the estimate lifts it to the gate + `margin_db`, taking at most MAX_RAISED_SHARE of the modules
    in all. Returns (positions, finding); finding["futile"] when no such set exists (the loss is spread
    over more modules than that share). A module that failed or gave NaN/Inf is taken first, alone."""
    import math

    scored, broken, added = _added_noise(rows)
    broken = [i for i in broken if i not in kept]
    if broken:
        return broken, {"futile": False, "broken": [rows[i]["block"] for i in broken]}
    if not scored:
        return [], {"futile": True}
    worst = min(scored, key=lambda i: rows[i]["snr_db"])
    cap = max(1, int(MAX_RAISED_SHARE * len(rows))) - len(kept)
    left = noise(float(rows[worst]["snr_db"]))
    target = noise(gate_db + margin_db)
    chosen: list[int] = []
    for i in sorted((i for i in scored if i <= worst and i not in kept), key=lambda i: (-added[i], i)):
        if left <= target or len(chosen) >= cap:
            break
        chosen.append(i)
        left -= added[i]
    estimate = -10.0 * math.log10(left) if left > 0 else None
    return chosen, {"worst": rows[worst]["block"], "worst_db": round(float(rows[worst]["snr_db"]), 3),
                    "kept": [rows[i]["block"] for i in chosen],
                    "estimate_db": None if estimate is None else round(estimate, 2),
                    "futile": not chosen or (estimate is not None and estimate < gate_db)}


def by_added_noise(rows: list[dict], gate_db: float, budget: int) -> tuple[list[int], dict]:
    """Rank modules by the output noise each adds, from a rejected build's per-output scores: `rows`
    are modules in graph order (a decoder's layers, then its norm and head), each with the SNR of the
    worst output it makes. Along a chain the error accumulates: a module adds the noise power of its
    outputs beyond the worst before it (`added`, relative to signal). Keeping a module in float removes
    about what it adds (an estimate: additive, independent noise per module).

    Returns (positions, finding): the positions to keep, largest addition first (a module that failed
    or gave NaN/Inf before all), and {"worst", "worst_db", "deficit", "kept", "estimate_db"}: whether
    keeping the `budget` largest adders upstream of the worst output could lift it to the gate.
    finding["futile"] is True when it could not: the loss is spread over many modules, and keeping a
    few in float leaves the worst output under the gate (the 0.6B talker prefill at w8a16: 39.6 dB at
    the first layer's KV, 26.4 dB at the 25th, ~0.1 per mille more noise per layer)."""
    scored, broken, added = _added_noise(rows)
    order = broken + sorted(scored, key=lambda i: (-added[i], i))
    if broken or not scored:
        return order, {"futile": False}
    worst = min(scored, key=lambda i: rows[i]["snr_db"])
    upstream = sorted((i for i in scored if i <= worst), key=lambda i: -added[i])[:max(0, budget)]
    left = noise(float(rows[worst]["snr_db"])) - sum(added[i] for i in upstream)
    import math

    estimate = -10.0 * math.log10(left) if left > 0 else None
    finding = {"worst": rows[worst]["block"], "worst_db": round(float(rows[worst]["snr_db"]), 3),
               "kept": [rows[i]["block"] for i in upstream],
               "estimate_db": None if estimate is None else round(estimate, 2),
               "futile": estimate is not None and estimate < gate_db}
    return order, finding
