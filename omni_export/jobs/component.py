"""One component's jobs, and what they found as its manifest record and build entries.

    trace (driver) ─┬─ export ─┬─ fp16 ──────────── lower onnx|dlc|ctx fp16 ── score
                    │          └─ quantize P ────── lower onnx|dlc|ctx P ───── score
                    ├─ lower pte P ─────────────────────────────────────────── score
                    └─ attribute P (every precision with --attribution all; else added once a
                       precision has a rejected build)

A DLC and the context binary of the same precision hold the same QNN graph: the DLC's score is the
context binary's run (`outputs_from`). Every driver-side step (committing files, verdicts, the
record) runs in the scheduler's thread, one at a time, so the output store sees one writer.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ..artifacts.manifest import RAISED_KEY
from ..artifacts.store import STAGING
from ..core import BuildSpec, Format, Precision, UsageError
from ..faults import crash_point
from .errors import UpstreamFailed, WorkerDied, short
from .graph import Job, JobGraph
from .repair import RAISES

MIN_CALIBRATION = 4
ATTRIBUTION_SAMPLES = 1   # held-out samples per block: a diagnostic, one is enough
# Graphs past HEAVY_BYTES of weights (real-size language models) are scored on SLOW_SAMPLES
# held-out samples on the slow runners -- the HTP simulator (a 0.6B talker step: 44 s at fp16 alone)
# and ExecuTorch's portable kernels (w8a16 .pte) -- and on all of them elsewhere; a component may ask
# for more (Component.sim_samples: the fused predictor frame, 4). --sim-samples overrides.
HEAVY_BYTES = 256 << 20
# job kinds whose outputs the job store keeps (jobs/results.py): a rerun after a kill reuses them
KEPT_KINDS = ("export", "fp16", "quantize", "lower", "lower-pte", "lower-ctx", "lower-dlc", "score", "score-htp")
SLOW_SAMPLES = 2
ONNX_FORMATS = (Format.ONNX, Format.DLC, Format.CTX)
# memory.STEP_FACTORS entry of each job kind of a heavy graph (scoring jobs: by their runner)
MEMORY_KIND = {"export": "onnx-export", "fp16": "onnx-fp16", "quantize": "quantize", "lower-ctx": "qnn-compile",
               "lower-dlc": "qnn-dlc", "lower-pte": "pte-lower", "lower": "", "attribute": "qnn-htp",
               "repair": "qnn-compile"}


def _quantized_id(job_id: str) -> bool:
    """Whether a lowering job's id (`component/lower/<format>/<precision>`) names a quantized precision."""
    values = {q.value: q for q in Precision}
    q = values.get(job_id.rsplit("/", 1)[-1].removesuffix("-mixed"))
    return q is not None and q.quantized


class ComponentJobs:
    def __init__(self, run, name: str, builds: list[BuildSpec], graph: JobGraph):
        self.run, self.name, self.builds, self.graph = run, name, builds, graph
        self.component = run.opts.recipe.component(name)
        self.thresholds = {b.precision: run.gate(self.component, b.precision) for b in builds}
        self.entries: list[dict | None] = [None] * len(builds)
        self.work = run.store.root / STAGING / "work" / name     # a real directory since Store.begin
        self.ref = None
        self.info: dict = {}
        self.states: dict[str, dict] = {}
        self.attribution: dict[str, list] = {}
        self.open: set[str] = set()
        self.record: dict | None = None
        self.t0 = time.time()
        self.timings: dict = {}
        self.slow: list[int] | None = None
        self._lowered: dict[int, dict] = {}
        self.per_sample: dict[str, list[tuple]] = {}      # precision -> its ONNX build's (agreement, SNR) per held-out sample
        self.row_tables: dict = {}                        # output -> its tables (Component.row_sums; driver only)
        self.repair: dict[str, dict] = {}                 # precision -> precision repair's search (jobs/repair.py)
        self.sensitivity: dict[str, list] = {}            # precision -> per-block sensitivity rows (repair's ranking)
        self._finalize_at: dict[int, str] = {}            # build index -> HTP finalization mode, when not the run's
        self._base: str | None = None                     # the root of its jobs' content keys (_key)

    # ------------------------------------------------------------------------------------ plan
    def _add(self, job: Job) -> Job:
        job.component = self.name
        if job.kind in KEPT_KINDS and job.where == "worker" and "-mixed" not in job.id and job.key_of is None:
            job.key_of = lambda jid=job.id: self._key(jid)
        self.open.add(job.id)
        added = self.graph.add(job)
        if job.kind in ("attribute", "repair") or job.id.split("/")[-1].endswith("-mixed"):
            self._hold_e2e(job)
        return added

    def _key(self, jid: str) -> str:
        """A job's content key (jobs/results.py): the component's job base, its id, its deps' keys and,
        for a scoring run, the held-out samples it scores."""
        from .results import key

        if self._base is None:
            self._base = self.run.cache.job_base(self.name)
        job = self.graph.jobs[jid]
        deps = [self._key(d) for d in job.deps if self.graph.jobs[d].component == self.name]
        extra = None
        if job.kind in ("score", "score-htp"):
            _, _, fmt, prec = jid.split("/")
            i = next(k for k, b in enumerate(self.builds) if (b.format.value, b.precision.value) == (fmt, prec))
            extra = self._lowered.get(i, {}).get("samples")
        return key(self._base, jid, deps, extra, scoring=extra is not None or job.kind in ("score", "score-htp"))

    def _hold_e2e(self, job: Job) -> None:
        """With precision repair on, the end-to-end rows of a quantized precision wait for this
        component's attribution, repair steps and repaired builds of that precision: a row runs a
        repaired build where the plain one was rejected (recipes' placed_build). Other rows do not wait."""
        if self.run.opts.repair == "off":
            return
        values = {q.value: q for q in Precision}
        p = next((values[x.removesuffix("-mixed")] for x in job.id.split("/")[1:] if x.removesuffix("-mixed") in values), None)
        if p is None or not p.quantized:
            return                            # an fp16 attribution repairs nothing: no row waits for it
        for j in list(self.graph.jobs.values()):
            if j.kind == "e2e" and j.state == "waiting" and p.value in j.id.split("/")[1].split("+"):
                self.graph.hold(j.id, job.id)

    def _sized(self, j: Job) -> None:
        """A waiting job of a graph past HEAVY_BYTES: an estimate scaled to its weights, and (a worker's
        step) a process of its own holding its estimated peak on the memory gate."""
        from ..memory import lane, runs_alone, step_bytes
        from .graph import SECONDS_PER_GIB

        wb = self.info.get("weight_bytes", 0) if self.info else 0
        if j.state != "waiting" or wb < HEAVY_BYTES:
            return
        if j.kind in SECONDS_PER_GIB:
            j.seconds = max(j.estimate, SECONDS_PER_GIB[j.kind] * wb / 2**30)
        if j.tail:
            _, _, fmt, prec = j.id.split("/")
            j.tail = self._tail(next(b for b in self.builds if (b.format.value, b.precision.value) == (fmt, prec)), wb)
        kind = MEMORY_KIND.get(j.kind)
        if kind == "qnn-compile" and (j.kind == "repair" or _quantized_id(j.id)):
            kind = "qnn-compile-qdq"          # from a QDQ ONNX: int8 weights, ~60 % of an fp16 compile's peak
        if j.where == "worker" and kind:
            j.fresh = True
            j.memory = step_bytes(kind, wb)
            j.alone = runs_alone(kind, j.memory)
            j.lane = lane(kind, j.memory)

    def _id(self, *parts) -> str:
        return "/".join((self.name,) + tuple(str(p) for p in parts))

    def plan(self) -> None:
        c = self.name
        trace = self._add(Job(self._id("trace"), "trace", where="driver", label=f"{c}: trace fp32 and capture inputs",
                              bind=lambda jobs: (self._trace, ()), done=self._traced))
        onnx_builds = [b for b in self.builds if b.format in ONNX_FORMATS]
        export = fp16 = None
        if onnx_builds:
            export = self._add(Job(self._id("export"), "export", (trace.id,), label=f"{c}: export fp32 ONNX",
                                   bind=lambda jobs: (self._work("export_onnx"), (self.ref,)), done=self._state))
        if any(b.precision == Precision.FP16 for b in onnx_builds):
            qnn = any(b.precision == Precision.FP16 and b.format != Format.ONNX for b in onnx_builds)
            fp16 = self._add(Job(self._id("fp16"), "fp16", (export.id,), label=f"{c}: fp16 ONNX",
                                 bind=lambda jobs, qnn=qnn: (self._work("to_fp16"), (self.ref, self._deps_states(jobs, export.id), qnn)),
                                 done=self._state))
        quant = {}
        for p in sorted({b.precision for b in onnx_builds if b.precision.quantized}, key=list(Precision).index):
            quant[p] = self._add(Job(self._id("quantize", p.value), "quantize", (export.id,),
                                     label=f"{c}: quantize {p.value} (calibrated QDQ)",
                                     bind=lambda jobs, p=p: (self._work("quantize"),
                                                             (self.ref, self._deps_states(jobs, export.id), p.value)),
                                     done=self._state))
        for i, b in enumerate(self.builds):
            if b.format == Format.PTE:
                src = trace.id
            elif b.precision == Precision.FP32:
                src = export.id
            elif b.precision == Precision.FP16:
                src = fp16.id
            else:
                src = quant[b.precision].id
            kind = {"pte": "lower-pte", "ctx": "lower-ctx", "dlc": "lower-dlc"}.get(b.format.value, "lower")
            self._add(Job(self._id("lower", b.format.value, b.precision.value), kind, (src,),
                          label=f"{c}: lower {b.format.value} {b.precision.value}",
                          bind=lambda jobs, i=i, src=src: self._bind_lower(jobs, i, src),
                          done=lambda job, i=i: self._lowered_done(job, i)))
        # a DLC sharing its context binary's run is planned after it
        for i, b in sorted(enumerate(self.builds), key=lambda x: (self._ctx_sibling(x[1]) is not None,
                                                                 x[1].format != Format.ONNX)):
            ctx = self._ctx_sibling(b)
            lower_id = self._id("lower", b.format.value, b.precision.value)
            if ctx is not None:
                deps = (lower_id, self._id("score", "ctx", b.precision.value))
                self._add(Job(self._id("score", b.format.value, b.precision.value), "score-shared", deps, where="driver",
                              label=f"{c}: score {b.format.value} {b.precision.value}",
                              bind=lambda jobs, deps=deps, i=i: self._bind_shared(jobs, i, deps),
                              done=lambda job, i=i: self._scored(job, i)))
            else:
                kind = "score-htp" if b.format in (Format.DLC, Format.CTX) else "score"
                self._add(Job(self._id("score", b.format.value, b.precision.value), kind,
                              (lower_id,) + self._onnx_score(b),
                              label=f"{c}: score {b.format.value} {b.precision.value}",
                              bind=lambda jobs, i=i, lower_id=lower_id: self._bind_score(jobs, i, lower_id),
                              done=lambda job, i=i: self._scored(job, i), tail=self._tail(b)))
        if self.run.opts.attribution == "all":
            for p in _attribution_precisions(self.builds):
                self._add_attribution(p, on_cpu=False)

    def _tail(self, b: BuildSpec, weight_bytes: int = 0) -> float:
        """What a rejection of this build may add before its precision's end-to-end row (Job.tail):
        attribution and --repair-steps steps, by the graph defaults. A first run has no past run to
        say so, and without it the demo ran its .pte lowerings (each below the w8a16 row) before
        Code2Wav's quantize chain, whose attribution and three steps then held the row to the end."""
        from .graph import DEFAULT_SECONDS, SECONDS_PER_GIB

        opts = self.run.opts
        if opts.repair == "off" or not b.precision.quantized or b.format == Format.PTE:
            return 0.0
        attribute = max(DEFAULT_SECONDS["attribute"], SECONDS_PER_GIB["attribute"] * weight_bytes / 2**30)
        step = max(DEFAULT_SECONDS["repair"], SECONDS_PER_GIB["repair"] * weight_bytes / 2**30)
        return attribute + opts.repair_steps * step

    def _ctx_sibling(self, b: BuildSpec) -> BuildSpec | None:
        if b.format != Format.DLC:
            return None
        return next((o for o in self.builds if o.format == Format.CTX and o.precision == b.precision), None)

    def _work(self, name: str):
        from . import work

        return getattr(work, name)

    def _deps_states(self, jobs, *ids) -> list[dict]:
        for i in ids:
            if jobs[i].result is None or "error" in jobs[i].result:
                raise UpstreamFailed((jobs[i].result or {}).get("error") or f"{i} failed")
        return [jobs[i].result for i in ids]

    # ------------------------------------------------------------------------------------ trace
    def _trace(self) -> dict:
        """Driver thread: the fp32 graph on captured inputs; hands its inputs to the workers as files.
        The heap is trimmed after: a fresh capture at 0.6B frees ~1.3 GiB of small tensors that glibc
        would otherwise keep in the build process for the rest of the build."""
        from ..memory import release_memory

        try:
            return self._trace_once()
        finally:
            release_memory()

    def _trace_once(self) -> dict:
        from ..artifacts import reproducibility as repro
        from ..artifacts.manifest import hash_arrays
        from ..trace import BlockChain, trace
        from . import work

        model = self.run.model()
        needs_calib = any(b.precision.quantized for b in self.builds)
        graph = model.graph(self.name)
        heldout = model.samples(self.name, "heldout")
        calib = model.samples(self.name, "calibration")
        if needs_calib and len(calib.inputs) < MIN_CALIBRATION:
            raise UsageError(f"{self.name}: calibration set has {len(calib.inputs)} samples; quantized "
                             f"builds need at least {MIN_CALIBRATION} real inputs")
        traced = trace(graph, calib, heldout)
        counts = work.write_inputs(self.work / "inputs", traced)
        audio = [{k: r[k] for k in self.component.audio_outputs} for r in traced.reference]
        cc = model.capture_cache
        return {"row_tables": dict(graph.row_tables), "inputs": [s.to_json() for s in traced.inputs], "outputs": [s.to_json() for s in traced.outputs],
                "calibration": {"source": traced.calibration_source, "count": len(traced.calibration),
                                "sha256": hash_arrays(traced.calibration)},
                "heldout": {"source": traced.heldout_source, "count": len(traced.heldout),
                            "sha256": hash_arrays(traced.heldout)},
                "capture": dict(cc) if cc else None, "weight_bytes": _weight_bytes(traced.module),
                "parity_npz": repro.parity_inputs_npz(traced), "audio": audio, "counts": counts,
                "logits": list(traced.logits), "output_names": traced.output_names,
                "input_names": traced.input_names, "block_chain": isinstance(traced.module, BlockChain),
                "block_names": list(getattr(traced.module, "block_names", ()))}

    def _traced(self, job: Job) -> None:
        from ..artifacts.samples import keep_audio
        from ..memory import runs_alone, step_bytes
        from .work import GraphRef

        if job.error is not None:
            return
        self._line(job)
        info = self.info = job.result
        self.row_tables = info.pop("row_tables", {})
        self.timings["trace_s"] = round(job.ended - job.started, 3)
        self.run.note_capture(info["capture"])
        rec = self.run.store.put_bytes(f"parity-inputs/{self.name}.npz", info.pop("parity_npz"))
        self.info["parity_inputs"] = {**rec.to_json(), "samples": info["heldout"]["count"]}
        self.info["samples"] = keep_audio(self.run.store.put_bytes, f"{self.name}-fp32", info.pop("audio"),
                                          self.component.audio_outputs)
        wb = info["weight_bytes"]
        heavy = wb >= HEAVY_BYTES
        self.slow = self.run.slow_samples(wb, info["heldout"]["count"], self.component.sim_samples)
        if self.slow is not None:
            self._worst_first()
            self.run.progress.note(f"{self.name}: {wb / 2**30:.2f} GiB of weights: the HTP simulator and portable "
                                   f"kernels score {len(self.slow)} of {info['heldout']['count']} held-out samples "
                                   f"(--sim-samples)")
        self.ref = GraphRef(self.run.opts.recipe.name, self.run.checkpoint_path(), json.dumps(self.run.recipe_options),
                            str(self.run.store.root), self.name, str(self.work / "inputs"), tuple(info["counts"]),
                            (info["calibration"]["source"], info["heldout"]["source"]), self.run.opts.target.name,
                            str(self.work), json.dumps(self.run.lowering_options(self.name)),
                            json.dumps({"inputs": info["inputs"], "outputs": info["outputs"], "logits": info["logits"]}),
                            wb if heavy else 0, self.run.opts.target.place(self.name).unit)
        if heavy:
            for jid in list(self.open):
                self._sized(self.graph.jobs[jid])
        crash_point("traced")
        self.run.trace_done()
        self._close(job)

    def _state(self, job: Job) -> None:
        """An intermediate graph's job ended: a failure is recorded for the builds that needed it."""
        if job.error is not None:
            from ..artifacts.store import is_disk_full

            if is_disk_full(job.error):
                raise job.error
            job.result = {"error": short(job.error)}
            job.state = "done"          # its dependents start, and fail with its reason (UpstreamFailed)
            self._line(job, f"failed: {job.result['error']}", failed=True)
        else:
            self._line(job)
        self.states[job.id] = job.result
        self._close(job)

    def _worst_first(self) -> None:
        """Slow runners score a subset of the held-out samples: make each wait for the ONNX build of
        its precision on ORT CPU, whose per-sample scores pick the samples it scores (the worst)."""
        for b in self.builds:
            if b.format == Format.ONNX or (b.format == Format.PTE and b.precision != Precision.W8A16):
                continue
            onnx = self._id("score", "onnx", b.precision.value)
            mine = self._id("score", b.format.value, b.precision.value)
            if onnx in self.graph and self.graph.jobs[mine].kind != "score-shared":
                self.graph.add_dep(mine, onnx)

    def _graph_seconds(self, spec: BuildSpec) -> float:
        """Seconds of the intermediate graphs this build lowered from (the fp32 ONNX export, its fp16 or
        QDQ form): jobs of their own, shared with the component's other builds of that graph."""
        ids = [] if spec.format == Format.PTE else [self._id("export")]
        if spec.format != Format.PTE and spec.precision == Precision.FP16:
            ids.append(self._id("fp16"))
        elif spec.format != Format.PTE and spec.precision.quantized:
            ids.append(self._id("quantize", spec.precision.value))
        jobs = [self.graph.jobs[i] for i in ids if i in self.graph.jobs]
        return round(sum((j.ended or 0) - (j.started or 0) for j in jobs if j.ended and j.started), 3)

    def _slow_indices(self, precision: Precision) -> tuple[list[int] | None, str]:
        """The held-out samples a slow runner scores, and how they were chosen."""
        per = self.per_sample.get(precision.value)
        if self.slow is None or not per or len(per) <= len(self.slow):
            return self.slow, "evenly spread"
        worst = sorted(range(len(per)), key=lambda k: per[k])[:len(self.slow)]
        return sorted(worst), ("the lowest agreement, then SNR, of the ONNX build on ORT CPU"
                               if any(a is not None for a, _ in per) else "the lowest SNR of the ONNX build on ORT CPU")

    # ------------------------------------------------------------------------------------ lower
    def _bind_lower(self, jobs, i: int, src: str):
        from . import work

        spec = self.builds[i]
        states = []
        if spec.format != Format.PTE:
            # the fp32 ONNX (and its rewrite report) first, then the graph this precision lowers from
            states = self._deps_states(jobs, *dict.fromkeys((self._id("export"), src)))
        staging = self.run.store.staging(spec.filename)
        # a job in a process of its own may free the fp32 weights once it holds its converted copy
        consume = jobs[self._id("lower", spec.format.value, spec.precision.value)].fresh
        return work.lower, (self.ref, states, spec, str(staging), consume, self._finalize_at.get(i))

    def _lowered_done(self, job: Job, i: int) -> None:
        spec = self.builds[i]
        self._lowered[i] = {"seconds": (job.ended or time.time()) - (job.started or time.time())}
        if job.error is not None:
            from ..artifacts.store import is_disk_full

            if is_disk_full(job.error):
                raise job.error
            from ..exporters.qnn_diagnose import describe, named

            diagnosis = named(job.error, self.info.get("block_names") or ())   # the node QNN refused
            reason = f"lowering failed: {describe(diagnosis) if diagnosis else short(job.error)}"
            self.entries[i] = _failed(self._entry(spec), self.thresholds[spec.precision], reason,
                                      self._lowered[i]["seconds"])
            if diagnosis:
                self.entries[i]["diagnosis"] = diagnosis
            self._line(job, reason, failed=True)
        else:
            crash_point("lowered")
            self._line(job)
            score = self.graph.jobs.get(self._id("score", spec.format.value, spec.precision.value))
            if score is not None and score.where == "worker" and self.info.get("weight_bytes", 0) >= HEAVY_BYTES:
                from ..memory import runs_alone, step_bytes

                kind = _step_kind(job.result.runner)
                score.memory = step_bytes(kind, self.info["weight_bytes"])
                score.alone, score.fresh = runs_alone(kind, score.memory), True
        self._close(job)

    # ------------------------------------------------------------------------------------ score
    def _bind_score(self, jobs, i: int, lower_id: str):
        from . import work

        runner = jobs[lower_id].result.runner
        jobs[self._id("score", self.builds[i].format.value, self.builds[i].precision.value)].label += f" on {runner.short}"
        chosen, how = self._slow_indices(self.builds[i].precision) if _is_slow(self.builds[i], runner) else (None, "")
        self._lowered[i]["samples"], self._lowered[i]["chosen"] = chosen, how
        self._lowered[i]["submitted"] = time.time()
        return work.score, (runner, self.ref, self._lowered[i]["samples"])

    def _onnx_score(self, spec: BuildSpec) -> tuple[str, ...]:
        """A QNN build's score waits for the ONNX build's score of its precision, when there is one: past
        HEAVY_BYTES the simulator scores the held-out samples that ONNX build scored worst on ORT CPU
        (_slow_indices), which are known only then (without the wait, a QNN score bound first took
        evenly spread samples: the 0.6B talker prefill's w8a16-mixed context binary, 30.5 dB on samples
        0 and 3 where its worst two on ORT, 0 and 2, gave 28.9 dB)."""
        if spec.format not in (Format.DLC, Format.CTX):
            return ()
        if not any(b.format == Format.ONNX and b.precision == spec.precision for b in self.builds):
            return ()
        return (self._id("score", Format.ONNX.value, spec.precision.value),)

    def _bind_shared(self, jobs, i: int, deps: tuple):
        """A DLC's score: its context binary's run (the same QNN graph from the same source and options)."""
        runner = jobs[deps[0]].result.runner
        jobs[self._id("score", self.builds[i].format.value, self.builds[i].precision.value)].label += f" on {runner.short}"
        return _shared_outputs, (jobs[deps[1]].result,)

    def _scored(self, job: Job, i: int) -> None:
        from ..artifacts.samples import keep_audio
        from ..runtime.runners import proxy_verdict

        spec = self.builds[i]
        if self.entries[i] is not None:           # lowering failed: already recorded
            self._close(job)
            return
        lower = self.graph.jobs[self._id("lower", spec.format.value, spec.precision.value)]
        built, entry = lower.result, self._entry(spec)
        threshold = self.thresholds[spec.precision]
        if built is None:
            # failed before its own lowering ended: a DLC whose context binary (the run it shares)
            # failed to compile or to run while the DLC was still waiting to be compiled
            error = f"runner failed: {short(job.error)}"
            self.entries[i] = _failed(entry, threshold, error, 0.0)
            self._line(job, error, failed=True)
            self._close(job)
            return
        runner = built.runner
        shared = job.kind == "score-shared"
        if shared:
            entry["outputs_from"] = Format.CTX.value
            ctx_i = self.builds.index(self._ctx_sibling(spec))
            self._lowered[i]["samples"] = self._lowered.get(ctx_i, {}).get("samples")
            self._lowered[i]["chosen"] = self._lowered.get(ctx_i, {}).get("chosen")
            self._lowered[i]["submitted"] = job.started
        samples = self._lowered[i].get("samples")
        t_lower = self._lowered[i]["seconds"]
        if job.error is not None:
            from ..exporters.qnn_diagnose import run_failure

            error = run_failure(short(job.error), runner.kind, self.run.opts.htp_finalize)
            self.run.store.commit(built.files, accepted=False)
            self.entries[i] = _failed(entry, threshold, error, t_lower, runner=runner.to_json())
            self._line(job, error, failed=True)
            self._close(job)
            return
        outputs = job.result
        reference, ins = self._heldout(samples)
        verdict = self._judge(spec.precision, reference, ins, outputs)
        text = _headline(verdict, self.component.gated_outputs) + (" — shares the ctx's run" if shared else "")
        self._line(job, text, failed=not verdict.accepted, seconds=None if shared else getattr(outputs, "wall_s", None))
        records = self.run.store.commit(built.files, verdict.accepted)
        parity = {"runner": runner.to_json(), "threshold_db": verdict.threshold_db, "verdict": verdict.status,
                  "reason": verdict.reason, "outputs": [s.to_json() for s in verdict.scores],
                  "samples": len(reference)}
        proxy = proxy_verdict(runner, spec.precision.value)
        if proxy:
            parity["proxy"] = proxy
        if samples is not None:
            how = self._lowered[i].get("chosen") or "evenly spread"
            parity["heldout_indices"] = list(samples)         # which held-out samples this runner scored
            parity["samples_note"] = (f"{len(reference)} of {self.info['heldout']['count']} held-out samples (indices {samples}, {how}): "
                                      f"a slow runner on a graph past {HEAVY_BYTES >> 20} MB of weights (--sim-samples)")
        if spec.format == Format.ONNX and samples is None and self.slow is not None:
            per = self.per_sample[spec.precision.value] = [
                _sample_key(self._judge(spec.precision, [r], None if ins is None else [ins[k]], [o]),
                            self.component.gated_outputs)
                for k, (r, o) in enumerate(zip(reference, outputs))]
            parity["per_sample_snr_db"] = [round(x, 3) if abs(x) != float("inf") else None for _, x in per]
            if any(a is not None for a, _ in per):
                parity["per_sample_agreement"] = [None if a is None else round(a, 6) for a, _ in per]
        entry.update({
            "status": verdict.status,
            "files": [r.to_json() for r in records],
            "parity": parity,
            "details": built.details,
            "samples": keep_audio(self.run.store.put_bytes, f"{spec.component}-{spec.format.value}-{spec.precision.value}",
                                  outputs, self.component.audio_outputs),
            "timings": {"lower_s": round(t_lower, 3), "graph_s": self._graph_seconds(spec),
                        "run_wait_s": round(time.time() - (self._lowered[i].get("submitted") or job.started), 3)},
        })
        self.entries[i] = entry
        self._close(job)

    def _heldout(self, samples: list[int] | None) -> tuple[list[dict], list[dict] | None]:
        """The fp32 references of held-out samples `samples` (None: all), and their inputs when the
        component's row sums need them (RowSum.picks may be inputs)."""
        from .work import _mapped

        refs = list(_mapped(self.ref, "reference", self.info["output_names"]))
        ins = list(_mapped(self.ref, "heldout", self.info["input_names"])) if self.component.row_sums else None
        if samples is None:
            return refs, ins
        return [refs[k] for k in samples], None if ins is None else [ins[k] for k in samples]

    def _judge(self, precision: Precision, refs: list[dict], ins: list[dict] | None, outputs: list[dict]):
        """The gate's verdict on a build's outputs: scored against the fp32 references `refs`, the
        component's row sums also against their tables (the checkpoint's, kept from the trace)."""
        from ..parity.gate import judge, top1_gate
        from ..parity.metrics import score_outputs

        c = self.component
        scores = score_outputs(self.info["output_names"], refs, outputs, self.info["logits"], c.tie_margins,
                               c.row_sums, ins, self.row_tables)
        return judge(scores, self.thresholds[precision], c.gated_outputs, agreement_min=c.agreement_min,
                     top1_min=top1_gate(c.top1_min, precision))

    # ------------------------------------------------------------------------------------ attribution
    def _add_attribution(self, p: Precision, on_cpu: bool, only: str | None = None,
                         on_target: tuple[str, ...] = ()) -> None:
        from . import work

        deps = (self._id("trace"),) + self._judged_by(p)
        self._sized(self._add(Job(self._id("attribute", p.value), "attribute", deps,
                      label=f"{self.name}: per-block fidelity, {p.value}" + (" (ORT CPU" if on_cpu else "")
                      + (f"; {', '.join(on_target)} on the target's runner" if on_cpu and on_target else "")
                      + (")" if on_cpu else "") + (f", block {only}" if only else ""),
                      bind=lambda jobs: (work.attribute, (self.ref, [], p.value, on_cpu, ATTRIBUTION_SAMPLES, only,
                                                          on_target)),
                      done=lambda job: self._attributed(job, p),
                      fresh=self.info.get("weight_bytes", 0) >= HEAVY_BYTES)))      # held on the memory gate

    def _attributed(self, job: Job, p: Precision) -> None:
        if job.error is not None:
            self.attribution[p.value] = [{"block": "*", "snr_db": None, "error": short(job.error)}]
        elif job.result:
            self.attribution[p.value] = job.result
        self._line(job)
        self._close(job)

    def _judged(self, p: Precision, formats: tuple[Format, ...] | None = None) -> list[dict] | None:
        """The entries of `p`'s ONNX-family builds (what attribution and repair read; of `formats` only,
        when given) once every one of them is judged, else None. A precision's follow-ups start then,
        not when the component's last job ends: at 0.6B, Code2Wav's w8a16 attribution waited for its
        fp16 .pte lowering and simulator runs, and ran at the build's end with one core idle."""
        mine = [e for b, e in zip(self.builds, self.entries) if b.precision == p and b.format != Format.PTE
                and (formats is None or b.format in formats)]
        return None if not mine or any(e is None for e in mine) else mine

    def _judged_by(self, p: Precision) -> tuple[str, ...]:
        """The finished scoring jobs of `p`'s ONNX-family builds: what a follow-up of `p` (attribution,
        repair) waited for, recorded as its deps so the job graph's record (the what-if view, the next
        run's ETA and priorities) places it after them, not right after the trace."""
        ids = (self._id("score", b.format.value, b.precision.value) for b in self.builds
               if b.precision == p and b.format != Format.PTE)
        return tuple(j for j in ids if j in self.graph.jobs and self.graph.jobs[j].state == "done")

    def _maybe_attribute(self) -> bool:
        """--attribution auto: examine each precision with a rejected ONNX-family build, once that
        precision's ONNX-family builds are judged."""
        if self.run.opts.attribution != "auto" or not self.info.get("block_chain"):
            return False
        started = False
        for p in _attribution_precisions(self.builds):
            mine = self._judged(p) if not p.mixed else None
            if mine is None or self._id("attribute", p.value) in self.graph.jobs:
                continue
            rejected = [e for e in mine if e["status"] == "rejected"]
            if not rejected:
                continue
            # every rejection a QNN compile that named its node: that node's block alone
            blocks = {(e.get("diagnosis") or {}).get("block") for e in rejected}
            only = blocks.pop() if len(blocks) == 1 else None
            located = None if only else _located_failures(mine, p)
            if located:
                self._add_attribution(p, on_cpu=True, on_target=located)
            else:
                self._add_attribution(p, on_cpu=_scored_low_on_cpu(mine, p), only=only)
            started = True
        return started

    # ------------------------------------------------------------------------------------ repair
    def _maybe_repair(self) -> bool:
        """--repair auto: for each quantized precision whose build on the search's runner was rejected,
        once that precision's ONNX-family builds are judged (and, past HEAVY_BYTES, attributed), start
        precision repair (jobs/repair.py); a precision not attributed yet (--no-attribution) gets its
        attribution first. Called as each of the component's jobs ends: it starts each search once."""
        from . import repair as rp

        opts = self.run.opts
        if opts.repair == "off":
            return False
        entries = [e for e in self.entries if e is not None]
        started = False
        for p in sorted({b.precision for b in self.builds if b.precision.quantized and not b.precision.mixed},
                        key=list(Precision).index):
            primary = rp.search_primary(self.builds, p, self._htp())
            # the search reads the ONNX's and its runner's builds only: at 0.6B the talker prefill's
            # repair waited 480 s for its w8a16 DLC, lowered late though its score is the context binary's
            if p.value in self.repair or primary is None or self._judged(p, (Format.ONNX, primary)) is None:
                continue
            if not rp.wants_repair(entries, p, primary):
                continue
            heavy = self.info.get("weight_bytes", 0) >= HEAVY_BYTES
            if heavy and not self.info.get("block_chain"):
                # no per-block attribution without a BlockChain, and one quantization per block of a
                # 0.6B graph is minutes: the rejected build's own scores rank the modules that make
                # its outputs (a transformer layer for its KV outputs)
                rows = self._output_rows(entries, p, primary)
                ranked_by = "outputs"
                if not rows:
                    self.repair[p.value] = {"steps": [], "result": None, "order": [], "budget": opts.repair_steps,
                                            "ranked_by": ranked_by,
                                            "stopped": "its fp32 ONNX could not be read to map its outputs to modules"
                                            if rows is None else "no scored output of the rejected build is made "
                                                                 "inside a module of the graph: nothing to raise"}
                    continue
            elif heavy:     # real-size graphs: the block-alone attribution ranks (one quantization per block
                rows = self.attribution.get(p.value)    # of a 0.6B graph is minutes)
                ranked_by = "attribution"
                if rows is None:
                    if self._id("attribute", p.value) not in self.graph.jobs:
                        self._add_attribution(p, on_cpu=_scored_low_on_cpu(self._judged(p, (Format.ONNX, primary)), p))
                        started = True
                    continue
                rows = [{**r, "index": f"blocks.{i}"} for i, r in enumerate(rows)]
            else:
                rows = self.sensitivity.get(p.value)
                ranked_by = "sensitivity"
                if rows is None:
                    if self._id("sensitivity", p.value) not in self.graph.jobs:
                        self._add_sensitivity(p)
                        started = True
                    continue
            finding, per_channel, first = None, False, None
            if ranked_by == "outputs":      # by the noise each module adds, and whether the budget can pass
                order, _ = rp.by_added_noise(rows, self.thresholds[p], opts.repair_steps)
                # a transformer's MatMul weights are per tensor on the QNN EP: the first step quantizes its
                # linears per output channel (still every weight 8-bit; the 0.6B talker prefill's w8a16
                # context binary: 26.4 -> 28.9 dB), the next raise the modules the estimate needs
                per_channel = not self.component.per_channel_linears and p.base != Precision.W4A16
                sel, finding = rp.to_reach(rows, self.thresholds[p])
                # and raises a module to 16-bit weights, not float: a float island runs in fp16 on the
                # HTP without the fp16 graph's safe forms (0.6B talker prefill, five layers in float:
                # 21.3 dB on the simulator where ORT CPU gave 34.6; at 16-bit weights: 30.7 dB)
                first = [] if per_channel else sel
            else:
                order = rp.block_order(rows)
            self.repair[p.value] = {"runner": "qnn-htp" if primary in (Format.CTX, Format.DLC) else "ort-cpu",
                                    "ranked_by": ranked_by,
                                    **({"estimate": finding} if finding and "worst" in finding else {}),
                                    **({"sensitivity": [{k: r[k] for k in ("block", "snr_db", "error") if k in r}
                                                        for r in rows]} if ranked_by == "sensitivity" else {}),
                                    **({"outputs": [{k: r[k] for k in ("block", "snr_db", "outputs") if k in r}
                                                    for r in rows]} if ranked_by == "outputs" else {}),
                                    "order": [rows[i]["block"] for i in order], "budget": opts.repair_steps,
                                    **({"per_channel": True} if per_channel else {}),
                                    "raise": rp.raise_for(p.base, ranked_by),
                                    "steps": [], "result": None, "_order": [rows[i]["index"] for i in order]}
            if first is not None:
                self.repair[p.value]["_next"] = ([rows[i]["index"] for i in first], [rows[i]["block"] for i in first])
            if not order or opts.repair_steps < 1:
                self.repair[p.value]["stopped"] = "no block to keep" if not order else "--repair-steps 0"
                continue
            if finding and finding.get("futile") and not per_channel:
                # each step is a quantization, a compile and simulator runs of a 0.6B graph: minutes
                # spent to confirm what the scores already say
                self.repair[p.value]["stopped"] = _futile(finding, self.thresholds[p], "no step run",
                                                          how=_raised_how(self.repair[p.value]))
                continue
            self._add_repair_step(p)
            started = True
        return started

    def _output_rows(self, entries: list[dict], p: Precision, primary: Format) -> list[dict] | None:
        """Ranking rows from the rejected `primary` build's per-output scores: per module that makes a
        scored output (exporters.onnx.output_scopes), that output's SNR (the worst of its outputs),
        in graph order (where the graph first reaches the module). Outputs outside gated_outputs, when
        the component names some, are left out. A graph that cannot be read ranks nothing (no repair)."""
        e = next(e for e in entries if e["precision"] == p.value and e["format"] == primary.value)
        return self._module_rows((e.get("parity") or {}).get("outputs") or [])

    def _module_rows(self, outputs: list[dict]) -> list[dict] | None:
        """Per module that makes one of these scored outputs (parity output records), its worst SNR."""
        from ..exporters.onnx import output_scopes, scope_nodes

        src = ((self.states.get(self._id("export")) or {}).get("onnx") or {}).get("fp32")
        if not src:
            return []
        try:
            where = output_scopes(Path(src))
            first = {scope: i for i, scope in enumerate(scope_nodes(Path(src)))}    # first reached, topologically
        except Exception as err:        # a diagnosis: it may fail, never the build (an unreadable graph)
            from ..artifacts.store import is_disk_full

            if is_disk_full(err):
                raise
            return None
        gated = set(self.component.gated_outputs or ())
        rows: dict[str, dict] = {}
        for sc in outputs:
            block = where.get(sc["name"])
            if block is None or (gated and sc["name"] not in gated):
                continue
            db, finite = sc.get("snr_db"), sc.get("finite", True)
            row = rows.setdefault(block, {"block": block, "index": block, "snr_db": db, "outputs": []})
            row["outputs"].append(sc["name"])
            if finite is False:
                row["finite"] = False
            if db is not None and (row["snr_db"] is None or db < row["snr_db"]):
                row["snr_db"] = db
        return sorted(rows.values(), key=lambda r: first.get(r["block"], len(first)))

    def _add_sensitivity(self, p: Precision) -> None:
        from . import work

        export = self._id("export")
        names = self.info.get("block_names") or []

        def done(job: Job) -> None:
            rows = []
            if job.error is not None:
                rows = [{"block": "*", "index": "", "snr_db": None, "error": short(job.error)}]
            for r in job.result or []:
                key = r["block"]              # a BlockChain's blocks.<i> is shown by its block's name
                i = int(key[7:]) if key.startswith("blocks.") and key[7:].isdigit() else None
                rows.append({**r, "block": names[i] if i is not None and i < len(names) else key, "index": key})
            self.sensitivity[p.value] = rows
            self._line(job, "failed: " + rows[0]["error"] if job.error is not None else "", failed=job.error is not None)
            self._close(job)

        self._add(Job(self._id("sensitivity", p.value), "repair", (export,) + self._judged_by(p),
                      label=f"{self.name}: per-block sensitivity, {p.value} (each block alone quantized, ORT CPU)",
                      bind=lambda jobs: (work.sensitivity, (self.ref, self._deps_states(jobs, export), p.value,
                                                            ATTRIBUTION_SAMPLES + 1, tuple(self.component.gated_outputs))),
                      done=done))

    def _htp(self) -> bool:
        return self.run.opts.target.has_htp and self.run.opts.target.place(self.name).unit == "htp"

    def _add_repair_step(self, p: Precision) -> None:
        from . import work

        search = self.repair[p.value]
        k = len(search["steps"]) + 1
        if k in search.get("_kept", {}):        # the step again, at another HTP finalization mode
            blocks, names = search["_kept"][k]
        elif "_next" in search:         # the modules the estimate chose (output-ranked searches)
            blocks, names = (list(x) for x in search.pop("_next"))
        else:                           # one more block per step, in the ranking's order
            blocks, names = search["_order"][:k], [search["order"][i] for i in range(k)]
        search.setdefault("_kept", {})[k] = (blocks, names)
        per_channel = bool(search.get("per_channel"))
        width = RAISES[search.get("raise", "float")]
        # the samples the rejected build was judged on (on the simulator: those its ONNX scored worst)
        indices = self._slow_indices(p)[0] if search["runner"] == "qnn-htp" else None
        search["_indices"] = indices
        export = self._id("export")
        finalize = search.get("htp_optimization")         # set once a step crashed QNN at --htp-optimization 1
        jid = self._id("repair", p.value, k, *((f"htp-optimization-{finalize}",) if finalize else ()))
        # after the step before it, or the ranking it follows (recorded, as _judged_by)
        before = self._id("repair", p.value, k - 1) if k > 1 else \
            self._id("attribute" if search["ranked_by"] == "attribution" else "sensitivity", p.value)
        after = (before,) if before in self.graph.jobs and self.graph.jobs[before].state == "done" else ()
        self._sized(self._add(Job(jid, "repair", (export,) + after,
                      label=f"{self.name}: repair {p.value}, step {k}: "
                            + (f"{', '.join(names)} at {width}-bit weights" if names and width else
                               f"keep {', '.join(names)} in float" if names else "")
                            + (" (linears per channel)" if per_channel and names else
                               "linears per output channel" if per_channel else "")
                            + (f" (--htp-optimization {finalize})" if finalize else ""),
                      bind=lambda jobs, k=k: (work.repair_step, (self.ref, self._deps_states(jobs, export),
                                                                 p.repaired().value, blocks, f"s{k}",
                                                                 search["runner"], indices, per_channel,
                                                                 search.get("raise", "float"), finalize)),
                      done=lambda job, p=p, k=k: self._repair_stepped(job, p, k),
                      fresh=self.info.get("weight_bytes", 0) >= HEAVY_BYTES)))      # held on the memory gate

    def _repair_stepped(self, job: Job, p: Precision, k: int) -> None:
        from . import repair as rp

        search = self.repair[p.value]
        kept_idx, names = search.get("_kept", {}).get(k) or (search["_order"][:k], search["order"][:k])
        how = search.get("raise", "float")
        row = {"step": k, **rp.raised(how, names),
               "seconds": round((job.ended or 0) - (job.started or 0), 3),
               **({"scheme": PER_CHANNEL} if search.get("per_channel") else {}),
               **({"htp_optimization": search["htp_optimization"]} if search.get("htp_optimization") else {})}
        if job.error is not None:
            from ..exporters.qnn_diagnose import CRASH_HINT, FALLBACK_FINALIZE

            died = isinstance(job.error, WorkerDied) and search["runner"] == "qnn-htp" \
                and str(search.get("htp_optimization") or self.run.opts.htp_finalize) == "1"
            if died:
                # QNN's fast graph preparation crashed the simulator (qnn_diagnose.CRASH_HINT): the same
                # step, and every later one, compiles at QNN's default preparation instead
                search["htp_optimization"] = FALLBACK_FINALIZE
                search["htp_optimization_why"] = f"step {k} crashed the HTP simulator at --htp-optimization 1 ({short(job.error)})"
                self._line(job, f"{short(job.error)}; the step runs again at --htp-optimization {FALLBACK_FINALIZE} "
                                f"({CRASH_HINT})", failed=True)
                self._add_repair_step(p)
                self._close(job)
                return
            row.update({"snr_db": None, "error": short(job.error)})
            search["steps"].append(row)
            search["stopped"] = f"step {k} failed: {row['error']}"
            self._line(job, row["error"], failed=True)
            self._close(job)
            return
        result = job.result
        outputs = result.pop("outputs")
        verdict = self._judge(p, *self._heldout(search.get("_indices")), outputs)
        from ..artifacts.scores import min_snr_db

        db = min_snr_db([s.to_json() for s in verdict.scores], self.component.gated_outputs)
        row.update({"snr_db": None if db is None else round(db, 3), "verdict": verdict.status,
                    "reason": verdict.reason, "samples": len(outputs),
                    "integer_share": rp.integer_share(result.get("weight_bits") or {}),
                    "base_share": rp.base_share(result.get("weight_bits") or {}, p.base),
                    "weight_bits": result.get("weight_bits"), "kept_nodes": result.get("kept_nodes")})
        search["steps"].append(row)
        share = row["integer_share"]
        self._line(job, _headline(verdict, self.component.gated_outputs) + _shares(row, p.base), failed=not verdict.accepted)
        # an integer raise of every weight: that is a wider precision's weights, not a build of this one
        narrowed = RAISES[how] is not None and row["base_share"] == 0
        base_bits = 4 if p.base == Precision.W4A16 else 8
        if verdict.accepted and share == 0:
            # every weight back in float: a variant of nothing quantized is the fp16 build again, not a repair
            row["note"] = "passes with no weight quantized"
            search["stopped"] = (f"step {k} passes only with every weight back in float ({', '.join(names)}): "
                                 f"not a quantized build")
        elif verdict.accepted and narrowed:
            row["note"] = f"passes with no weight left at {base_bits} bits"
            search["stopped"] = (f"step {k} passes only with every weight at {RAISES[how]} bits ({', '.join(names)}): "
                                 f"no weight left at {base_bits} bits, not a {p.base.value} build")
        elif verdict.accepted:
            search["result"] = {"precision": p.repaired().value, "step": k,
                                **rp.raised(how, names),
                                "integer_share": share, "base_share": row["base_share"], "snr_db": row["snr_db"],
                                **({"scheme": PER_CHANNEL} if search.get("per_channel") else {}),
                                **({"htp_optimization": search["htp_optimization"]} if search.get("htp_optimization") else {})}
            self.states[job.id] = result        # its QDQ graph: the source kept for AI Hub (_keep_for_hub)
            self._add_mixed_builds(p, job.id)
        elif search["ranked_by"] == "outputs" and k < search["budget"]:
            # re-estimate from this step's own per-output scores: the modules still to keep in float
            rows = self._module_rows([s.to_json() for s in verdict.scores])
            if not rows:
                search["stopped"] = f"no variant passed within {k} step(s): its outputs map to no module"
            else:
                where = {r["index"]: i for i, r in enumerate(rows)}
                kept = {where[b] for b in kept_idx if b in where}
                sel, finding = rp.to_reach(rows, self.thresholds[p], kept)
                search.setdefault("estimates", []).append({"after_step": k, **finding})
                if finding.get("futile"):
                    search["stopped"] = _futile(finding, self.thresholds[p], f"stopped after step {k}",
                                                f"step {k}'s per-output scores", _raised_how(search))
                else:
                    search["_next"] = (list(kept_idx) + [rows[i]["index"] for i in sel],
                                       list(names) + [rows[i]["block"] for i in sel])
                    self._add_repair_step(p)
        elif search["ranked_by"] != "outputs" and k < min(search["budget"], len(search["_order"])):
            projection = _block_projection(search["steps"], min(search["budget"], len(search["_order"])),
                                           self.thresholds[p])
            if projection:
                search["stopped"] = projection
            else:
                self._add_repair_step(p)
        else:
            search["stopped"] = (f"no variant passed within {k} step(s)" +
                                 (" (--repair-steps)" if k >= search["budget"] else " (every block kept)"))
        self._close(job)

    def _add_mixed_builds(self, p: Precision, step_id: str) -> None:
        """The search's result as builds of their own precision, one per ONNX-family format `p` was asked in."""
        mixed = p.repaired()
        self.thresholds[mixed] = self.thresholds[p]
        formats = [b.format for b in self.builds if b.precision == p and b.format in ONNX_FORMATS]
        specs = []
        for f in sorted(formats, key=lambda f: (f == Format.DLC, f != Format.ONNX)):   # ONNX, context binary, DLC
            spec = BuildSpec(self.run.opts.recipe.name, self.name, f, mixed, self.run.opts.target.name)
            self.builds.append(spec)
            self.entries.append(None)
            specs.append((len(self.builds) - 1, spec))
            if self.repair[p.value].get("htp_optimization"):      # compiled as the step that found it was
                self._finalize_at[len(self.builds) - 1] = self.repair[p.value]["htp_optimization"]
        c = self.name
        for i, spec in specs:
            kind = {"ctx": "lower-ctx", "dlc": "lower-dlc"}.get(spec.format.value, "lower")
            lower_id = self._id("lower", spec.format.value, mixed.value)
            self._sized(self._add(Job(lower_id, kind, (step_id,), label=f"{c}: lower {spec.format.value} {mixed.value}",
                                      bind=lambda jobs, i=i: self._bind_lower(jobs, i, step_id),
                                      done=lambda job, i=i: self._lowered_done(job, i))))
            ctx = self._ctx_sibling(spec)
            score_id = self._id("score", spec.format.value, mixed.value)
            if ctx is not None:
                deps = (lower_id, self._id("score", "ctx", mixed.value))
                self._add(Job(score_id, "score-shared", deps, where="driver",
                              label=f"{c}: score {spec.format.value} {mixed.value}",
                              bind=lambda jobs, deps=deps, i=i: self._bind_shared(jobs, i, deps),
                              done=lambda job, i=i: self._scored(job, i)))
            else:
                kind = "score-htp" if spec.format in (Format.DLC, Format.CTX) else "score"
                self._add(Job(score_id, kind, (lower_id,) + self._onnx_score(spec),
                              label=f"{c}: score {spec.format.value} {mixed.value}",
                              bind=lambda jobs, i=i, lower_id=lower_id: self._bind_score(jobs, i, lower_id),
                              done=lambda job, i=i: self._scored(job, i)))

    def _repair_record(self, entries: list[dict]) -> dict:
        """The component record's `repair`: each searched precision's table and result, with the repaired
        builds' sizes against the plain and fp16 builds of the same format."""
        out = {}
        for pv, search in self.repair.items():
            rec = {k: v for k, v in search.items() if not k.startswith("_")}
            if rec.get("result"):
                sizes = {}
                for e in entries:
                    if e["status"] == "rejected" and e["precision"] != pv:
                        continue
                    if e["precision"] in (pv, Precision(pv).repaired().value, "fp16") and e.get("files"):
                        sizes.setdefault(e["format"], {})[e["precision"]] = sum(f["bytes"] for f in e["files"])
                rec["result"]["bytes"] = sizes
            out[pv] = rec
        return out

    # ------------------------------------------------------------------------------------ finish
    def _close(self, job: Job) -> None:
        self.open.discard(job.id)
        # a precision whose ONNX-family builds are all judged starts its attribution and repair now,
        # beside the component's other jobs (repair's ranking runs beside the attribution)
        self._maybe_attribute()
        self._maybe_repair()
        if self.open:
            return
        self._finalize()

    def _finalize(self) -> None:
        entries = [e for e in self.entries if e is not None]
        from ..exporters.qnn_diagnose import precision_notes

        precision_notes(entries)        # did the same graph compile at another precision?
        _link_attribution(entries, self.attribution)
        kept = self._keep_for_hub(entries) if self.ref and self.run.opts.keep_sources else {}
        rewrites = next((s.get("rewrite_report") for s in self.states.values() if s.get("rewrite_report")), [])
        # The intermediate graphs are done with: at 1.7B a talker graph's come to ~12 GB.
        shutil.rmtree(self.work, ignore_errors=True)
        self.timings["total_s"] = round(time.time() - self.t0, 3)
        info, c = self.info, self.component
        self.record = {
            "accepted": any(e["status"] == "accepted" for e in entries),
            "inputs": info.get("inputs", []), "outputs": info.get("outputs", []),
            "calibration": info.get("calibration"), "heldout": info.get("heldout"),
            **({"capture": {"cache": "hit" if cc["hit"] else cc.get("store", "off"), "key": cc["key"]}}
               if (cc := info.get("capture")) else {}),
            "weight_bytes": info.get("weight_bytes"),
            **({"fp32_on_cpu": c.fp32_on_cpu} if c.fp32_on_cpu else {}),
            "agreement_min": c.agreement_min,
            **({"top1_min": {p.value: v for p, v in c.top1_min.items()}} if c.top1_min else {}),
            "tie_margins": dict(c.tie_margins),
            **({"row_sums": {o: {"picks": list(r.picks), "own": r.own} for o, r in c.row_sums.items()}}
               if c.row_sums else {}),
            **({"limits": dict(c.limits)} if c.limits else {}),
            "parity_inputs": info.get("parity_inputs"),
            **kept,
            "rewrites": rewrites,
            "attribution": self.attribution,
            **({"repair": self._repair_record(entries)} if self.repair else {}),
            "gated_outputs": list(c.gated_outputs),
            "logits": info.get("logits", []),
            "samples": info.get("samples", []),
            "timings": self.timings,
        }
        self.run.component_done(self)

    def partial_record(self) -> dict:
        """What the end-to-end rows need of a component still building: its traced I/O and weights."""
        c = self.component
        return {"accepted": any(e is not None and e["status"] == "accepted" for e in self.entries),
                "inputs": self.info.get("inputs", []), "outputs": self.info.get("outputs", []),
                "weight_bytes": self.info.get("weight_bytes"),
                **({"fp32_on_cpu": c.fp32_on_cpu} if c.fp32_on_cpu else {})}

    def _keep_for_hub(self, entries: list[dict]) -> dict:
        """sources/ and the calibration inputs AI Hub compiles accepted builds from (artifacts/inputs.py)."""
        from ..artifacts import inputs
        from ..exporters.onnx import inline_copy
        from .work import _mapped

        keys, quantized = inputs.hub_sources(self.run.opts.target, entries)
        made = {k: Path(v) for s in self.states.values() for k, v in s.get("onnx", {}).items()}
        sources = {}
        for key in keys:
            src = made.get(key)
            one = inline_copy(src, src.with_name(src.stem + ".inline.onnx")) if src else None
            sources[key] = one if one is not None else {
                "error": "the ONNX is past 2 GB with external data, which is not kept for AI Hub yet" if src
                else "its intermediate graph was not made"}
        calibration = _mapped(self.ref, "calibration", self.info["input_names"])
        return inputs.keep_for_hub(self.run.store, self.run.opts.recipe.name, self.run.opts.target, self.name,
                                   sources, calibration, quantized)

    # ------------------------------------------------------------------------------------ helpers
    def _entry(self, spec: BuildSpec) -> dict:
        from ..targets import place_build

        place = place_build(self.run.opts.target, spec.component, spec.precision, bool(self.component.fp32_on_cpu))
        e = {"name": spec.name, "component": spec.component, "format": spec.format.value,
             "precision": spec.precision.value, "target": spec.target,
             "placement": {"unit": place.unit, "by": place.by}}
        search = self.repair.get(spec.precision.base.value) if spec.precision.mixed else None
        if search and search.get("result"):
            e["repair"] = {"from": spec.precision.base.value, "kept_float": search["result"]["kept_float"],
                           **{k: search["result"][k] for k in RAISED_KEY.values()
                              if k != "kept_float" and search["result"].get(k)},
                           "integer_share": search["result"].get("integer_share"),
                           "base_share": search["result"].get("base_share"),
                           **({"scheme": search["result"]["scheme"]} if search["result"].get("scheme") else {})}
        return e

    def _line(self, job: Job, text: str = "", failed: bool = False, label: str | None = None,
              seconds: float | None = None) -> None:
        from ..progress import StageNote

        note = StageNote()
        note.text, note.failed = "; ".join(filter(None, (text, "cached (a killed run's job)" if job.cached else ""))), failed
        note.seconds = seconds if seconds is not None else (job.ended or time.time()) - (job.started or time.time())
        self.run.progress.job_finished(label or job.label, note)


def _sample_key(verdict, gated) -> tuple:
    """One held-out sample's verdict as (lowest gated agreement or None, lowest gated SNR): sorted,
    the samples a build scored worst come first (a flipped decision before any SNR)."""
    mine = [s for s in verdict.scores if not gated or s.name in gated]
    agree = [s.agreement for s in mine if s.agreement is not None]
    snrs = [s.snr_db if s.finite else float("-inf") for s in mine if s.agreement is None]
    return (min(agree) if agree else None, min(snrs) if snrs else float("inf"))


def _shared_outputs(outputs):
    return outputs


def _failed(entry: dict, threshold: float, reason: str, seconds: float, runner: dict | None = None) -> dict:
    entry.update({"status": "rejected", "files": [], "error": reason,
                  "parity": {"runner": runner, "threshold_db": threshold, "verdict": "rejected",
                             "reason": reason, "outputs": []},
                  "details": {}, "timings": {"lower_s": round(seconds, 3)}})
    return entry


def _headline(verdict, gated) -> str:
    """A verdict in a few words: `41.2 dB, accepted` (the lowest gated SNR) or `rejected: <reason>`."""
    snrs = [s.snr_db for s in verdict.scores
            if (not gated or s.name in gated) and s.agreement is None and s.finite]
    if verdict.accepted and snrs:
        return f"{min(snrs):.1f} dB, accepted"
    return f"{verdict.status}: {verdict.reason}"


def _is_slow(spec: BuildSpec, runner) -> bool:
    return runner.kind == "qnn-htp" or (runner.kind == "executorch" and spec.precision == Precision.W8A16)


def _step_kind(runner) -> str:
    """The memory.STEP_FACTORS entry of a scoring run: the simulator loading a compiled context binary
    needs less than one compiling its source ONNX."""
    if runner.kind == "qnn-htp" and runner.model.endswith(".ctx.onnx"):
        return "qnn-htp-ctx"
    if runner.lean:
        return "ort-cpu-lean"
    return runner.kind


def _weight_bytes(module) -> int:
    from ..memory import tensor_bytes

    return tensor_bytes(list(module.parameters()) + list(module.buffers()))


def _attribution_precisions(builds) -> list[Precision]:
    return sorted({b.precision for b in builds if b.format != Format.PTE}, key=list(Precision).index)


def _scored_low_on_cpu(entries: list[dict], precision: Precision) -> bool:
    """The ONNX build at this precision ran on ORT CPU and scored below its gate, and every other
    build at this precision lowered and ran: the loss is the quantization's own, and ORT shows where
    it happens as the HTP simulator does, at a fraction of the time (real-size Code2Wav w8a16: 11
    blocks, 670 s on the simulator). A build that failed to compile or run keeps the attribution on
    the target's runner: lowering each block alone there names the block that fails (how Code2Wav's
    QNN_COMMON_ERROR_MEM_ALLOC was traced to its last DecoderBlock)."""
    mine = [e for e in entries if e["precision"] == precision.value]
    return (any(e["format"] == "onnx" and e["status"] == "rejected" and not e.get("error") for e in mine)
            and not any(e.get("error") for e in mine))


PER_CHANNEL = "linears per output channel"


def _shares(row: dict, base: Precision) -> str:
    """A repair step's weight bytes: the share still quantized, and at the base width when less."""
    share, at_base = row.get("integer_share"), row.get("base_share")
    if share is None:
        return ""
    width = "4" if base == Precision.W4A16 else "8"
    return (f"; {100 * share:.0f} % of weight bytes still quantized"
            + (f" ({100 * at_base:.1f} % at {width} bits)" if at_base is not None and at_base < share else ""))


def _block_projection(steps: list[dict], last: int, gate_db: float) -> str | None:
    """Why a block-ranked search (one more block per step) stops before its budget, or None: after two
    steps or more, the steps left up to `last` at the mean gain of the steps so far would not reach the
    gate. The 0.6B code2wav_n2 at w8a16 (f6301f5): 26.0, 26.9, 27.6, 28.8 dB over its four steps
    (~85 s each); after step 2 this projects 28.7 dB. The demo Code2Wav's 27.2, 29.1 project 32.9 dB
    and its step 3 passes (30.5 dB)."""
    scored = [r["snr_db"] for r in steps]
    if len(scored) < 2 or any(db is None for db in scored):
        return None
    gain = (scored[-1] - scored[0]) / (len(scored) - 1)
    left = last - len(scored)
    reach = scored[-1] + left * max(gain, 0.0)
    if reach >= gate_db:
        return None
    return (f"stopped after step {len(scored)}: at the {gain:.1f} dB a step has gained so far, the {left} "
            f"step(s) left (--repair-steps) would reach about {reach:.1f} dB, under the {gate_db:.0f} dB gate")


def _raised_how(search: dict) -> str:
    """How a search raises a module, in words ("at 16-bit weights", "in float")."""
    width = RAISES[search.get("raise", "float")]
    return f"at {width}-bit weights" if width else "in float"


def _futile(finding: dict, gate_db: float, what: str, source: str = "the rejected build's per-output scores",
            how: str = "at 16-bit weights") -> str:
    """Why an output-ranked repair search stops (jobs/repair.to_reach found no set of modules that can pass)."""
    if not finding.get("kept"):
        return f"{what}: no module left to raise that could lift {finding.get('worst', 'its worst output')}"
    return (f"the loss accumulates over the graph's modules: the {len(finding['kept'])} that add the most noise "
            f"before {finding['worst']} ({', '.join(finding['kept'])}) {how} would lift its worst output from "
            f"{finding['worst_db']:.1f} to about {finding['estimate_db']:.1f} dB (estimated from {source}), under "
            f"the {gate_db:.0f} dB gate, and more than that raises most of the graph: {what}")


def _located_failures(entries: list[dict], precision: Precision) -> tuple[str, ...] | None:
    """The blocks of this precision's failed lowerings, when every failure's diagnosis names one (the
    node QNN refused, or a finalize failure's likely node: exporters/qnn_diagnose.named) and the ONNX
    build ran on ORT CPU and scored below its gate. Then ORT ranks the blocks by their dB loss (the
    quantization's own) and only those blocks are lowered alone on the target's runner, to confirm the
    failure: at 0.6B Code2Wav's w8a16 attribution on the simulator took 291 s for 11 blocks, the last of
    them the one whose context binary fails (QNN_COMMON_ERROR_MEM_ALLOC), which the finalize diagnosis
    already suspects. None: no such failure, or one without a block (attribute on the target as before)."""
    mine = [e for e in entries if e["precision"] == precision.value]
    # a DLC scored by its context binary's run (the same QNN graph) fails with it: the context
    # binary's diagnosis is the DLC's too (0.6B Code2Wav w8a16: "runner failed: code2wav/score/ctx/...")
    ctx_failed = any(e["format"] == "ctx" and e.get("error") for e in mine)
    failed = [e for e in mine if e.get("error") and not (e["format"] == "dlc" and ctx_failed
                                                         and not e.get("diagnosis"))]
    if not failed or not any(e["format"] == "onnx" and e["status"] == "rejected" and not e.get("error") for e in mine):
        return None
    blocks = [(e.get("diagnosis") or {}).get("block") or (e.get("diagnosis") or {}).get("likely_block") for e in failed]
    return None if not all(blocks) else tuple(sorted(set(blocks)))


def _link_attribution(entries: list[dict], attribution: dict) -> None:
    """Name the weakest block in the reason of every rejected build."""
    for e in entries:
        if e["status"] != "rejected":
            continue
        rows = attribution.get(e["precision"], [])
        bad = [r for r in rows if r.get("finite") is False or r.get("error")]
        ok = [r for r in rows if r.get("snr_db") is not None]
        if bad:
            r = bad[0]
            e["parity"]["reason"] += f"; block {r['block']} " + ("has NaN/Inf" if r.get("finite") is False
                                                                else f"failed: {r.get('error')}")
        elif ok:
            r = min(ok, key=lambda r: r["snr_db"])
            e["parity"]["reason"] += f"; weakest block: {r['block']} {r['snr_db']:.1f} dB"
