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


class Outputs(list):
    """A scoring job's outputs, one dict per sample, with the job's own seconds (`wall_s`: opening
    the artifact and running every sample), which a caller waiting on the job cannot see."""

    def __init__(self, items=(), wall_s: float | None = None):
        super().__init__(items)
        self.wall_s = wall_s


def _job(spec: RunnerSpec, inputs: list[dict]) -> Outputs:
    """One scoring run; with a stage log kept (OMNI_EXPORT_STAGE_LOG), a `job` line records where
    the scoring time goes: open (session / compile) and run seconds per runner and file."""
    import time

    path = os.environ.get("OMNI_EXPORT_STAGE_LOG")
    times: dict = {}
    t0 = time.time()
    ok = False
    try:
        out = Outputs(run_all(spec, inputs, times), wall_s=round(time.time() - t0, 3))
        ok = True
        return out
    finally:
        if path:
            import json

            with open(path, "a") as f:
                f.write(json.dumps({"t": time.time(), "event": "job", "pid": os.getpid(), "runner": spec.short,
                                    "model": os.path.basename(spec.model), "samples": len(inputs), "ok": ok,
                                    "wall_s": round(time.time() - t0, 3), **times}) + "\n")


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


def mark_process(role: str) -> None:
    """Name this process's role in the stage log (OMNI_EXPORT_STAGE_LOG), when one is kept: the
    benchmark harness attributes CPU and memory per role (build process, scoring worker, QNN
    compile child ...) from these lines."""
    import json
    import time

    path = os.environ.get("OMNI_EXPORT_STAGE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"t": time.time(), "event": "process", "pid": os.getpid(), "role": role}) + "\n")


def init_child(role: str) -> None:
    """Initializer of a spawned child doing one step of the build (a QNN compile, a quantization)."""
    from ..quiet import quiet_library_logs

    exit_with_parent()
    mark_process(role)
    quiet_library_logs()


def _init_worker() -> None:
    import warnings

    exit_with_parent()
    mark_process("scoring worker")

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # spawned workers do not inherit the parent's filters; torch's pytree deprecation warnings
    # (unpickling exported programs) would otherwise reach the user's terminal on every job
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from ..quiet import quiet_library_logs

    quiet_library_logs()
    import onnxruntime as ort

    ort.set_default_logger_severity(4)   # see qnn_ep._register


class RunPool:
    """submit(spec, inputs) -> Future[list[dict]]; jobs=1 runs inline (no subprocess).

    one_at_a_time: a single worker process, a fresh one per job, for graphs whose sessions take
    GiBs (a 0.6B talker graph on the HTP simulator: 3.6 GiB): two such sessions side by side, and
    a worker keeping its last session's heap, added them to the quantizer's and the build's peak.

    gate: a memory.MemoryGate with a budget: a job submitted with `reserve` bytes is handed to a
    worker only when that reservation fits beside what the build's other heavy steps hold (a QNN
    compile child, a quantizer child); jobs keep their submission order."""

    def __init__(self, jobs: int, one_at_a_time: bool = False, gate=None):
        from ..memory import NO_GATE

        self.jobs = max(1, jobs)
        self.gate = gate or NO_GATE
        self._pool = None
        self._queue = None
        self._dispatcher = None
        if self.jobs > 1:
            workers = 1 if one_at_a_time else self.jobs
            self._pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                                max_tasks_per_child=1 if one_at_a_time else None)
            if self.gate.budget is not None:
                import queue
                import threading

                self._queue = queue.Queue()
                self._slots = threading.Semaphore(workers)
                self._closed = False
                self._dispatcher = threading.Thread(target=self._dispatch, name="runpool-dispatch", daemon=True)
                self._dispatcher.start()

    def submit(self, spec: RunnerSpec, inputs: list[dict], reserve: int = 0, alone: bool = False) -> cf.Future:
        # ExecuTorch's runtime is quick and does not import cleanly beside torchao in a fresh
        # spawned process; it runs here.
        if self._pool is not None and spec.kind != "executorch":
            if self._queue is not None:
                proxy: cf.Future = cf.Future()
                self._queue.put((spec, inputs, reserve, alone, proxy))
                return proxy
            return self._pool.submit(_job, spec, inputs)
        f: cf.Future = cf.Future()
        try:
            with self.gate.hold(reserve, alone):
                f.set_result(_job(spec, inputs))
        except Exception as e:  # surfaced by .result(), like a worker's exception
            f.set_exception(e)
        return f

    def _dispatch(self) -> None:
        """Hand queued jobs to the workers in order, each once a worker is free and its memory
        reservation fits; the reservation is released when the job ends."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            spec, inputs, reserve, alone, proxy = item
            self._slots.acquire()
            self.gate.acquire(reserve, alone)
            try:
                if self._closed:
                    raise RuntimeError("runner pool closed before the job started")
                inner = self._pool.submit(_job, spec, inputs)
            except Exception as e:
                self.gate.release(reserve)
                self._slots.release()
                proxy.set_exception(e)
                continue

            def done(fut: cf.Future, reserve=reserve, proxy=proxy) -> None:
                self.gate.release(reserve)
                self._slots.release()
                if fut.cancelled():
                    proxy.set_exception(RuntimeError("runner job cancelled"))
                elif fut.exception() is not None:
                    proxy.set_exception(fut.exception())
                else:
                    proxy.set_result(fut.result())

            inner.add_done_callback(done)

    def close(self, abort: bool = False) -> None:
        """abort: stop running jobs too (after Ctrl-C or an error, don't wait a minute for the
        simulator to finish a job nobody will read)."""
        if self._dispatcher is not None:
            if abort:
                self._closed = True
            self._queue.put(None)
            if abort:
                self._terminate()
            self._dispatcher.join()
            self._dispatcher = None
        if self._pool is not None:
            if abort:
                self._terminate()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _terminate(self) -> None:
        procs = getattr(self._pool, "_processes", None) or {}    # private, but no public way
        for proc in list(procs.values()):
            proc.terminate()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(abort=exc_type is not None)


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))
