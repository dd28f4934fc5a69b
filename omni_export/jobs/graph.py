"""The build as a DAG of jobs: what each job needs, where it runs, what it costs, and the critical path.

A job is a plain function of its inputs. Its worker-side function and arguments are bound only when
it becomes ready (`bind(results)`), from the results of the jobs it depends on, so a job can take the
files an upstream job wrote. A job's `done(result)` runs in the driver when it finishes and may add
jobs (attribution of a precision that was rejected, a DLC reusing its context binary's outputs).

Where a job runs:
  driver  in the build process, one at a time (trace and end-to-end parity need the loaded model);
  worker  in a worker process: a long-lived one, or a fresh one per job (`fresh`) for graphs whose
          steps take GiBs, so what the libraries keep after the job leaves with the process.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable

# Seconds a job of each kind takes before one has been measured: only the order of the ready queue
# depends on them (longest remaining chain first), never a result. From the demo build at 0482a29; an
# end-to-end part from 5a31acf's (52-55 s on the Intel host: at 30 s the rows ranked last and ran last).
DEFAULT_SECONDS = {"trace": 5.0, "export": 4.0, "fp16": 2.0, "quantize": 3.0, "lower": 3.0, "lower-pte": 15.0,
                   "lower-ctx": 3.0, "lower-dlc": 2.0, "score": 4.0, "score-htp": 10.0, "attribute": 20.0,
                   "e2e": 55.0, "record": 2.0, "repair": 10.0}
# Seconds per GiB of a graph's fp32 weights, for the jobs of a graph past 256 MB (component.HEAVY_BYTES),
# whose jobs take minutes, not the demo's seconds. Rounded from the 0.6B talker graphs (1.7 GiB) at
# 98f3437e and 3a3aed8: the simulator's runs of 2 held-out samples 48-281 s, .pte lowering 250-350 s,
# the fp32 ONNX export 98-161 s, quantization 29-68 s, the context binary's compile 23-33 s. Only the
# order matters (longest remaining chain first): without them a talker's .pte lowerings (15 s by the
# demo's figures) went before its context binaries' compiles and simulator runs, which then ran last,
# each compile alone. A repair step (quantize, compile, simulate 1-2 samples) at 9bba532: 0.6B talker
# prefill 260 s (1.65 GiB), code2wav_n2 102-116 s, the predictors 24-38 s: without it the talker's
# two steps counted 20 s in the first run's priorities, and its quantize chain started late.
SECONDS_PER_GIB = {"export": 70.0, "fp16": 12.0, "quantize": 30.0, "lower": 1.0, "lower-pte": 150.0,
                   "lower-ctx": 15.0, "lower-dlc": 10.0, "score": 15.0, "score-htp": 150.0, "attribute": 200.0,
                   "repair": 150.0}


@dataclass
class Job:
    id: str                                  # unique, e.g. "code2wav/lower/ctx/fp16"
    kind: str                                # a DEFAULT_SECONDS key
    deps: tuple[str, ...] = ()
    where: str = "worker"                    # "driver" | "worker"
    label: str = ""                          # the progress line, e.g. "code2wav: lower ctx fp16"
    component: str | None = None
    bind: Callable[[dict], tuple] | None = None      # results -> (fn, args): what runs, bound when ready
    done: Callable[["Job"], None] | None = None      # driver-side, once it ended (result or error)
    memory: int = 0                          # bytes reserved while it runs (0: a light job)
    alone: bool = False                      # a heavy step that runs with nothing else heavy beside it
    lane: str | None = None                  # at most one running job per lane (memory.lane: big lowerings)
    fresh: bool = False                      # a fresh worker process for this job alone
    seconds: float | None = None             # an estimate for the critical path (DEFAULT_SECONDS)
    after_all: bool = False                  # runs once its deps ended, failed or not (end-to-end rows)
    tail: float = 0.0                        # seconds of jobs it may add before the end-to-end rows below it
                                             # (a quantized score: attribution, repair steps), counted by the
                                             # priority while no past run of the plan says what came (eta.Eta)
    key_of: Callable[[], str | None] | None = None   # its content key, once bound (jobs/results.py)
    # filled as it runs
    state: str = "waiting"                   # waiting | running | done | failed
    result: Any = None
    error: BaseException | None = None
    started: float | None = None
    ended: float | None = None
    cpu_s: float | None = None               # the job's own CPU seconds, when its executor measures them
    cached: bool = False                     # answered from the job store (jobs/results.py), not run

    @property
    def estimate(self) -> float:
        if self.ended is not None and self.started is not None:
            return self.ended - self.started
        return self.seconds if self.seconds is not None else DEFAULT_SECONDS.get(self.kind, 5.0)

    def record(self) -> dict:
        """What the manifest keeps of a finished job (durations for the what-if view)."""
        return {"id": self.id, "kind": self.kind, "deps": list(self.deps), "where": self.where,
                "memory_bytes": self.memory, "alone": self.alone, **({"lane": self.lane} if self.lane else {}),
                "state": self.state,
                "seconds": None if self.started is None or self.ended is None else round(self.ended - self.started, 3),
                **({"cpu_s": round(self.cpu_s, 3)} if self.cpu_s is not None else {}),
                **({"cached": True} if self.cached else {})}


class JobGraph:
    """Jobs by id; a job may only depend on jobs added before it (so the graph stays acyclic)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self._children: dict[str, list[str]] = {}

    def add(self, job: Job) -> Job:
        if job.id in self.jobs:
            raise ValueError(f"job {job.id} planned twice")
        missing = [d for d in job.deps if d not in self.jobs]
        if missing:
            raise ValueError(f"job {job.id} depends on unplanned {', '.join(missing)}")
        self.jobs[job.id] = job
        self._children[job.id] = []
        for d in job.deps:
            self._children[d].append(job.id)
        return job

    def add_dep(self, job_id: str, dep: str) -> bool:
        """Make a waiting job wait for `dep` too; only a job planned before it (so no cycle can form)."""
        order = list(self.jobs)
        job = self.jobs[job_id]
        if job.state != "waiting" or dep in job.deps or order.index(dep) > order.index(job_id):
            return False
        job.deps = job.deps + (dep,)
        self._children[dep].append(job_id)
        return True

    def hold(self, job_id: str, dep: str) -> bool:
        """Make a waiting job wait for `dep`, a job planned after it (precision repair's jobs hold the
        end-to-end rows). Refused when `dep` already waits on `job_id`, directly or not (a cycle)."""
        job = self.jobs[job_id]
        if job.state != "waiting" or dep in job.deps or job_id == dep:
            return False
        seen, todo = set(), [dep]
        while todo:
            j = todo.pop()
            if j == job_id:
                return False
            if j not in seen:
                seen.add(j)
                todo.extend(self.jobs[j].deps)
        job.deps = job.deps + (dep,)
        self._children[dep].append(job_id)
        return True

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.jobs

    def __len__(self) -> int:
        return len(self.jobs)

    def children(self, job_id: str) -> list[str]:
        return self._children[job_id]

    def ready(self) -> list[Job]:
        ended = ("done", "failed")
        return [j for j in self.jobs.values() if j.state == "waiting"
                and all(self.jobs[d].state in (ended if j.after_all else ended[:1]) for d in j.deps)]

    def blocked(self) -> list[Job]:
        """Waiting jobs that can never run: a job they depend on failed."""
        bad = {i for i, j in self.jobs.items() if j.state == "failed"}
        out, changed = [], True
        while changed:
            changed = False
            for j in self.jobs.values():
                if j.state == "waiting" and not j.after_all and j.id not in bad and any(d in bad for d in j.deps):
                    bad.add(j.id)
                    out.append(j)
                    changed = True
        return out

    def remaining_path(self) -> dict[str, float]:
        """Per job: its estimate plus the longest chain of estimates below it (critical-path priority)."""
        return longest_below(self._children, {j: x.estimate for j, x in self.jobs.items()})

    def critical_path(self) -> tuple[float, list[str]]:
        """(seconds, job ids) of the longest chain by recorded (else estimated) durations."""
        rem = self.remaining_path()
        roots = [j for j in self.jobs.values() if not j.deps]
        if not roots:
            return 0.0, []
        cur = max(roots, key=lambda j: rem[j.id]).id
        path = [cur]
        while self._children[cur]:
            cur = max(self._children[cur], key=lambda c: rem[c])
            path.append(cur)
        return rem[path[0]], path


@dataclass(order=True)
class _Event:
    t: float
    seq: int
    job: str = field(compare=False)


def longest_below(children: dict[str, list[str]], seconds: dict[str, float]) -> dict[str, float]:
    """Per job: its seconds plus the longest chain of seconds below it. Depth first, not by planning
    order: a job planned late may hold one planned before it (JobGraph.hold)."""
    memo: dict[str, float] = {}
    for jid in children:
        stack = [jid]
        while stack:
            j = stack[-1]
            if j in memo:
                stack.pop()
                continue
            todo = [c for c in children[j] if c not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[j] = seconds[j] + max((memo[c] for c in children[j]), default=0.0)
    return memo


def project_wall(records: list[dict], workers: int, budget: int | None = None, first=frozenset()) -> float:
    """The wall time of a recorded job graph at `workers` worker slots (a projection): list scheduling
    over the recorded DAG and durations, longest remaining chain first, driver jobs one at a time in
    their own lane, heavy jobs under a memory `budget` (bytes; None: no limit) with the build's rule
    that a job always starts when nothing else heavy is held, `alone` jobs with nothing heavy beside
    unless all held reservations stay within the largest alone one (memory.alone_ceiling), and one
    job per `lane` at a time. Jobs in `first` start before the others (the ones already running, for
    the build's ETA)."""
    from ..memory import alone_ceiling

    jobs = {r["id"]: r for r in records if r.get("seconds") is not None}
    children: dict[str, list[str]] = {j: [] for j in jobs}
    for r in jobs.values():
        for d in r["deps"]:
            if d in children:
                children[d].append(r["id"])
    rem = longest_below(children, {j: r["seconds"] for j, r in jobs.items()})
    waiting = {j: sum(d in jobs for d in jobs[j]["deps"]) for j in jobs}
    ready = [j for j, n in waiting.items() if n == 0]
    running: list[_Event] = []
    ceiling = alone_ceiling((r.get("memory_bytes") or 0) for r in jobs.values() if r.get("alone"))
    held, heavy, alone_on, driver_busy, now, seq, free = 0, 0, False, False, 0.0, 0, workers
    lanes: set = set()
    done = 0
    while done < len(jobs):
        ready.sort(key=lambda j: (j not in first, -rem[j]))
        started = True
        while started:
            started = False
            for j in list(ready):
                r = jobs[j]
                mem = r.get("memory_bytes") or 0
                if r["where"] == "driver":
                    if driver_busy:
                        continue
                elif free == 0:
                    continue
                if r.get("lane") and r["lane"] in lanes:
                    continue
                if mem:
                    if (alone_on or (r.get("alone") and heavy)) and (ceiling is None or held + mem > ceiling):
                        continue
                    if budget is not None and heavy and held + mem > budget:
                        continue
                ready.remove(j)
                if r["where"] == "driver":
                    driver_busy = True
                else:
                    free -= 1
                if mem:
                    held += mem
                    heavy += 1
                    alone_on = alone_on or bool(r.get("alone"))
                if r.get("lane"):
                    lanes.add(r["lane"])
                seq += 1
                heapq.heappush(running, _Event(now + r["seconds"], seq, j))
                started = True
                break
        if not running:
            raise ValueError("the recorded job graph cannot be scheduled (a dependency cycle or a missing job)")
        ev = heapq.heappop(running)
        now = ev.t
        r = jobs[ev.job]
        if r["where"] == "driver":
            driver_busy = False
        else:
            free += 1
        lanes.discard(r.get("lane"))
        if r.get("memory_bytes"):
            held -= r["memory_bytes"]
            heavy -= 1
            if r.get("alone"):
                alone_on = False
        done += 1
        for c in children[ev.job]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    return now
