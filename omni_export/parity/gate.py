"""The gate: a score below the threshold, or any NaN/Inf, is a rejection with a reason."""
from __future__ import annotations

import math
from typing import Sequence

from ..core import OutputScore, Precision, UsageError, Verdict


def parse_gates(text: str | None) -> dict[Precision, float]:
    """`fp16=45,w8a16=32` -> {Precision.FP16: 45.0, ...}; a finite number of dB per precision."""
    gates = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        prec, sep, value = item.partition("=")
        try:
            p, db = Precision.parse(prec), float(value)
        except ValueError:
            raise UsageError(f"--gate expects PRECISION=DB items like fp16=45, got '{item}'") from None
        if p in gates:
            raise UsageError(f"--gate names {p.value} twice ({p.value}={gates[p]:g} and '{item.strip()}'); "
                             f"give each precision one gate")
        gates[p] = db
        if not sep or not math.isfinite(db):
            raise UsageError(f"--gate expects PRECISION=DB items like fp16=45 (a finite number), got '{item}'")
    return gates


def top1_gate(top1_min, precision) -> float | None:
    """The share of rows whose logits must pick fp32's top-1 at `precision` (a Precision or its value;
    a repaired build is held to its base precision's), from a Component.top1_min or the manifest's
    record of it ({precision value: share}); None when there is none."""
    if not top1_min:
        return None
    p = Precision(precision) if isinstance(precision, str) else precision
    base = getattr(p, "base", p)
    return top1_min.get(base, top1_min.get(base.value))


def judge(scores: Sequence[OutputScore], threshold_db: float, gated: Sequence[str] = (),
          attribution: Sequence[dict] = (), agreement_min: float = 1.0, top1_min: float | None = None) -> Verdict:
    """Accept when every gated output (all when `gated` is empty) is finite and >= threshold;
    integer outputs instead need at least `agreement_min` of their elements equal to fp32's; with
    `top1_min`, logits outputs also need fp32's top-1 on at least that fraction of rows."""
    considered = [s for s in scores if not gated or s.name in gated]
    if not considered:
        return Verdict(False, threshold_db, "no outputs were scored", tuple(scores))
    for s in considered:
        if s.agreement is not None and s.agreement < agreement_min:
            return Verdict(False, threshold_db, f"output '{s.name}' agrees with fp32 on {100 * s.agreement:.1f}%"
                                                f"{_excused(s)} < {100 * agreement_min:.0f}% of elements", tuple(scores))
    ints = [s for s in considered if s.agreement is not None]
    agreed = "; ".join(f"'{s.name}' agreement {100 * s.agreement:.1f}%{_excused(s)} >= {100 * agreement_min:.0f}%"
                       for s in ints)
    considered = [s for s in considered if s.agreement is None]
    if not considered:
        return Verdict(True, threshold_db, agreed, tuple(scores))
    bad = [s for s in considered if not s.finite]
    if bad:
        where = _worst_block(attribution, nonfinite=True)
        reason = f"output '{bad[0].name}'{_against(bad[0])} has NaN/Inf" + (f"; first non-finite block: {where}" if where else "")
        return Verdict(False, threshold_db, reason, tuple(scores))
    low = [s for s in considered if s.snr_db < threshold_db]
    if low:
        worst = min(low, key=lambda s: s.snr_db)
        reason = f"output '{worst.name}'{_against(worst)} {worst.snr_db:.1f} dB < gate {threshold_db:.0f} dB"
        where = _worst_block(attribution)
        if where:
            reason += f"; lowest block: {where}"
        return Verdict(False, threshold_db, reason, tuple(scores))
    picks = [s for s in considered if s.top1 is not None] if top1_min is not None else []
    for s in picks:
        if s.top1 < top1_min:
            return Verdict(False, threshold_db, f"output '{s.name}' picks fp32's top-1 on {100 * s.top1:.1f}% "
                                                f"< {100 * top1_min:.0f}% of rows", tuple(scores))
    worst = min(considered, key=lambda s: s.snr_db)
    reason = f"min {worst.snr_db:.1f} dB >= gate {threshold_db:.0f} dB"
    if picks:
        low = min(picks, key=lambda s: s.top1)
        reason += f"; '{low.name}' top-1 {100 * low.top1:.1f}% >= {100 * top1_min:.0f}%"
    if agreed:
        reason += f"; {agreed}"
    return Verdict(True, threshold_db, reason, tuple(scores))


def _excused(s: OutputScore) -> str:
    """An agreement's raw value and the rows excused at a near tie, when any were (metrics.tie_aware)."""
    if not s.ties or s.agreement_raw is None:
        return ""
    return f" (raw {100 * s.agreement_raw:.1f}%, {s.ties} row{'s' if s.ties != 1 else ''} excused at a near tie)"


def _against(s: OutputScore) -> str:
    """What a score was compared with, when not fp32's output as is (a RowSum's scores)."""
    return f" against {s.against}," if s.against else ""


def _worst_block(attribution: Sequence[dict], nonfinite: bool = False) -> str | None:
    rows = [r for r in attribution if r.get("snr_db") is not None]
    if nonfinite:
        for r in attribution:
            if r.get("finite") is False:
                return r["block"]
        return None
    if not rows:
        return None
    r = min(rows, key=lambda r: r["snr_db"])
    return f"{r['block']} {r['snr_db']:.1f} dB"
