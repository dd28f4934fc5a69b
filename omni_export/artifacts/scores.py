"""Recorded scores as the manifest stores them: dB values are numbers or "inf" / "-inf" / "nan".

Helpers to read them back into floats and OutputScores, so recorded builds can be re-judged
(`omni-export parity`) and compared (`omni-export diff`) without rebuilding.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..core import OutputScore

_WORDS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "Infinity": math.inf,
          "-Infinity": -math.inf, "NaN": math.nan}


def num(x) -> float:
    """A recorded dB value as a float (None and unknown words -> NaN)."""
    if isinstance(x, bool) or x is None:
        return math.nan
    if isinstance(x, (int, float)):
        return float(x)
    return _WORDS.get(str(x), math.nan)


def as_json_db(x: float) -> float | str:
    """The inverse of num(): finite floats stay numbers, the rest become words (valid JSON)."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return round(x, 3)


def score_from_json(d: dict) -> OutputScore:
    """A recorded per-output score; a NaN SNR counts as non-finite so it can never pass a gate."""
    if d.get("agreement") is not None:          # an integer output (codes): scored by agreement
        raw = d.get("agreement_raw")
        return OutputScore(d["name"], None, None, 0.0, agreement=float(d["agreement"]),
                           agreement_raw=None if raw is None else float(raw), ties=d.get("ties"))
    snr = num(d.get("snr_db"))
    finite = bool(d.get("finite", True)) and not math.isnan(snr)
    return OutputScore(d["name"], snr, num(d.get("psnr_db")), num(d.get("max_abs_err", math.nan)),
                       finite=finite, top1=d.get("top1"), against=d.get("against"))


def gated_outputs(manifest: dict, component: str) -> tuple[str, ...]:
    """The outputs the gate looked at, as recorded (empty = all)."""
    return tuple(manifest["components"].get(component, {}).get("gated_outputs") or ())


def gated(outputs: Sequence[dict], names: Sequence[str]) -> list[dict]:
    """The outputs the gate looks at (all when `names` is empty)."""
    return [o for o in outputs if not names or o["name"] in names]


def min_snr_db(outputs: Sequence[dict], names: Sequence[str] = ()) -> float | None:
    """The lowest SNR over the gated outputs; NaN when one is non-finite; None when none were scored."""
    scores = [s for s in (score_from_json(o) for o in gated(outputs, names)) if s.agreement is None]
    if not scores:
        return None
    if any(not s.finite for s in scores):
        return math.nan
    return min(s.snr_db for s in scores)
