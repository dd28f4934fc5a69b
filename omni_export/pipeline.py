"""The driver: plan -> schedule -> record. No model knowledge and no stage lives here.

plan (jobs/plan.py) turns recipe x target x options into builds; each component not reused from the
build cache becomes jobs of one job graph (jobs/component.py); the scheduler (jobs/scheduler.py)
runs them on the executor's workers, across components; what they found becomes the manifest, the
end-to-end rows and the reports (jobs/record.py).
"""
from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from .artifacts import reproducibility as repro
from .artifacts.store import Store, disk_full, is_disk_full
from .core import UsageError
from .faults import crash_point
from .memory import release_memory
from .jobs import record
from .jobs.component import HEAVY_BYTES, ComponentJobs
from .jobs.e2e import EndToEndJobs
from .jobs.plan import RunOptions, plan
from .progress import InterruptPoints, Paced, Progress, StageLog
from .recipes import load_callable

@dataclass
class Result:
    manifest: dict
    exit_code: int
    out: Path


def run(opts: RunOptions, progress: Progress | None = None) -> Result:
    import os

    progress = progress or Progress()
    if os.environ.get("OMNI_EXPORT_STAGE_LOG"):
        progress = StageLog(progress, os.environ["OMNI_EXPORT_STAGE_LOG"])
    paced = Paced(progress)                      # a heartbeat line whenever 10 s pass without one
    progress = InterruptPoints(paced)
    plan(opts)                                   # flags are checked before any work starts
    store = Store(opts.out)
    try:
        previous = store.begin(opts.recipe.name, opts.target.name, opts.force)
    except OSError as e:
        _raise_if_disk_full(e, opts.out, store.incomplete)
        raise
    if store.recovered is not None:
        previous = None if opts.force else store.resumable()
        done = sorted((previous or {}).get("components", {}))
        progress.note(f"{opts.out}: a previous run (pid {store.recovered.get('pid')}) did not finish; "
                      + (f"the components it finished are reused ({', '.join(done)}), " if done else "")
                      + "its other files are rebuilt or removed")
    paced.start()
    try:
        return Build(opts, store, progress, previous, paced).run()
    except BaseException as e:
        _raise_if_disk_full(e, opts.out, store.abort())
        raise
    finally:
        paced.stop()


def _raise_if_disk_full(e: BaseException, out: Path, incomplete: bool) -> None:
    """A full disk is the user's to fix: one line, exit 2, wherever the exporters wrapped it."""
    full = disk_full(e)
    if full is not None:
        where = getattr(full, "filename", None) or out
        raise UsageError(f"disk full while writing {where}; free space and rerun"
                         + (f" ({out} is marked incomplete)" if incomplete else "")) from e


class Build:
    """One run: what the jobs share (options, output store, progress, the loaded model) and its record."""

    def __init__(self, opts: RunOptions, store: Store, progress: Progress, previous: dict | None,
                 paced: Paced | None = None):
        from .artifacts.cache import BuildCache
        from .jobs.eta import CostModel

        self.opts, self.store, self.progress, self.previous = opts, store, progress, previous
        self.paced = paced or Paced(progress)
        self.costs = CostModel.load(progress.note)      # past runs' job seconds, for the ETA (jobs/eta.py)
        self.eta = None
        self.frame_files: dict[str, str] = {}     # end-to-end job id -> its frame meter (progress.FrameFile)
        self.recipe_options = record.recipe_options(opts)
        self.cache = BuildCache(opts, previous, self.recipe_options, record.rewrites(opts), reuse=not opts.force)
        self.created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._model, self._lock, self._capture_noted = None, threading.Lock(), False
        self.components: dict[str, dict] = {}
        self.entries: dict[str, list[dict]] = {}
        self.runs: dict[str, ComponentJobs] = {}
        self.available = None
        self.memory_gate: dict | None = None
        self.e2e, self._traces_left = None, 0

    # ---- what jobs ask of the run
    def model(self):
        with self._lock:
            if self._model is None:
                with self.progress.stage("load checkpoint"):
                    self._model = load_callable(self.opts.recipe.loader)(self.opts.checkpoint, self.recipe_options,
                                                                         self.opts.out)
                crash_point("loaded")
                self._check_assumed(self._model)
            return self._model

    def _check_assumed(self, m) -> None:
        """The run was planned on the components the cost model recorded for this model key: the loaded
        model must have exactly those (else the entry is dropped and the run stops, to be run again)."""
        assumed = getattr(self, "_assumed", None)
        have = tuple(m.components()) if hasattr(m, "components") else None
        if assumed is not None and have is not None and tuple(assumed) != have:
            self.costs.forget_model(self.cache.model_key())
            self.costs.save()
            raise UsageError(f"cost model {self.costs.where}: this model's components were recorded as "
                             f"{', '.join(assumed)} but the checkpoint has {', '.join(have)}; the entry is "
                             f"dropped, run the build again")

    @property
    def loaded_model(self):
        """The model if a job loaded it (a fully reused build never does), else None."""
        return self._model

    def checkpoint_path(self) -> str:
        return self.model().info["path"]

    def gate(self, component, precision) -> float:
        return record.gate(self.opts, component, precision)

    def slow_samples(self, weight_bytes: int, heldout: int, heavy: int = 0):
        return record.slow_samples(self.opts, weight_bytes, heldout, heavy)

    def lowering_options(self, component: str) -> dict:
        kw = record.lowering_options(self.opts, component)
        return {**kw, "rewrites": list(kw["rewrites"]), "headroom": {p.value: v for p, v in kw["headroom"].items()}}

    def note_capture(self, cc: dict | None) -> None:
        """Say once per run where the captured inputs came from, when not generated and kept as usual."""
        if not cc or self._capture_noted:
            return
        self._capture_noted = True
        if cc["hit"]:
            self.progress.note(f"inputs captured from the fp32 model reused from the capture cache (key "
                               f"{cc['key'][:12]}; OMNI_EXPORT_CAPTURE_CACHE=off captures them again)")
        elif cc.get("store") not in ("stored", "off"):
            self.progress.note(f"captured inputs {cc['store']} in the capture cache")

    def trace_done(self) -> None:
        """A component's trace ended; once all have, the end-to-end rows are planned (jobs/e2e.py)."""
        self._traces_left -= 1
        if self._traces_left == 0:
            self.e2e.plan()

    def component_done(self, jobs: ComponentJobs) -> None:
        entries = [e for e in jobs.entries if e is not None]
        self.components[jobs.name], self.entries[jobs.name] = jobs.record, entries
        self.cache.stamp(jobs.name, jobs.record, entries, jobs.builds, jobs.thresholds, self.created)
        self.store.record_finished(jobs.name, jobs.record, entries)
        crash_point("component-done")
        release_memory()

    # ---- the run
    def run(self) -> Result:
        from .jobs.executors import make_executor
        from .jobs.graph import JobGraph
        from .jobs.scheduler import Scheduler
        from .memory import MemoryGate, build_budget

        opts, started = self.opts, time.time()
        # the model's components from the build cache, or from the cost model (a run of the same model
        # key into another OUT): then the plan and ETA come before torch loads, and the model with the
        # first trace
        available = self.cache.model_components()
        if available is None:
            available = self._assumed = self.costs.components_for(self.cache.model_key())
        seeds = None
        if available is None:
            seeds = repro.seed_everything()
            m = self.model()
            available = m.components() if hasattr(m, "components") else None
        self._available = available
        the_plan = plan(opts, available)
        graph = JobGraph()
        order = list(dict.fromkeys(b.component for b in the_plan.builds))
        for name in order:
            builds = [b for b in the_plan.builds if b.component == name]
            component = opts.recipe.component(name)
            thresholds = {b.precision: self.gate(component, b.precision) for b in builds}
            reused = self.cache.reuse_component(name, builds, thresholds, opts.out)
            if reused is not None:
                self.components[name], self.entries[name] = reused
                self.progress.note(f"{name}: {len(reused[1])} build(s) unchanged, reused from the cache "
                                   f"(--force rebuilds)")
                continue
            self.runs[name] = ComponentJobs(self, name, builds, graph)
            self.runs[name].plan()
        self.e2e, self._traces_left = EndToEndJobs(self, the_plan, graph), len(self.runs)
        if not self.runs:
            self.e2e.plan()
        if len(graph):
            executor = make_executor(opts.executor, opts.jobs)
            opts.jobs = executor.slots
            # heavy steps overlap only while their estimates fit in what is free (or under --max-memory);
            # without --max-memory, QNN compiles and quantizations reserving GiBs run alone (memory.runs_alone)
            gate = MemoryGate(build_budget(opts.max_memory), alone=opts.max_memory is None)
            self.eta = self._plan_and_eta(the_plan, graph, executor, gate)
            seeds = seeds or repro.seed_everything()   # before any job: the model may load in the first trace
            sched = Scheduler(graph, executor, gate, on_start=lambda j: self.progress.job_started(j.label),
                              is_fatal=lambda e: is_disk_full(e) or isinstance(e, UsageError),
                              on_status=self._status)
            try:
                sched.run()
            finally:
                self.paced.status = lambda: "... stopping the worker processes"
                executor.close()
                self.paced.status = None
            self.eta.finish()
            self._learn(graph)           # before the reports: a failure there keeps the job seconds
            self.memory_gate = gate.report()
            for cj in self.runs.values():
                if cj.record and (cj.record.get("weight_bytes") or 0) >= HEAVY_BYTES:
                    cj.record["timings"]["memory_gate"] = self.memory_gate
        else:
            self._plan_and_eta(the_plan, graph, None, None)
            seeds = seeds or repro.seed_everything()
        self.available = available
        manifest = record.finish(self, the_plan, order, graph, seeds, started)
        s = manifest["summary"]
        return Result(manifest, 3 if s["components_without_accepted_build"] or s["end_to_end_failed"] else 0, opts.out)

    # ---- the plan, the ETA and the cost model (jobs/eta.py)
    def _signature(self, the_plan) -> str:
        from .jobs.eta import signature

        o = self.opts
        return signature(self.cache.checkpoint["digest"], o.recipe.name, o.target.name, the_plan.builds,
                         {"attribution": o.attribution, "e2e": o.e2e, "recipe": self.recipe_options,
                          "reused": sorted(self.components)})

    def _weight_of(self, component: str | None):
        run = self.runs.get(component) if component else None
        return run.info.get("weight_bytes") if run is not None and run.info else None

    def _plan_and_eta(self, the_plan, graph, executor, gate):
        from .jobs.eta import Eta, EtaReport, plan_lines

        self._sig = self._signature(the_plan)         # before the graph runs: which components were reused
        late = self.costs.late.get(self._sig, [])
        workers = executor.slots if executor is not None else 0
        eta = Eta(graph, self.costs, self.cache.checkpoint["digest"], max(1, workers), gate.budget if gate else None,
                  late, self._weight_of, self._sig)
        lines = plan_lines(the_plan, graph, sorted(self.components), workers,
                           executor.name if executor is not None else "-", eta.late)
        if executor is None:
            for line in lines:
                self.progress.note(line)
            return None
        report = EtaReport(eta, self.progress, self.paced, self.frame_files)
        report.start(lines)
        return report

    def _status(self, running, done: int, total: int) -> None:
        self.progress.jobs_status(running, done, total)
        if self.eta is not None:
            self.eta.tick(running, done, total)

    def _learn(self, graph) -> None:
        """The finished graph's job seconds into the cost model, for the next run's ETA."""
        if not len(graph):
            return
        weights = {c: (r.get("weight_bytes") if isinstance(r, dict) else None) for c, r in self.components.items()}
        records = [{**j.record(), "component": j.component} for j in graph.jobs.values()]
        # a run that captured the inputs from the fp32 model (capture cache missed or off) paid for it in
        # its first trace: its traces are kept apart, the fallback for a component never traced otherwise
        if any(not (r.info.get("capture") or {"hit": True}).get("hit", True) for r in self.runs.values()):
            records = [{**r, "id": r["id"] + " (capturing)"} if r["kind"] == "trace" else r for r in records]
        from .jobs.eta import cost_id

        records = [{**r, "id": cost_id(r["id"], r["kind"], self._sig)} for r in records]
        late = self.eta.eta.late_records() if self.eta is not None else []
        self.costs.observe(records, weights, self.cache.checkpoint["digest"], self._sig, late,
                           (self.cache.model_key(), self._available))
        why = self.costs.save()
        if why:
            self.progress.note(f"warning: {why}")


def describe_exception() -> str:  # used by the CLI's --debug
    return traceback.format_exc()


__all__ = ["RunOptions", "run", "plan", "Progress", "Result"]
