"""The driver: plan -> schedule -> record. No model knowledge and no stage lives here.

plan (jobs/plan.py) turns recipe x target x options into builds; each component not reused from the
build cache becomes jobs of one job graph (jobs/component.py); the scheduler (jobs/scheduler.py)
runs them on the executor's workers, across components; what they found becomes the manifest, the
end-to-end rows and the reports (jobs/record.py).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .artifacts import reproducibility as repro
from .artifacts.store import Store, kept_jobs, raise_if_disk_full
from .faults import crash_point
from .memory import release_memory
from .jobs import record
from .jobs.component import ComponentJobs
from .jobs.e2e import EndToEndJobs
from .jobs.eta import check_assumed
from .jobs.plan import RunOptions, plan
from .progress import InterruptPoints, Paced, Progress, StageLog
from .recipes import load_model

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
        raise_if_disk_full(e, opts.out, store.incomplete)
        raise
    if store.recovered is not None:
        previous = None if opts.force else store.resumable()
        done, jobs = sorted((previous or {}).get("components", {})), 0 if opts.force else kept_jobs(opts.out)
        progress.note(f"{opts.out}: a previous run (pid {store.recovered.get('pid')}) did not finish; "
                      + (f"the components it finished are reused ({', '.join(done)}), " if done else "")
                      + (f"the outputs of {jobs} job(s) it finished are reused, " if jobs else "")
                      + "its other files are rebuilt or removed")
    paced.start()
    try:
        return Build(opts, store, progress, previous, paced).run()
    except BaseException as e:
        raise_if_disk_full(e, opts.out, store.abort())
        raise
    finally:
        paced.stop()


class Build:
    """One run: what the jobs share (options, output store, progress, the loaded model) and its record."""

    def __init__(self, opts: RunOptions, store: Store, progress: Progress, previous: dict | None,
                 paced: Paced | None = None):
        from .artifacts.cache import BuildCache
        from .jobs.eta import CostModel

        self.opts, self.store, self.progress, self.previous = opts, store, progress, previous
        self.paced = paced or Paced(progress)
        self.costs = CostModel.load(progress.note)      # past runs' job seconds, for the ETA (jobs/eta.py)
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
        self.eta = self.assumed = self.seeds = self.signature = self.shipped = None    # set by the run
        self.reran = 0

    # ---- what jobs ask of the run
    def model(self):
        with self._lock:
            if self._model is None:
                with self.progress.stage("load checkpoint"):
                    self._model = load_model(self.opts.recipe, self.opts.checkpoint, self.recipe_options, self.opts.out)
                crash_point("loaded")
                check_assumed(self, self._model)
            return self._model

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
        from .jobs.graph import JobGraph
        from .jobs.scheduler import schedule

        opts, started = self.opts, time.time()
        # the model's components from the build cache, or from the cost model (a run of the same model
        # key into another OUT): then the plan and ETA come before torch loads, and the model with the
        # first trace
        available = self.cache.model_components()
        if available is None:
            available = self.assumed = self.costs.components_for(self.cache.model_key())
        if available is None:
            self.seeds = repro.seed_everything()
            m = self.model()
            available = m.components()
        self.available = available
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
        schedule(self, the_plan, graph)
        manifest = record.finish(self, the_plan, order, graph, self.seeds, started)
        s = manifest["summary"]
        return Result(manifest, 3 if s["components_without_accepted_build"] or s["end_to_end_failed"] else 0, opts.out)


__all__ = ["RunOptions", "run", "plan", "Progress", "Result"]
