"""The local executor: worker processes on this machine, as many as it has cores by default.

Workers are spawned (torch and ONNX Runtime threads do not survive a fork) and long-lived, so a
worker keeps what it loaded for a component (its module, its exported program) for the next job of
that component. A job marked `fresh` (a step of a graph past 256 MB of weights, which takes GiBs and
whose libraries keep what they allocate) gets a process of its own that exits with the job.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os

from .errors import WorkerDied
from .scheduler import JobResult


def cores() -> int:
    """Cores this process may run on (the affinity mask, which containers and taskset narrow)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


WORKER_BYTES = 3 << 29     # what one long-lived worker may come to hold (torch, ExecuTorch, a graph's sessions): 1.5 GiB
# A fresh job reserving this much that starts while another such job runs retires the idle long-lived
# workers (the next ordinary job of their slot spawns a new one, ~3 s). At 6537f23 the 0.6B build's peak
# was two DLC compiles (1.93 GiB each) beside the build process and both slots' idle workers (0.45 +
# 0.31 GiB of torch, ExecuTorch and a graph kept for the next job): 5.68 GiB, over the 6 GB goal.
RETIRE_BESIDE_BYTES = 1 << 30
# A job whose worker process died (killed, or crashed in native code) runs this many more times, each in
# a new process, as Ray reruns a task whose worker died (ray_executor.RETRIES). A kill (the OOM killer, a
# user) passes on a rerun; a native crash may not: the 0.6B code2wav_n2 repair step that lost its process
# at 758afc4 and b9db020 segfaults every time in QNN's fast graph preparation (qnn_diagnose.CRASH_HINT).
RETRIES = 1


def default_workers() -> int:
    """One worker per core, as many as the memory free now leaves room for (WORKER_BYTES each)."""
    from ..memory import available_bytes

    free = available_bytes()
    return max(1, min(cores(), free // WORKER_BYTES if free else cores()))


def init_worker(threads: int, role: str = "job worker", bind: tuple[int, ...] | None = None) -> None:
    """Initializer of a spawned worker: bound to the cores `bind` (before any library starts threads),
    dies with its parent, quiet libraries, `threads` math threads."""
    import warnings

    if bind and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(bind))

    from ..runtime.pool import exit_with_parent, mark_process
    from ..quiet import quiet_library_logs

    exit_with_parent()
    mark_process(role)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ["OMNI_EXPORT_JOB_THREADS"] = str(threads)
    os.environ["OMNI_EXPORT_IN_WORKER"] = "1"     # exporters.lower.isolated: already a process of its own
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    quiet_library_logs()
    import torch

    torch.set_num_threads(threads)
    import onnxruntime as ort

    ort.set_default_logger_severity(4)


def call(fn, args) -> JobResult:
    """Run one job in a worker; its CPU seconds are this process's (every thread) and its children's.
    Then the heap's free pages go back to the OS (memory.trim_heap): a long-lived worker waits beside
    every fresh heavy job of its slot, and at 0.6B the two held 0.92 GiB of the build's 5.79 GiB peak."""
    import resource

    from ..memory import trim_heap

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    t0 = cpu()
    try:
        value = fn(*args)
    finally:
        trim_heap()
    return JobResult(value, cpu() - t0)


class LocalExecutor:
    """submit(job, fn, args) -> Future of a JobResult. `workers` job slots (default_workers()).

    Slot i is one worker process bound to its own share of the cores (`slot_cores`), set as the
    process starts, before any library makes its threads. The HTP simulator otherwise keeps a thread
    spinning on every core it may use: measured on the demo Code2Wav fp16 context binary, 30.9 s of wall
    for 61.4 CPU-s in a process that may use both cores, 30.9 s for 30.7 CPU-s bound to one -- the
    second core's work was waste, taken from the job beside it."""

    name = "local"

    def __init__(self, workers: int | None = None, threads: int | None = None):
        self.slots = max(1, workers or default_workers())
        self.cores = slot_cores(self.slots)
        self.threads = threads or len(self.cores[0])
        self._pools: list[cf.ProcessPoolExecutor | None] = [None] * self.slots
        self._running: list[cf.Future | None] = [None] * self.slots
        self._reserved = [0] * self.slots            # the memory estimate of each slot's fresh job, else 0
        self._fresh: set[cf.ProcessPoolExecutor] = set()
        self.retired = 0                             # idle workers retired beside two big fresh jobs
        self.reran = 0                               # jobs run again after their worker died
        self._died: dict[int, list[str]] = {}       # per job future: how each attempt's process ended
        self._closing = False

    def describe(self) -> dict:
        return {"executor": self.name, "workers": self.slots, "threads_per_worker": self.threads}

    def _pool(self, i: int, fresh: bool, role: str) -> cf.ProcessPoolExecutor:
        if fresh or self._pools[i] is None:
            pool = cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"), initializer=init_worker,
                                          initargs=(self.threads, role, self.cores[i]))
            if not fresh:
                self._pools[i] = pool
            return pool
        return self._pools[i]

    def submit(self, job, fn, args) -> cf.Future:
        # a slot is free once its last job's future is done (the scheduler never runs more jobs than slots)
        i = next(k for k, f in enumerate(self._running) if f is None or f.done())
        big = job.memory if job.fresh else 0
        if big >= RETIRE_BESIDE_BYTES and any(r >= RETIRE_BESIDE_BYTES and f is not None and not f.done()
                                              for r, f in zip(self._reserved, self._running)):
            self._retire_idle(i)
        fut = self._running[i] = cf.Future()
        self._reserved[i] = big
        self._attempt(i, job, fn, args, fut, RETRIES)
        return fut

    def _attempt(self, i: int, job, fn, args, fut: cf.Future, left: int) -> None:
        """Run the job in slot i's worker (a new process for a fresh job); its answer goes to `fut`. A
        worker that dies under it is replaced, and the job runs again while `left` allows."""
        role = f"{job.kind} job process" if job.fresh else "job worker"
        pool = self._pool(i, job.fresh, role)
        try:
            inner = pool.submit(call, fn, args)
        except (cf.process.BrokenProcessPool, RuntimeError):   # its worker died after its last job
            self._pools[i] = None
            pool = self._pool(i, job.fresh, role)
            inner = pool.submit(call, fn, args)
        if job.fresh:
            self._fresh.add(pool)
        procs = list((getattr(pool, "_processes", None) or {}).values())    # its exit code: no public way

        def ended(f: cf.Future) -> None:
            if job.fresh:
                # its one job is done: the process exits (max_tasks_per_child=1 would have the pool's
                # manager thread start a replacement, racing this shutdown)
                self._fresh.discard(pool)
                pool.shutdown(wait=False)
            if f.cancelled():
                self._died.pop(id(fut), None)
                fut.cancel()
                return
            err = f.exception()
            if isinstance(err, cf.process.BrokenProcessPool):
                if self._pools[i] is pool:              # the slot's long-lived worker is gone
                    self._pools[i] = None
                    pool.shutdown(wait=False)
                died = self._died.setdefault(id(fut), [])
                died.append(_exit_status(procs))
                if left > 0 and not self._closing:
                    self.reran += 1
                    self._attempt(i, job, fn, args, fut, left - 1)
                    return
                err = WorkerDied(f"its worker process died {len(died)} times ({', '.join(died)}), a new process "
                                 f"each time: killed, or crashed in native code")
            self._died.pop(id(fut), None)
            if fut.cancelled():
                return
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(f.result())
        inner.add_done_callback(ended)

    def _retire_idle(self, slot: int) -> None:
        """Shut down the long-lived workers that have no job now: `slot`'s (its slot is taken by a
        fresh job) and those of slots running a fresh job."""
        for k, pool in enumerate(self._pools):
            f = self._running[k]
            if pool is not None and (k == slot or (self._reserved[k] and f is not None and not f.done())):
                pool.shutdown(wait=False)
                self._pools[k] = None
                self.retired += 1

    def close(self, abort: bool = False) -> None:
        self._closing = True
        pools = [p for p in self._pools if p is not None] + list(self._fresh)
        for pool in pools:
            if abort:
                for proc in list((getattr(pool, "_processes", None) or {}).values()):   # no public way
                    proc.terminate()
            pool.shutdown(wait=not abort, cancel_futures=True)
        self._pools = [None] * self.slots
        self._fresh = set()


def _exit_status(procs) -> str:
    """How a dead worker ended, from its process's exit code: "signal 11 (SIGSEGV)", "exit code 1"."""
    import signal

    for p in procs:
        p.join(timeout=5)
        code = p.exitcode
        if code is None:
            continue
        if code < 0:
            try:
                return f"signal {-code} ({signal.Signals(-code).name})"
            except ValueError:
                return f"signal {-code}"
        return f"exit code {code}"
    return "exit status unknown"


def slot_cores(slots: int) -> list[tuple[int, ...]]:
    """The cores each worker slot is bound to: an equal share of this process's cores each (a core
    shared round-robin when there are more slots than cores)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(cores()))
    if slots >= len(allowed):
        return [(allowed[i % len(allowed)],) for i in range(slots)]
    k = len(allowed) // slots
    return [tuple(allowed[i * k:(i + 1) * k]) for i in range(slots)]
