"""Where AI Hub jobs are recorded: in manifest.json itself, rewritten as soon as anything changes.

The manifest's top-level "hub" holds what every job of the directory shares; each submitted
build's "hub" holds its own jobs and results. `hub submit` rewrites manifest.json atomically
through the Store (artifacts/store.py, amend mode) after every change: a job name reserved before
submitting, its id and URL as soon as AI Hub returns them, every state change, every result file.
A run killed at any point leaves a manifest the next run resumes from: jobs with an id are waited
on, a job reserved but never confirmed is looked up by its unique name before anything is
submitted again.

manifest["hub"]:
  {"client": label, "created", "updated", "device": {name, os, chipset, attributes},
   "qairt_version": {"pinned": "2.41", "full", "why", "offered"}, "uploads": {"models":
   {sha256: model id}, "datasets": {component/kind: dataset id}}, "left_out": [{key, reason}],
   "summary": {...}, "rtf": {...} | null}
build["hub"]:
  {"route": {runtime, compute_unit, upload, upload_sha256, quantized_by, device, qairt_version},
   "state": pending|running|done|failed, "steps": [{kind, name, id, url, options, state, status,
   message, submitted, finished, attempt, target_model?}], "history": [earlier failed attempts],
   "profile": {...}, "parity": {...}, "files": [{path, sha256, bytes, kind}]}
"""
from __future__ import annotations

import time

DIR = "hub"
STATES = ("pending", "running", "done", "failed")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def key(b: dict) -> str:
    return f"{b['component']}/{b['format']}/{b['precision']}"


def new_section(client: str) -> dict:
    return {"client": client, "created": now(), "updated": now(), "device": None, "qairt_version": None,
            "uploads": {"models": {}, "datasets": {}}, "left_out": [], "summary": {}, "rtf": None}


def build_state(rec: dict) -> str:
    """pending (nothing submitted), running, done (scored), failed (a job failed or could not be submitted)."""
    steps = rec.get("steps") or []
    if any(s["state"] == "failed" for s in steps):
        return "failed"
    if rec.get("parity"):
        return "done"
    return "running" if any(s.get("id") for s in steps) else "pending"


def submitted(manifest: dict) -> dict[str, dict]:
    """{build key: its hub record} for every build that has one."""
    return {key(b): b["hub"] for b in manifest.get("builds", []) if isinstance(b.get("hub"), dict)}


def summary(manifest: dict) -> dict:
    rows = list(submitted(manifest).values())
    verdict = lambda r: (r.get("parity") or {}).get("verdict")   # noqa: E731
    return {
        "builds": len(rows),
        "accepted_on_device": sum(verdict(r) == "accepted" for r in rows),
        "rejected_on_device": sum(verdict(r) == "rejected" for r in rows),
        "failed": sum(build_state(r) == "failed" for r in rows),
        "waiting": sum(build_state(r) in ("pending", "running") for r in rows),
    }


def has_jobs(manifest: dict) -> bool:
    return any(s.get("id") for r in submitted(manifest).values() for s in r.get("steps") or [])
