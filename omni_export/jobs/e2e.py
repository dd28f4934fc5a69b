"""End-to-end rows as jobs of the graph: each runs the recipe's whole-pipeline check in a worker as
soon as the builds it drives are scored, beside the rest of the build.

They are planned once every component's trace is done (their runner depends on the graphs' weight
sizes, `record.e2e_runners`). A job waits only for the scores of the builds it drives: its runner's
format at its precisions, and the fp32 builds a graph kept on the CPU runs. Light models: one job per
precision -- the demo's fp16 row on the HTP simulator runs while the .pte and w8a16 builds are still
lowered. Models with a graph past HEAVY_BYTES: one row job for every precision on ORT CPU (the recipe
computes its fp32 reference pipeline once per job, minutes and GBs at real size). Either way, when the
recipe can merge them, a row job is E2E_PARTS jobs over shares of the held-out prompts.

A job is a plain function of its inputs: the recipe, the checkpoint the driver resolved, the recipe
options, OUT, a snapshot of the manifest with the builds scored so far and the runners. The worker
loads the model itself (weights per graph, safetensors only) and binds to its own core, so the
simulator's spinning thread does not take the other workers' core.
"""
from __future__ import annotations

import json

from ..artifacts.store import STAGING
from ..core import Precision
from ..runtime.graphs import RUNNER_FORMATS
from .graph import Job

# RssAnon of the row's process per byte of the graphs' fp32 weights: the 0.6B row (5.3 GiB of
# weights, read memory-mapped) peaked at 2.14 GiB at 3a3aed8. 3 (as it was) held 16 GB on the gate,
# and no other heavy job could run beside the row.
E2E_MEMORY_FACTOR = 0.6
# A row as this many jobs, each a share of the held-out prompts, when its recipe can merge them
# (Recipe.end_to_end_merge). The demo's w8a16 row waits for every build and repair step and then ran
# 67 s on one core at the end of the build, the other idle (dfe0b01); the 0.6B build's one row for
# every precision ran last the same way (115 s at 4bce34b). Each prompt's fp32 reference is still
# computed once (in the part that holds it).
E2E_PARTS = 2
# No estimate scaled to the weights for the row: it is the graph's last job, and a long one put
# every job feeding ORT CPU (the row's runner at real size) ahead of the simulator's chains.


class EndToEndJobs:
    def __init__(self, run, the_plan, graph):
        self.run, self.plan_, self.graph = run, the_plan, graph
        self.rows: list[dict] | None = None           # None: not planned as jobs (finish() decides)
        self.reused = False
        self.runners: dict = {}
        self.note: str | None = None
        self._parts: dict[str, list[dict]] = {}
        self._pieces: dict[str, dict[int, list[dict]]] = {}     # a row's parts so far (E2E_PARTS)

    # ---- plan, once every trace is done
    def plan(self) -> None:
        from . import record

        opts = self.run.opts
        if not opts.recipe.end_to_end or opts.e2e == ():
            return
        snap = self.snapshot(planned=True)
        self.runners = record.e2e_runners(opts, snap)
        if not self.runners:
            self.rows = []
            return
        reused = self.run.cache.reuse_e2e(self.runners)
        if reused is not None:
            self.rows, self.reused = reused, True
            if reused:
                self.run.progress.note("end-to-end parity: every graph unchanged, its rows reused from the cache")
            return
        self.note = record.e2e_runner_note(opts, snap)
        if self.note:
            self.run.progress.note(self.note)
        precisions = sorted({p for ps in self.runners.values() for p in ps}, key=[q.value for q in Precision].index)
        heavy = bool(record.heavy(snap))
        groups = [tuple(precisions)] if heavy else [(p,) for p in precisions]
        parts = E2E_PARTS if opts.recipe.end_to_end_merge else 1
        weights = sum(int(c.get("weight_bytes") or 0) for c in snap["components"].values())
        # the scores of the builds a row drives: its runners' formats at its precisions, and the fp32
        # builds a graph kept on the CPU runs (onnx, or pte for the pte runner)
        fmts = {RUNNER_FORMATS[k][0] for k in self.runners}
        fp32 = {"pte" if k == "pte" else "onnx" for k in self.runners}
        for group in groups:
            # with precision repair on, a quantized row waits for every build and attribution of every
            # component: the last of a component's jobs decides its repair, whose jobs then hold this row
            # (ComponentJobs._hold_e2e) -- a row that started before would run without the repaired builds
            repairs = opts.repair != "off" and any(Precision(p).quantized for p in group)
            deps = tuple(j.id for j in self.graph.jobs.values() if (
                j.kind.startswith("score") and (
                    repairs
                    or (j.id.split("/")[-2] in fmts and j.id.split("/")[-1] in group)
                    or (j.id.split("/")[-2] in fp32 and j.id.split("/")[-1] == "fp32")))
                or (repairs and j.kind == "attribute"))
            runners = {k: tuple(p for p in ps if p in group) for k, ps in self.runners.items()}
            runners = {k: v for k, v in runners.items() if v}
            for k in range(parts):
                part = (k, parts) if parts > 1 else None
                tag = "+".join(group) + (f"/part{k + 1}" if part else "")
                name = "end-to-end/" + tag
                meter = self.run.store.root / STAGING / f"frames-{tag.replace('/', '-')}.json"   # for the heartbeat
                self.run.frame_files[name] = str(meter)
                self.graph.add(Job(name, "e2e", deps, label=f"end-to-end: {', '.join(group)} on {', '.join(runners)}"
                                                            + (f" (prompts part {k + 1} of {parts})" if part else ""),
                                   bind=lambda jobs, r=runners, m=str(meter), part=part: self._bind(r, m, part),
                                   done=lambda job, g=group, part=part: self._done(job, g, part),
                                   memory=int(E2E_MEMORY_FACTOR * weights) if heavy else 0, fresh=heavy,
                                   after_all=True))

    def snapshot(self, planned: bool = False) -> dict:
        """The manifest as far as the build has come: every component's record (finished ones) or its
        traced I/O, and the builds scored so far (`planned`: the planned builds, for choosing runners)."""
        from . import record

        b = self.run
        components, entries = {}, []
        for name in dict.fromkeys(x.component for x in self.plan_.builds):
            if name in b.components:
                components[name] = b.components[name]
                entries += b.entries.get(name, [])
            elif name in b.runs:
                cj = b.runs[name]
                components[name] = cj.partial_record()
                entries += [e for e in cj.entries if e is not None]
        if planned:
            entries = [{"component": x.component, "format": x.format.value, "precision": x.precision.value,
                        "status": "planned"} for x in self.plan_.builds]
        info = (b.loaded_model.info if b.loaded_model is not None else
                (b.previous or {}).get("checkpoint") or b.model().info)   # a resumed run's record may lack it
        return record.manifest(b.opts, info, self.plan_, entries, components, 0.0)

    def _bind(self, runners: dict, meter: str | None = None, part: tuple[int, int] | None = None):
        from . import work

        b = self.run
        return work.end_to_end, (b.opts.recipe.name, b.checkpoint_path(), json.dumps(b.recipe_options),
                                 str(b.store.root), json.dumps(self.snapshot()), runners, meter, part)

    def _done(self, job: Job, group: tuple, part: tuple[int, int] | None = None) -> None:
        from ..progress import StageNote
        from ..recipes import load_callable
        from .record import failed_e2e_row

        failed = job.error is not None
        if failed:
            rows = [failed_e2e_row(self.runners, group, job.error)]
            job.state, job.error = "done", None
        else:
            rows, notes = job.result["rows"], job.result["notes"]
            for n in notes:
                self.run.progress.note(n)
        key = ",".join(group)
        if part is not None:
            # a share of the prompts: the row is scored once every part has come (a failed part fails it)
            got = self._pieces.setdefault(key, {})
            got[part[0]] = (rows, failed)
            if len(got) < part[1]:
                return
            pieces = [got[k] for k in range(part[1])]
            bad = next((r for r, f in pieces if f), None)
            rows = bad if bad is not None else load_callable(self.run.opts.recipe.end_to_end_merge)([r for r, _ in pieces])
        self._parts[key] = rows
        for r in rows:
            note = StageNote()
            note.failed = r.get("verdict") == "rejected"
            note.text = f"{r.get('verdict')}: {r.get('reason', '')}".rstrip(": ")
            note.seconds = (job.ended or 0) - (job.started or 0)
            self.run.progress.job_finished(f"end-to-end: {r.get('precision')} on {r.get('runner')}", note)

    def finished_rows(self) -> list[dict] | None:
        """The rows in runner, precision order, once planned as jobs; None when they were not."""
        if self.rows is not None:
            return self.rows
        if not self._parts and not any(j.kind == "e2e" for j in self.graph.jobs.values()):
            return None
        order = {p.value: i for i, p in enumerate(Precision)}
        rows = [r for part in self._parts.values() for r in part]
        kinds = list(self.runners)
        return sorted(rows, key=lambda r: (kinds.index(r["runner"]) if r.get("runner") in kinds else len(kinds),
                                           order.get(r.get("precision"), len(order))))
