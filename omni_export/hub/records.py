"""hub/jobs.json: every AI Hub job of an output directory, written as soon as it exists.

The record is rewritten atomically after every change (a job name reserved before submitting, its
id and URL as soon as AI Hub returns them, every state change), then merged into manifest.json
(each build's "hub" dict, and a top-level "hub" summary). A run killed at any point leaves a
record the next run resumes from: jobs with an id are waited on, a job reserved but never
confirmed is looked up by its unique name before anything is submitted again.

Layout of a record:
  {"schema_version": 1, "client": label, "device": {name, os, chipset, attributes},
   "qairt_version": {"pinned": "2.51", "why": ...}, "uploads": {"models": {sha256: id},
   "datasets": {component: id}}, "builds": {component/format/precision: build record}}
A build record: {"route": {...}, "state": pending|running|done|failed, "steps": [{kind, name,
   id, url, options, state, message, submitted, finished, attempt}], "history": [earlier failed
   steps], "profile": {...}, "parity": {...}, "files": {...}}
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from ..artifacts.store import atomic_write_json
from .client import HubUsageError

DIR = "hub"
RECORD = f"{DIR}/jobs.json"
LOCK = f"{DIR}/.lock"
SCHEMA_VERSION = 1


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load(root: Path) -> dict | None:
    p = Path(root) / RECORD
    if not p.exists():
        return None
    try:
        rec = json.loads(p.read_text())
    except ValueError as e:
        raise HubUsageError(f"{p} is not valid JSON ({e}); move it away to start the AI Hub jobs over") from None
    if rec.get("schema_version") != SCHEMA_VERSION:
        raise HubUsageError(f"{p} has schema_version {rec.get('schema_version')}, expected {SCHEMA_VERSION}")
    return rec


def new(client: str) -> dict:
    return {"schema_version": SCHEMA_VERSION, "tool": "omni-export", "client": client, "created": now(),
            "device": None, "qairt_version": None, "uploads": {"models": {}, "datasets": {}}, "builds": {}}


def save(root: Path, record: dict) -> None:
    record["updated"] = now()
    atomic_write_json(Path(root) / RECORD, record)


@contextlib.contextmanager
def lock(root: Path):
    """One `hub submit` per output directory at a time (a dead holder's lock is taken over)."""
    path = Path(root) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            pid = _pid(path)
            if pid and _alive(pid):
                raise HubUsageError(f"another omni-export (pid {pid}) is submitting {root} to AI Hub; "
                                    f"wait for it or check it with `omni-export hub status {root}`") from None
            path.unlink(missing_ok=True)
    else:  # pragma: no cover - raced twice
        raise HubUsageError(f"cannot lock {path}")
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_state(b: dict) -> str:
    """pending (nothing submitted), running, done (scored), failed (a job failed or could not be submitted)."""
    steps = b.get("steps") or []
    if any(s["state"] == "failed" for s in steps):
        return "failed"
    if b.get("parity"):
        return "done"
    return "running" if any(s.get("id") for s in steps) else "pending"


def summary(record: dict) -> dict:
    rows = list(record.get("builds", {}).values())
    verdict = lambda r: (r.get("parity") or {}).get("verdict")   # noqa: E731
    return {
        "builds": len(rows),
        "accepted_on_device": sum(verdict(r) == "accepted" for r in rows),
        "rejected_on_device": sum(verdict(r) == "rejected" for r in rows),
        "failed": sum(build_state(r) == "failed" for r in rows),
        "waiting": sum(build_state(r) in ("pending", "running") for r in rows),
    }
