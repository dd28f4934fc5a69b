"""One scheduler for every build: ready jobs start on the executor's workers as slots and memory allow.

- Order: the longest remaining chain first (eta.Eta.priority: by the cost model's seconds, counting
  the attribution and repair steps the last run added after a rejection; JobGraph.remaining_path
  without a cost model), so the jobs everything else waits on start first, across components: the
  talker's scoring overlaps the predictor's lowering.
- Slots: as many worker jobs at once as the executor has workers; driver jobs run one at a time in a
  thread of the build process (they need the loaded model) beside them.
- Memory: a job with a `memory` estimate holds it on a memory.MemoryGate while it runs (the gate's
  rules: a job always starts when nothing else is held, so a tight budget is slower, never stuck;
  `alone` jobs run with nothing heavy beside them unless a --max-memory budget lets them overlap, or
  all reservations held together stay within the largest alone reservation of the build, the step
  the tree must make room for anyway: memory.alone_ceiling).
  The scheduler only starts a heavy job whose reservation fits now; it never blocks on the gate.
- An `alone` job that waits for the heavy jobs running now has the next turn: another heavy job may
  start before it only if it is expected to end by the time those end (backfilling, by the cost
  model's seconds), so the waiting job is never delayed and no core idles meanwhile.
- A worker job that raises fails, and so does every job below it, each told why. Ctrl-C, a fatal
  error (a full disk, a bad input) and a failed driver job stop the build: running jobs are terminated.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Callable

from .graph import Job, JobGraph


class Fatal(Exception):
    """Wraps an error that must stop the whole build (a full disk), not just fail its job."""


class Scheduler:
    def __init__(self, graph: JobGraph, executor, gate=None, on_start: Callable[[Job], None] | None = None,
                 on_end: Callable[[Job], None] | None = None, is_fatal: Callable[[BaseException], bool] | None = None,
                 on_status: Callable[[list, int, int], None] | None = None, results=None,
                 priority: Callable[[], dict] | None = None, seconds: Callable[[Job], float] | None = None):
        from ..memory import NO_GATE

        self.graph = graph
        self.executor = executor
        self.gate = gate or NO_GATE
        self.on_start = on_start or (lambda job: None)
        self.on_end = on_end or (lambda job: None)
        self.is_fatal = is_fatal or (lambda e: False)
        self.on_status = on_status or (lambda running, done, total: None)
        self.results = results               # jobs.results.JobStore: finished jobs' outputs by content key
        # job id -> its critical-path priority (eta.Eta.priority: the cost model's seconds and the late
        # jobs the last run added); the graph's own estimates without one
        self.priority = priority or graph.remaining_path
        # a job's expected seconds (eta.Eta.seconds: the cost model's), for backfilling
        self.seconds = seconds or (lambda job: job.estimate)
        self._keys: dict[str, str] = {}
        self._driver = cf.ThreadPoolExecutor(1, thread_name_prefix="driver-job")
        self._running: dict[cf.Future, Job] = {}
        self._waiting_since: dict[str, float] = {}
        self.started = time.time()

    # ---- what may start now
    def _fits(self, job: Job) -> bool:
        from ..memory import alone_ceiling

        if job.memory <= 0:
            return True
        return self.gate.try_acquire(job.memory, job.alone, alone_ceiling(
            j.memory for j in self.graph.jobs.values() if j.alone))

    def _worker_slots(self) -> int:
        return self.executor.slots - sum(1 for j in self._running.values() if j.where == "worker")

    def _driver_busy(self) -> bool:
        return any(j.where == "driver" for j in self._running.values())

    def _start_ready(self) -> None:
        rem = self.priority()
        now = time.time()
        # An `alone` job that could not start waits for the heavy jobs running now; until it starts, a
        # heavy job may go first only if it is expected to end by then. At 4c8d28c (0.6B) the talker's
        # quantizations and compiles waited while one .pte lowering after another (150-320 s each, a
        # lane) went ahead of them, and nothing else heavy could pass them: one core worked for 600 s.
        heavy_end = max((j.started + self.seconds(j) for j in self._running.values() if j.memory > 0), default=now)
        alone_waits = any(self.graph.jobs[jid].alone and self.graph.jobs[jid].state == "waiting"
                          for jid in self._waiting_since if jid in self.graph.jobs)
        for job in sorted(self.graph.ready(), key=lambda j: -rem[j.id]):
            if job.where == "driver":
                if self._driver_busy():
                    continue
            elif self._worker_slots() <= 0:
                continue
            if job.lane and any(j.lane == job.lane for j in self._running.values()):
                continue
            if job.memory > 0 and alone_waits and not job.alone and now + self.seconds(job) > heavy_end:
                continue
            if not self._fits(job):
                if job.id not in self._waiting_since:
                    self._waiting_since[job.id] = time.monotonic()
                    self.gate.waits += 1
                alone_waits = alone_waits or job.alone
                continue
            if job.id in self._waiting_since:
                self.gate.waited_s += time.monotonic() - self._waiting_since.pop(job.id)
            self._start(job)
            if job.memory > 0:
                heavy_end = max(heavy_end, now + self.seconds(job))

    def _start(self, job: Job) -> None:
        job.state, job.started = "running", time.time()
        try:
            fn, args = job.bind(self.graph.jobs) if job.bind else (None, ())
        except BaseException as e:            # binding failed: the job fails, nothing was started
            fut: cf.Future = cf.Future()
            fut.set_exception(e)
        else:
            k = job.key_of() if self.results is not None and job.key_of is not None else None
            kept = self.results.load(k) if k is not None else None
            if kept is not None:              # the same job ended before (a killed run): its outputs
                job.cached = True
                fut = cf.Future()
                fut.set_result(kept)
            else:
                if k is not None:
                    self._keys[job.id] = k
                self.on_start(job)
                if job.where == "driver":
                    fut = self._driver.submit(fn, *args)
                else:
                    fut = self.executor.submit(job, fn, args)
        self._running[fut] = job

    # ---- the loop
    def run(self) -> None:
        try:
            while True:
                self._start_ready()
                if not self._running:
                    break
                done, _ = cf.wait(list(self._running), timeout=0.5, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    self._finish(self._running.pop(fut), fut)
                self._status()
        except BaseException:
            self.executor.close(abort=True)
            for fut in self._running:
                fut.cancel()
            raise
        finally:
            self._driver.shutdown(wait=False, cancel_futures=True)

    def _status(self) -> None:
        now = time.time()
        running = sorted(((j.label or j.id, now - j.started) for j in self._running.values()), key=lambda x: -x[1])
        finished = sum(j.state in ("done", "failed") for j in self.graph.jobs.values())
        self.on_status(running, finished, len(self.graph))

    def _finish(self, job: Job, fut: cf.Future) -> None:
        job.ended = time.time()
        if job.memory > 0:
            self.gate.release(job.memory)
        try:
            result = fut.result()
        except BaseException as e:
            job.state, job.error = "failed", e
            # a driver job (a trace) failing is the build's failure: a bad input, or a bug to see whole
            if isinstance(e, (KeyboardInterrupt, Fatal)) or self.is_fatal(e) or job.where == "driver":
                raise
        else:
            if isinstance(result, JobResult):
                job.cpu_s = result.cpu_s
                result = result.value
            job.state, job.result = "done", result
            if job.id in self._keys:
                self._keep(job)
        self.on_end(job)
        if job.done is not None:
            job.done(job)                   # may turn a failure into a result its dependents handle
        if job.state == "failed":
            self._block_below(job)

    def _keep(self, job: Job) -> None:
        """A finished job's outputs into the job store (before its driver side moves any file)."""
        try:
            self.results.save(self._keys.pop(job.id), job.id, job.kind, job.result)
        except OSError as e:
            if self.is_fatal(e):
                raise
            # a store that cannot keep it costs a rerun the job, never this build

    def _block_below(self, job: Job) -> None:
        """Jobs that need a failed job never run: each ends failed, and its driver side hears why."""
        from .errors import UpstreamFailed

        for jid in list(self.graph.children(job.id)):
            child = self.graph.jobs[jid]
            if child.state != "waiting" or child.after_all:
                continue
            child.state, child.error = "failed", UpstreamFailed(f"{job.id} failed: {job.error}")
            child.started = child.ended = time.time()
            if child.done is not None:
                child.done(child)
            self._block_below(child)


class JobResult:
    """A worker's answer: the job's value and the CPU seconds the job itself used."""

    def __init__(self, value, cpu_s: float | None = None):
        self.value, self.cpu_s = value, cpu_s


def schedule(build, the_plan, graph: JobGraph) -> None:
    """Run a build's job graph (pipeline.Build) on the executor its options name, with the memory gate,
    the plan lines and the ETA; the job seconds go to the cost model before anything is recorded."""
    from ..artifacts import reproducibility as repro
    from ..artifacts.store import is_disk_full
    from ..core import UsageError
    from ..memory import MemoryGate, build_budget
    from . import eta
    from .component import HEAVY_BYTES
    from .executors import make_executor
    from .results import JobStore

    opts = build.opts
    if not len(graph):
        eta.start(build, the_plan, graph, None, None)
        build.seeds = build.seeds or repro.seed_everything()
        return
    roots = tuple(str(r) for r in (opts.out, opts.checkpoint) if r is not None)
    executor = make_executor(opts.executor, opts.jobs, opts.shared_dir, roots)
    build.shipped = getattr(executor, "shipped", None)      # Ray: the files its jobs sent and got back
    opts.jobs = executor.slots
    # heavy steps overlap only while their estimates fit in what is free (or under --max-memory);
    # without --max-memory, QNN compiles and quantizations reserving GiBs run alone (memory.runs_alone)
    gate = MemoryGate(build_budget(opts.max_memory), alone=opts.max_memory is None)
    build.eta = eta.start(build, the_plan, graph, executor, gate)
    build.seeds = build.seeds or repro.seed_everything()   # before any job: the model may load in the first trace

    def on_status(running, done: int, total: int) -> None:
        build.progress.jobs_status(running, done, total)
        build.eta.tick(running, done, total)

    results = JobStore(opts.out) if not opts.force else None      # --force: nothing answered from it
    sched = Scheduler(graph, executor, gate, on_start=lambda j: build.progress.job_started(j.label),
                      is_fatal=lambda e: is_disk_full(e) or isinstance(e, UsageError), on_status=on_status,
                      results=results, priority=build.eta.eta.priority if build.eta is not None else None,
                      seconds=(lambda j: build.eta.eta.seconds(j)[0]) if build.eta is not None else None)
    try:
        sched.run()
    finally:
        build.paced.status = lambda: "... stopping the worker processes"
        executor.close()
        build.paced.status = None
        build.reran = getattr(executor, "reran", 0)     # jobs run again after their worker process died
    build.eta.finish()
    eta.learn(build, graph)           # before the reports: a failure there keeps the job seconds
    build.memory_gate = gate.report()
    for cj in build.runs.values():
        if cj.record and (cj.record.get("weight_bytes") or 0) >= HEAVY_BYTES:
            cj.record["timings"]["memory_gate"] = build.memory_gate
