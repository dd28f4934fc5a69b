"""Runner jobs in worker processes, so simulator runs overlap each other and the lowering.

The HTP simulator is single-threaded and slow on long sequences (a Code2Wav chunk takes about a
minute); on a 2-core machine two workers halve the wall time of the parity stage. Workers are
spawned (not forked: torch and ORT threads do not survive a fork) and only receive a RunnerSpec
and numpy inputs.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os

from .runners import RunnerSpec, run_all


def _job(spec: RunnerSpec, inputs: list[dict]) -> list[dict]:
    return run_all(spec, inputs)


def exit_with_parent(poll_s: float = 1.0) -> None:
    """In a spawned worker: exit when the process that spawned it is gone. A parent killed outright (the
    kernel's OOM killer, kill -9) runs no cleanup, and its pool workers went on computing (GiBs of a
    quantizer or a simulator run) as orphans."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _init_worker() -> None:
    import warnings

    exit_with_parent()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # spawned workers do not inherit the parent's filters; torch's pytree deprecation warnings
    # (unpickling exported programs) would otherwise reach the user's terminal on every job
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import onnxruntime as ort

    ort.set_default_logger_severity(4)   # see qnn_ep._register


class RunPool:
    """submit(spec, inputs) -> Future[list[dict]]; jobs=1 runs inline (no subprocess).

    one_at_a_time: a single worker process, a fresh one per job, for graphs whose sessions take
    GiBs (a 0.6B talker graph on the HTP simulator: 3.6 GiB): two such sessions side by side, and
    a worker keeping its last session's heap, added them to the quantizer's and the build's peak."""

    def __init__(self, jobs: int, one_at_a_time: bool = False):
        self.jobs = max(1, jobs)
        self._pool = None
        if self.jobs > 1:
            self._pool = cf.ProcessPoolExecutor(1 if one_at_a_time else self.jobs,
                                                mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                                max_tasks_per_child=1 if one_at_a_time else None)

    def submit(self, spec: RunnerSpec, inputs: list[dict]) -> cf.Future:
        # ExecuTorch's runtime is quick and does not import cleanly beside torchao in a fresh
        # spawned process; it runs here.
        if self._pool is not None and spec.kind != "executorch":
            return self._pool.submit(_job, spec, inputs)
        f: cf.Future = cf.Future()
        try:
            f.set_result(_job(spec, inputs))
        except Exception as e:  # surfaced by .result(), like a worker's exception
            f.set_exception(e)
        return f

    def close(self, abort: bool = False) -> None:
        """abort: stop running jobs too (after Ctrl-C or an error, don't wait a minute for the
        simulator to finish a job nobody will read)."""
        if self._pool is not None:
            if abort:
                procs = getattr(self._pool, "_processes", None) or {}    # private, but no public way
                for proc in list(procs.values()):
                    proc.terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(abort=exc_type is not None)


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))
