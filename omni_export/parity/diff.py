"""Compare the recorded scores of two runs, build by build (component/format/precision), in dB.

A regression is a drop of more than the tolerance on any output, an output that turned NaN/Inf
or was no longer scored, a build that went from accepted to rejected, or an accepted build that
the second run did not build at all.
"""
from __future__ import annotations

import math

from ..artifacts.scores import num

DEFAULT_TOLERANCE_DB = 1.0
# float32 rounding alone gives ~140 dB: above it two outputs are both "exact", whatever the number.
CEILING_DB = 140.0


def build_key(b: dict) -> str:
    return f"{b['component']}/{b['format']}/{b['precision']}"


def compare(a: dict, b: dict, tolerance_db: float = DEFAULT_TOLERANCE_DB) -> dict:
    """Rows per (build, output) with both scores, the delta and a flag; regressions; what differs."""
    ia, ib = _index(a), _index(b)
    keys = list(ia) + [k for k in ib if k not in ia]
    rows = [row for k in keys for row in _rows(k, ia.get(k), ib.get(k), tolerance_db)]
    return {"tolerance_db": tolerance_db, "rows": rows,
            "regressions": [r for r in rows if r["regression"]],
            "provenance": provenance_changes(a, b)}


def _index(m: dict) -> dict:
    return {build_key(b): b for b in m["builds"]}


def _outputs(b: dict | None) -> dict:
    return {o["name"]: o for o in ((b or {}).get("parity") or {}).get("outputs") or []}


def _rows(key: str, a: dict | None, b: dict | None, tol: float) -> list[dict]:
    base = {"key": key, "a_verdict": a and a["status"], "b_verdict": b and b["status"]}
    if b is None:
        accepted = a["status"] == "accepted"
        return [{**base, "output": None, "a_db": None, "b_db": None, "delta_db": None, "regression": accepted,
                 "flag": "accepted in A, not built in B" if accepted else "not built in B"}]
    if a is None:
        return [{**base, "output": None, "a_db": None, "b_db": None, "delta_db": None, "regression": False,
                 "flag": "new in B"}]
    oa, ob = _outputs(a), _outputs(b)
    names = list(oa) + [n for n in ob if n not in oa]
    rows = [_output_row(base, n, oa.get(n), ob.get(n), tol) for n in names] or [
        {**base, "output": None, "a_db": None, "b_db": None, "delta_db": None, "regression": False,
         "flag": "not scored in either"}]
    if a["status"] == "accepted" and b["status"] == "rejected":
        rows[0] = {**rows[0], "regression": True, "flag": _join(rows[0]["flag"], "accepted in A, rejected in B")}
    return rows


def _output_row(base: dict, name: str, oa: dict | None, ob: dict | None, tol: float) -> dict:
    va, vb = _value(oa), _value(ob)
    delta = _delta(va, vb)
    flag, regression = "", False
    if oa is not None and ob is None:
        flag, regression = "not scored in B", True
    elif _finite(va) and vb is not None and not _finite(vb):
        flag, regression = "NaN/Inf in B", True
    elif delta is not None and delta < -tol:
        flag, regression = f"regression: {delta:+.1f} dB (tolerance {tol:g})", True
    elif va is not None and not _finite(va) and _finite(vb):
        flag = "finite in B (NaN/Inf in A)"
    elif delta is not None and delta > tol:
        flag = "improved"
    return {**base, "output": name, "a_db": va, "b_db": vb, "delta_db": delta, "regression": regression,
            "flag": flag}


def _value(o: dict | None) -> float | None:
    if o is None:
        return None
    v = num(o.get("snr_db"))
    return math.nan if o.get("finite") is False else v


def _finite(v: float | None) -> bool:
    return v is not None and not math.isnan(v) and v != -math.inf


def _delta(va: float | None, vb: float | None) -> float | None:
    if not (_finite(va) and _finite(vb)):
        return None
    return min(vb, CEILING_DB) - min(va, CEILING_DB)


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


PROVENANCE_FIELDS = (
    ("recipe", lambda m: m["recipe"]["name"]),
    ("target", lambda m: m["target"]["name"]),
    ("checkpoint", lambda m: f"{m['checkpoint']['label']}: " + ",".join(
        w["sha256"][:12] for w in m["checkpoint"].get("weights", []))),
    ("gates_db", lambda m: m.get("options", {}).get("gates_db")),
    ("recipe_options", lambda m: m.get("options", {}).get("recipe_options")),
    ("rewrites", lambda m: m.get("options", {}).get("rewrites")),
    ("heldout", lambda m: {c: i.get("heldout", {}).get("sha256", "")[:12] for c, i in m["components"].items()}),
    ("calibration", lambda m: {c: i.get("calibration", {}).get("sha256", "")[:12]
                               for c, i in m["components"].items()}),
)


def provenance_changes(a: dict, b: dict) -> list[dict]:
    """What differs between the two runs besides the scores: weights, inputs, options, toolchain."""
    changes = []
    for name, get in PROVENANCE_FIELDS:
        va, vb = _safe(get, a), _safe(get, b)
        if va != vb:
            changes.append({"field": name, "a": va, "b": vb})
    ta, tb = a.get("toolchain", {}), b.get("toolchain", {})
    for k in sorted(set(ta) | set(tb)):
        if ta.get(k) != tb.get(k):
            changes.append({"field": f"toolchain.{k}", "a": ta.get(k), "b": tb.get(k)})
    return changes


def _safe(get, m: dict):
    try:
        return get(m)
    except (KeyError, TypeError, AttributeError):
        return None
