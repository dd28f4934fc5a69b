"""parity.json: every build's scores and verdict, derived from the manifest alone.

Its shape is documented by omni_export/schemas/parity.schema.json (schema_version 2). An
optional "regated" block records `omni-export parity --gate ...` beside the build-time verdicts;
builds submitted to AI Hub carry a "device" block (the phone's scores beside the local ones) and
the document a top-level "hub" (device, QAIRT pin, summary, RTF estimate).
"""
from __future__ import annotations

from ..artifacts.scores import as_json_db, gated_outputs, min_snr_db
from ..core import strict_json
from .hub import parity_device, parity_hub

PARITY_SCHEMA_VERSION = 2
PROVENANCE_KEYS = ("omni-export", "omni-export-git", "torch", "executorch", "onnxruntime",
                   "onnxruntime-qnn", "qnn", "qai-hub", "python")


def parity_json(m: dict, regated: dict | None = None) -> dict:
    ck = m["checkpoint"]
    return strict_json({
        "schema_version": PARITY_SCHEMA_VERSION,
        "tool": "omni-export",
        "manifest_created": m["created"],
        "recipe": m["recipe"]["name"],
        "target": m["target"]["name"],
        "checkpoint": {"path": ck["path"], "label": ck["label"], "demo": bool(ck.get("demo")),
                       "weights_sha256": [w["sha256"] for w in ck.get("weights", [])]},
        "provenance": {"toolchain": {k: m["toolchain"].get(k) for k in PROVENANCE_KEYS},
                       "host": m["host"].get("hostname")},
        "builds": [_build(m, b) for b in m["builds"]],
        "skipped": m.get("skipped", []),
        "attribution": {c: info.get("attribution", {}) for c, info in m["components"].items()},
        "end_to_end": m.get("end_to_end", []),
        "summary": m["summary"],
        "regated": regated,
        **({"hub": parity_hub(m)} if m.get("hub") else {}),
    })


def _build(m: dict, b: dict) -> dict:
    p = b.get("parity") or {}
    runner = p.get("runner") or {}
    outputs = p.get("outputs") or []
    low = min_snr_db(outputs, gated_outputs(m, b["component"]))
    return {"key": f"{b['component']}/{b['format']}/{b['precision']}", "name": b["name"],
            "component": b["component"], "format": b["format"], "precision": b["precision"],
            "runner": runner.get("label"), "runner_kind": runner.get("kind"),
            "threshold_db": p.get("threshold_db"), "verdict": b["status"], "reason": p.get("reason"),
            "min_snr_db": None if low is None else as_json_db(low), "outputs": outputs,
            "files": [{"path": f["path"], "bytes": f["bytes"]} for f in b.get("files", [])],
            "samples": [s["path"] for s in b.get("samples", [])],
            # which held-out samples its runner scored: how many, and which when not all (None: all)
            "heldout_samples": p.get("samples"), "heldout_indices": p.get("heldout_indices"),
            **({"device": parity_device(m, b)} if b.get("hub") else {})}


