"""Side-by-side timing (MEASURING.md rules 5, 6, 8): every arm runs in every pass, the arm order
rotates from pass to pass, and results are min / median / max over passes. Comparisons are
ratios, per pass (arms of one pass ran seconds apart, under the same machine load) and of the
medians; when two arms' [min, max] ranges overlap the comparison is flagged "not a ranking".
"""
from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

LOWER_IS_BETTER, HIGHER_IS_BETTER = "lower", "higher"


@dataclass
class Arm:
    """One thing to time. `call(i)` runs it once on sample i; `value` turns one timed pass
    (seconds per call) into the reported figure (identity for latencies)."""
    name: str
    call: Callable[[int], object]
    unit: str = "ms"
    better: str = LOWER_IS_BETTER
    value: Callable[[float], float] = lambda s: s * 1e3
    reps: int = 1
    warmup_s: list = field(default_factory=list)
    per_pass: list = field(default_factory=list)     # reported figure per pass (None: the pass failed)
    errors: list = field(default_factory=list)


def stats(values: list[float]) -> dict:
    ok = [v for v in values if v is not None]
    if not ok:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(ok), "median": statistics.median(ok), "max": max(ok), "n": len(ok)}


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:500], "traceback_tail": traceback.format_exc()[-2000:]}


def warm(arm: Arm, calls: int, min_pass_s: float, max_reps: int) -> None:
    """Run the arm `calls` times (first-call costs: session init, page faults), then choose how
    many calls one timed pass makes so that a pass lasts at least `min_pass_s`."""
    try:
        for i in range(max(1, calls)):
            t0 = time.perf_counter()
            arm.call(i)
            arm.warmup_s.append(time.perf_counter() - t0)
    except Exception as e:  # a failing arm is recorded, never dropped
        arm.errors.append({"phase": "warmup", **_error(e)})
        return
    typical = min(arm.warmup_s[1:] or arm.warmup_s)
    arm.reps = max(1, min(max_reps, math.ceil(min_pass_s / max(typical, 1e-9))))


def run_passes(arms: list[Arm], passes: int, samples: int) -> list[list[str]]:
    """Every pass times every arm (arm order rotated by one each pass); returns the orders used."""
    orders = []
    live = [a for a in arms if not a.errors]
    for p in range(passes):
        order = live[p % len(live):] + live[:p % len(live)] if live else []
        orders.append([a.name for a in order])
        for arm in order:
            try:
                t0 = time.perf_counter()
                for r in range(arm.reps):
                    arm.call((p * arm.reps + r) % samples)
                arm.per_pass.append(arm.value((time.perf_counter() - t0) / arm.reps))
            except Exception as e:
                arm.per_pass.append(None)
                arm.errors.append({"phase": f"pass {p}", **_error(e)})
    for arm in arms:                        # arms that failed in warm-up still report every pass
        if len(arm.per_pass) < passes:
            arm.per_pass += [None] * (passes - len(arm.per_pass))
    return orders


def arm_json(arm: Arm) -> dict:
    failed = sum(v is None for v in arm.per_pass)
    timed = len(arm.per_pass) - failed
    return {"unit": arm.unit, "better": arm.better,
            **{k: (_round(v) if k != "n" else v) for k, v in stats(arm.per_pass).items()},
            "calls_per_pass": arm.reps, "per_pass": [_round(v) for v in arm.per_pass],
            "warmup_ms": [round(s * 1e3, 4) for s in arm.warmup_s],
            "failed_passes": failed, "errors": arm.errors,
            "quotable": failed == 0 and timed > 0 and not arm.errors}


def ratio(name: str, num: Arm, den: Arm, meaning: str, budget: tuple[str, float] | None = None) -> dict:
    """num / den per pass and of the medians. With times, num = the slower-expected arm, so the
    ratio reads "den is this many times faster". Overlapping [min, max] ranges: not a ranking.
    `budget` is (">=", x) or ("<=", x) on the ratio of medians."""
    pairs = [(a / b) for a, b in zip(num.per_pass, den.per_pass) if a is not None and b not in (None, 0)]
    sa, sb = stats(num.per_pass), stats(den.per_pass)
    quotable = not num.errors and not den.errors and None not in num.per_pass + den.per_pass
    r = {"name": name, "numerator": num.name, "denominator": den.name, "meaning": meaning,
         "quotable": quotable}
    if sa["n"] == 0 or sb["n"] == 0 or not sb["median"]:
        return {**r, "ratio_of_medians": None, "per_pass": stats([]), "not_a_ranking": None,
                "budget": f"{budget[0]} {budget[1]}" if budget else None, "meets_budget": None,
                "verdict": "not quotable" if budget else None}
    overlap = sa["min"] <= sb["max"] and sb["min"] <= sa["max"]
    r.update({"ratio_of_medians": _round(sa["median"] / sb["median"]),
              "per_pass": {k: (_round(v) if k != "n" else v) for k, v in stats(pairs).items()},
              "not_a_ranking": overlap})
    if budget is not None:
        op, x = budget
        ok = (lambda v: v >= x) if op == ">=" else (lambda v: v <= x)
        r["budget"] = f"{op} {x}"
        r["meets_budget"] = quotable and ok(r["ratio_of_medians"])
        r["meets_budget_every_pass"] = quotable and bool(pairs) and all(ok(v) for v in pairs)
        # met: every pass is within the budget; missed: none is; straddles: the spread crosses it
        n_ok = sum(ok(v) for v in pairs)
        r["verdict"] = ("not quotable" if not quotable else "met" if n_ok == len(pairs) else
                        "missed" if n_ok == 0 else "straddles the budget")
    return r


def _round(v):
    return None if v is None else float(f"{v:.5g}")
