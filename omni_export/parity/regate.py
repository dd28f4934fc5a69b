"""Re-judge recorded scores against new gates, without rebuilding or rerunning anything.

The manifest's verdicts stay as the build recorded them (and artifact files stay where the build
put them); the re-gating is a separate record that parity.json and the reports show beside them.
"""
from __future__ import annotations

import math
import time

from ..artifacts.scores import as_json_db, gated_outputs, min_snr_db, num, score_from_json
from .gate import judge, top1_gate

NOTE = ("re-judged the recorded per-output scores against new gates without rebuilding; "
        "manifest.json keeps the build-time verdicts and files were not moved between "
        "the output directory and rejected/ (rebuild with --gate to move them)")


def regate(manifest: dict, gates_db: dict[str, float], fail_under_db: float | None = None) -> dict:
    """The re-gating record: per build the new threshold, verdict and reason, and a summary."""
    rows = [_rejudge(manifest, b, gates_db) for b in manifest["builds"]]
    comps = list(manifest["components"]) or sorted({r["component"] for r in rows})
    without = [c for c in comps if not any(r["component"] == c and r["verdict"] == "accepted" for r in rows)]
    below = [r["key"] for r in rows if fail_under_db is not None and r["verdict"] == "accepted"
             and not _at_least(r["min_snr_db"], fail_under_db)]
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gates_db": dict(gates_db),
        "fail_under_db": fail_under_db,
        "note": NOTE,
        "builds": rows,
        "summary": {
            "accepted": sum(r["verdict"] == "accepted" for r in rows),
            "rejected": sum(r["verdict"] == "rejected" for r in rows),
            "components_without_accepted_build": without,
            "changed": [r["key"] for r in rows if r["verdict"] != r["built_verdict"]],
            "below_fail_under": below,
        },
    }


def failed(record: dict) -> bool:
    """True when CI should fail: a component has no passing build, or one is under --fail-under."""
    s = record["summary"]
    return bool(s["components_without_accepted_build"] or s["below_fail_under"])


def _rejudge(manifest: dict, b: dict, gates_db: dict[str, float]) -> dict:
    p = b.get("parity") or {}
    outputs = p.get("outputs") or []
    threshold = float(gates_db.get(b["precision"], p.get("threshold_db")))
    names = gated_outputs(manifest, b["component"])
    row = {"key": f"{b['component']}/{b['format']}/{b['precision']}", "component": b["component"],
           "format": b["format"], "precision": b["precision"], "threshold_db": threshold,
           "built_verdict": b["status"], "min_snr_db": None}
    if not outputs:   # lowering or the runner failed: nothing was scored, it stays rejected
        return {**row, "verdict": "rejected", "reason": p.get("reason") or b.get("error") or "not scored"}
    attribution = manifest["components"].get(b["component"], {}).get("attribution", {}).get(b["precision"], [])
    agreement_min = manifest["components"].get(b["component"], {}).get("agreement_min", 1.0)
    top1_min = top1_gate(manifest["components"].get(b["component"], {}).get("top1_min"), b["precision"])
    v = judge([score_from_json(o) for o in outputs], threshold, names, attribution, agreement_min=agreement_min,
              top1_min=top1_min)
    verdict, reason = v.status, v.reason
    device = ((b.get("hub") or {}).get("parity") or {}).get("outputs")
    if device and verdict == "accepted":     # scored on a phone too (AI Hub): both must pass
        dv = judge([score_from_json(o) for o in device], threshold, names, agreement_min=agreement_min,
                   top1_min=top1_min)
        if not dv.accepted:
            verdict, reason = "rejected", f"on the device (AI Hub): {dv.reason}"
    return {**row, "verdict": verdict, "reason": reason,
            "min_snr_db": as_json_db(min_snr_db(outputs, names))}


def _at_least(value, floor: float) -> bool:
    v = num(value)
    return not math.isnan(v) and v >= floor
