"""Executors: where worker jobs run. `local` (default): worker processes on this machine; one job
slot runs jobs in the build process itself (no worker to spawn); `ray[:ADDRESS]`: a Ray cluster."""
from __future__ import annotations

import concurrent.futures as cf

from ..core import UsageError


class InlineExecutor:
    """Every worker job in the build process, one at a time (--jobs 1)."""

    name = "inline"
    slots = 1

    def describe(self) -> dict:
        return {"executor": self.name, "workers": 1}

    def submit(self, job, fn, args) -> cf.Future:
        from .local import call

        fut: cf.Future = cf.Future()
        try:
            fut.set_result(call(fn, args))
        except BaseException as e:        # surfaced by .result(), like a worker's exception
            fut.set_exception(e)
        return fut

    def close(self, abort: bool = False) -> None:
        pass


def make_executor(spec: str, jobs: int, shared_dir: str | None = None, roots: tuple = ()):
    """`local` | `ray` | `ray:ADDRESS`; `jobs` worker slots (0: one per core; local only). Ray ships the
    files under `roots` (OUT, the checkpoint) a job names, through `shared_dir` or its object store."""
    kind, _, address = (spec or "local").partition(":")
    if jobs < 0:
        raise UsageError(f"--jobs must be >= 0 (0: one per core), got {jobs}")
    if kind == "local":
        from .local import LocalExecutor

        return InlineExecutor() if jobs == 1 else LocalExecutor(jobs or None)
    if kind == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(address or None, jobs or None, shared_dir, roots)
    raise UsageError(f"unknown --executor '{spec}'; valid: local, ray, ray:ADDRESS")
