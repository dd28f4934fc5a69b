"""The one generic run: plan -> trace -> lower -> score -> record. No model knowledge lives here."""
from __future__ import annotations

import contextlib
import gc
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .artifacts import manifest as mf
from .artifacts import reproducibility as repro
from .artifacts.store import Store, disk_full, is_disk_full
from .core import BuildSpec, Format, Precision, Recipe, Target, UsageError, Verdict
from .faults import crash_point, interrupt_point
from .memory import ALONE_STEPS
from .qnn_ep import DEFAULT_FINALIZE
from .recipes import load_callable
from .targets import CPU_FP32, UNSUPPORTED_REASON, check_precisions, supports

MIN_CALIBRATION = 4
ATTRIBUTION_SAMPLES = 1   # held-out samples per block: a diagnostic, one is enough
# Graphs past HEAVY_BYTES of weights (real-size language models) are scored on SLOW_SAMPLES
# held-out samples on the slow runners -- the HTP simulator (a 0.6B talker step: 44 s at fp16 alone,
# 60 s fp16 / 100 s w8a16 beside a build's lowering; QNN's finalization mode 2 runs no faster) and
# ExecuTorch's portable kernels (w8a16 .pte) -- and on all of them elsewhere (ORT CPU scores the
# same QDQ / fp16 graph on every sample). --sim-samples overrides.
HEAVY_BYTES = 256 << 20
SLOW_SAMPLES = 2


@dataclass
class RunOptions:
    recipe: Recipe
    target: Target
    out: Path
    checkpoint: Path | None = None
    components: tuple[str, ...] = ()
    precisions: tuple[Precision, ...] = ()
    formats: tuple[Format, ...] = ()
    recipe_options: dict = field(default_factory=dict)
    attribution: str = "auto"      # all | auto (precisions with a rejected build) | off
    rewrites: tuple[str, ...] | None = None     # None: the target's
    force: bool = False
    jobs: int = 2
    gates: dict = field(default_factory=dict)      # Precision -> dB, overrides the recipe's gates
    e2e: tuple[str, ...] | None = None             # runner kinds for end-to-end parity; None: the target's
    sim_samples: int | None = None                 # held-out samples on slow runners; None: auto, 0: all
    htp_finalize: str | None = DEFAULT_FINALIZE    # QNN HTP graph finalization mode (qnn_ep); None: QNN's
    max_memory: int | None = None                  # bytes the build's process tree should stay under; None: what is free


@dataclass
class Plan:
    builds: list[BuildSpec]
    skipped: list[dict]


class StageNote:
    """Set inside a stage, shown on its line when it ends: what it found (`text`, e.g. a build's
    verdict) and, for a stage that only waited on work done elsewhere (a scoring job in a worker),
    that work's own `seconds` instead of the wait."""

    def __init__(self) -> None:
        self.text = ""
        self.failed = False          # what it found is a failure (a rejected build), not an error of the stage
        self.seconds: float | None = None


class Progress:
    """Stage reporting; the CLI swaps in a rich console, tests keep this silent one. A stage yields
    a StageNote (or None, for reporters that show no results)."""

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        yield StageNote()

    def note(self, text: str) -> None:
        pass


@dataclass
class Result:
    manifest: dict
    exit_code: int
    out: Path


# --------------------------------------------------------------------------------------------- plan

def plan(opts: RunOptions, available: tuple[str, ...] | None = None) -> Plan:
    """Builds for the requested (or all available) components x precisions x formats."""
    comps = opts.components or tuple(c.name for c in opts.recipe.components
                                     if available is None or c.name in available)
    for c in comps:
        opts.recipe.component(c)
        if available is not None and c not in available:
            halves = [h for h in (f"{c}_part1", f"{c}_part2") if h in available]
            hint = (f" ({c} is split in two here, as the recipe's options chose: --components "
                    f"{','.join(halves)})" if halves else "")
            raise UsageError(f"this checkpoint has no {c}; its components: {', '.join(available)}{hint}")
    check_precisions(opts.target, opts.precisions or opts.target.default_precisions)
    for f in opts.formats:
        if f not in opts.target.formats:
            raise UsageError(f"target {opts.target.name} does not build {f.value}; its formats: "
                             f"{', '.join(x.value for x in opts.target.formats)}")
    builds, skipped = [], []
    for c in comps:
        place = opts.target.place(c)          # the unit this component runs on, and what it builds
        opt_in = opts.recipe.component(c).opt_in_formats
        default = place.precisions + tuple(x for x in opts.recipe.also_attempt
                                           if x in place.runs and x not in place.precisions)
        for p in opts.precisions or default:
            for f in opts.formats or place.formats:
                if f not in place.formats:
                    skipped.append({"component": c, "format": f.value, "precision": p.value,
                                    "reason": f"{c} runs on the {place.unit_name} on {opts.target.name}, "
                                              f"which takes {', '.join(x.value for x in place.formats)}"})
                elif p not in place.runs:
                    skipped.append({"component": c, "format": f.value, "precision": p.value,
                                    "reason": f"{c} runs on the {place.unit_name} on {opts.target.name}, "
                                              f"which runs {', '.join(x.value for x in place.runs)}"})
                elif f.value in opt_in and not opts.formats:
                    skipped.append({"component": c, "format": f.value, "precision": p.value,
                                    "reason": f"{opt_in[f.value]} (opt in: --formats {f.value} "
                                              f"--components {c})"})
                elif supports(f, p):
                    builds.append(BuildSpec(opts.recipe.name, c, f, p, opts.target.name))
                else:
                    skipped.append({"component": c, "format": f.value, "precision": p.value,
                                    "reason": UNSUPPORTED_REASON.get(f, "not supported by the format")})
        _plan_fp32_on_cpu(opts, c, place, builds, skipped)
    if not builds:
        raise UsageError("nothing to build: every requested (format, precision) pair is unsupported; "
                         + "; ".join(f"{s['format']}@{s['precision']}: {s['reason']}" for s in skipped[:3]))
    return Plan(builds, skipped)


def _plan_fp32_on_cpu(opts: RunOptions, c: str, place, builds: list, skipped: list) -> None:
    """A graph that must stay fp32 (Component.fp32_on_cpu) gets its fp32 builds next to the others: on
    its own unit when that runs fp32, else on the CPU beside the NPU (targets.CPU_FP32)."""
    component = opts.recipe.component(c)
    if not component.fp32_on_cpu or any(b.component == c and b.precision == Precision.FP32 for b in builds):
        return
    unit = place if Precision.FP32 in place.runs else CPU_FP32
    for f in unit.formats:
        if f not in opts.target.formats or not supports(f, Precision.FP32):
            continue
        why = None
        if opts.formats and f not in opts.formats:
            why = "not among --formats"
        elif f.value in component.opt_in_formats and not opts.formats:
            why = f"{component.opt_in_formats[f.value]} (opt in: --formats {f.value} --components {c})"
        if why:
            skipped.append({"component": c, "format": f.value, "precision": Precision.FP32.value,
                            "reason": f"the fp32 {f.value} build of {c} (run on the {unit.unit_name}): {why}"})
        else:
            builds.append(BuildSpec(opts.recipe.name, c, f, Precision.FP32, opts.target.name))


# --------------------------------------------------------------------------------------------- run

class StageLog(Progress):
    """Wraps a Progress and appends one JSON line per stage start/end to a file (wall-clock
    seconds): OMNI_EXPORT_STAGE_LOG=path. The benchmark harness lines these up with its memory
    samples to attribute the peak to a stage."""

    def __init__(self, inner: Progress, path: str):
        self.inner, self.path = inner, path

    def _log(self, event: str, text: str) -> None:
        import json

        with open(self.path, "a") as f:
            f.write(json.dumps({"t": time.time(), "event": event, "stage": text}) + "\n")

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        self._log("start", text)
        try:
            with self.inner.stage(text) as note:
                yield note
        finally:
            self._log("end", text)

    def note(self, text: str) -> None:
        self.inner.note(text)


class _InterruptPoints(Progress):
    """Every stage start and end is an interrupt point (faults.sigint_latched)."""

    def __init__(self, inner: Progress):
        self.inner = inner

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        interrupt_point()
        with self.inner.stage(text) as note:
            yield note
        interrupt_point()

    def note(self, text: str) -> None:
        self.inner.note(text)


def run(opts: RunOptions, progress: Progress | None = None) -> Result:
    import os

    progress = progress or Progress()
    if os.environ.get("OMNI_EXPORT_STAGE_LOG"):
        progress = StageLog(progress, os.environ["OMNI_EXPORT_STAGE_LOG"])
    progress = _InterruptPoints(progress)
    plan(opts)                                   # flags are checked before any work starts
    store = Store(opts.out)
    try:
        previous = store.begin(opts.recipe.name, opts.target.name, opts.force)
    except OSError as e:
        _raise_if_disk_full(e, opts.out, store.incomplete)
        raise
    if store.recovered is not None:
        progress.note(f"{opts.out}: a previous run (pid {store.recovered.get('pid')}) did not finish; "
                      f"its files are rebuilt or removed")
    try:
        return _run(opts, store, progress, None if store.recovered is not None else previous)
    except BaseException as e:
        _raise_if_disk_full(e, opts.out, store.abort())
        raise


def _raise_if_disk_full(e: BaseException, out: Path, incomplete: bool) -> None:
    """A full disk is the user's to fix: one line, exit 2, wherever the exporters wrapped it."""
    full = disk_full(e)
    if full is not None:
        where = getattr(full, "filename", None) or out
        raise UsageError(f"disk full while writing {where}; free space and rerun"
                         + (f" ({out} is marked incomplete)" if incomplete else "")) from e


def _run(opts: RunOptions, store: Store, progress: Progress, previous: dict | None) -> Result:
    from .artifacts.cache import BuildCache

    started = time.time()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    seeds = repro.seed_everything()
    loader = load_callable(opts.recipe.loader)
    model = None

    def loaded():
        nonlocal model
        if model is None:
            with progress.stage("load checkpoint"):
                model = loader(opts.checkpoint, _recipe_options(opts), opts.out)
            crash_point("loaded")
        return model

    cache = BuildCache(opts, previous, _recipe_options(opts), _rewrites(opts), reuse=not opts.force)
    available = cache.model_components()
    if available is None:
        m = loaded()
        available = m.components() if hasattr(m, "components") else None
    the_plan = plan(opts, available)
    entries: list[dict] = []
    components: dict[str, dict] = {}
    by_comp: dict[str, list[BuildSpec]] = {}
    for b in the_plan.builds:
        by_comp.setdefault(b.component, []).append(b)
    for comp_name, builds in by_comp.items():
        component = opts.recipe.component(comp_name)
        thresholds = {b.precision: _gate(opts, component, b.precision) for b in builds}
        reused = cache.reuse_component(comp_name, builds, thresholds, opts.out)
        if reused is not None:
            components[comp_name], comp_entries = reused
            entries.extend(comp_entries)
            progress.note(f"{comp_name}: {len(comp_entries)} build(s) unchanged, reused from the cache "
                          f"(--force rebuilds)")
            continue
        first = len(entries)
        components[comp_name] = _run_component(opts, loaded(), comp_name, builds, store, entries, progress)
        cache.stamp(comp_name, components[comp_name], entries[first:], builds, thresholds, created)
        release_memory()
    info = model.info if model is not None else previous["checkpoint"]
    manifest = _manifest(opts, info, the_plan, entries, components, time.time() - started)
    manifest["created"] = created
    e2e_runners = _e2e_runners(opts, manifest)
    reused_e2e = cache.reuse_e2e(e2e_runners)
    if not e2e_runners:
        manifest["end_to_end"] = []          # nothing built for a runner the end-to-end check drives
    elif reused_e2e is not None:
        manifest["end_to_end"] = reused_e2e
        if reused_e2e:
            progress.note("end-to-end parity: every graph unchanged, its rows reused from the cache")
    else:
        note = e2e_runner_note(opts, manifest)
        if note:
            progress.note(note)
            manifest["end_to_end_runner_note"] = note
        manifest["end_to_end"] = _end_to_end(opts, loaded(), manifest, e2e_runners, progress)
    manifest["summary"] = _summary(entries, components, manifest["end_to_end"])
    model_seeds = getattr(model, "seeds", {}) if model is not None else {
        k: v for k, v in (previous.get("seeds") or {}).items() if k not in seeds}
    manifest["seeds"] = {**seeds, **model_seeds}
    manifest["reproducibility"] = repro.declared(manifest)
    manifest["cache"] = cache.summary(available or sorted(components), e2e_runners, reused_e2e is not None)
    manifest["timings"]["total_s"] = round(time.time() - started, 3)
    from .reports import write_reports

    with progress.stage("write parity.json, report.md, report.html"):
        write_reports(store.root, manifest, write=store.write_text)
    store.finish(manifest)
    failed = manifest["summary"]["components_without_accepted_build"] or manifest["summary"]["end_to_end_failed"]
    return Result(manifest, 3 if failed else 0, opts.out)


def release_memory() -> None:
    """Free what the last component left (its graphs, programs, weights) and hand the heap's free
    pages back to the OS: glibc keeps freed small blocks (a model's many < 32 MB tensors) in its
    arenas otherwise, and the next component would start from the last one's peak."""
    from .memory import trim_heap

    gc.collect()
    trim_heap()


def _e2e_runners(opts: RunOptions, manifest: dict) -> dict:
    """Runner kind -> precisions for end-to-end parity ({} when the recipe or user skips it)."""
    if not opts.recipe.end_to_end or opts.e2e == ():
        return {}
    kinds = opts.e2e or (("htp",) if opts.target.has_htp and not _heavy(manifest) else ("ort",))
    fmt = {"htp": "ctx", "ort": "onnx", "pte": "pte"}
    order = [p.value for p in Precision]
    runners = {}
    for k in kinds:
        precs = sorted({b["precision"] for b in manifest["builds"] if b["format"] == fmt[k] and not (
            b["precision"] == "fp32" and manifest["components"].get(b["component"], {}).get("fp32_on_cpu"))},
            key=order.index)           # a graph kept at fp32 on the CPU makes no fp32 row of its own
        if precs:
            runners[k] = tuple(precs)
    return runners


def _heavy(manifest: dict) -> list[str]:
    """Components whose graphs are past HEAVY_BYTES of weights: the HTP simulator needs tens of
    seconds per call for them, so end-to-end parity (hundreds of calls) runs on ORT CPU instead."""
    return sorted(c for c, info in manifest["components"].items()
                  if (info.get("weight_bytes") or 0) >= HEAVY_BYTES)


def e2e_runner_note(opts: RunOptions, manifest: dict) -> str | None:
    heavy = _heavy(manifest)
    if opts.e2e or not opts.target.has_htp or not heavy:
        return None
    return (f"end-to-end parity runs on ORT CPU (the fp16 / QDQ ONNX builds): {', '.join(heavy)} "
            f"past {HEAVY_BYTES >> 20} MB of weights take tens of seconds per call on the HTP simulator")


def _end_to_end(opts: RunOptions, model, manifest: dict, runners: dict, progress: Progress) -> list[dict]:
    """Whole-pipeline parity through the built graphs, when the recipe defines it."""
    if not opts.recipe.end_to_end or opts.e2e == ():
        return []
    try:
        return load_callable(opts.recipe.end_to_end)(model, opts.out, manifest, runners, progress)
    except Exception as e:  # a failing runner is a rejected pipeline, recorded with its reason
        return [{"runner": ",".join(runners), "precision": ",".join(sorted({p for v in runners.values() for p in v})),
                 "verdict": "rejected", "reason": f"end-to-end run failed: {_short(e)}"}]


def _rewrites(opts: RunOptions) -> tuple[str, ...]:
    return opts.target.rewrites if opts.rewrites is None else tuple(opts.rewrites)


def _lowering_options(opts: RunOptions, component: str) -> dict:
    """How a component's graphs (and its attribution blocks) are lowered: the target's rewrites and the
    component's QDQ choices."""
    c = opts.recipe.component(component)
    return {"rewrites": _rewrites(opts), "headroom": c.activation_headroom,
            "per_channel_linears": c.per_channel_linears, "weight_rounding": c.weight_rounding,
            "htp_finalize": opts.htp_finalize}


def _recipe_options(opts: RunOptions) -> dict:
    values = {o.name: o.default for o in opts.recipe.options}
    values.update({k: v for k, v in opts.recipe_options.items() if v is not None})
    return values


def _run_component(opts, model, comp_name: str, builds: list[BuildSpec], store: Store,
                   entries: list[dict], progress: Progress) -> dict:
    from .artifacts import inputs
    from .artifacts.manifest import hash_arrays
    from .artifacts.samples import keep_audio
    from .exporters.lower import Lowering
    from .parity.pool import RunPool
    from .trace import trace

    component = opts.recipe.component(comp_name)
    needs_calib = any(b.precision.quantized for b in builds)
    timings = {}
    t0 = time.time()
    with progress.stage(f"{comp_name}: trace fp32 and capture inputs"):
        graph = model.graph(comp_name)
        heldout = model.samples(comp_name, "heldout")
        calib = model.samples(comp_name, "calibration")
        if needs_calib and len(calib.inputs) < MIN_CALIBRATION:
            raise UsageError(f"{comp_name}: calibration set has {len(calib.inputs)} samples; quantized "
                             f"builds need at least {MIN_CALIBRATION} real inputs")
        _note_capture_cache(model, progress)
        traced = trace(graph, calib, heldout)
        parity_inputs = store.put_bytes(f"parity-inputs/{comp_name}.npz", repro.parity_inputs_npz(traced))
    crash_point("traced")
    timings["trace_s"] = round(time.time() - t0, 3)
    weight_bytes = _weight_bytes(traced.module)
    slow = _slow_samples(opts, weight_bytes, len(traced.heldout))
    if slow is not None:
        progress.note(f"{comp_name}: {weight_bytes / 2**30:.2f} GiB of weights: the HTP simulator and portable "
                      f"kernels score {len(slow)} of {len(traced.heldout)} held-out samples (--sim-samples)")
    lowering = Lowering(traced, opts.target, store.root / ".staging" / "work" / comp_name,
                        **_lowering_options(opts, comp_name))
    gate = None
    if weight_bytes >= HEAVY_BYTES:
        # heavy steps (compile / quantizer children, scoring workers, .pte lowering) overlap only
        # while their estimated peaks fit in what is free (or under --max-memory)
        from .memory import MemoryGate, build_budget

        # without --max-memory, QNN compile and quantizer children run alone (the lowest peak)
        gate = MemoryGate(build_budget(opts.max_memory), alone=opts.max_memory is None)
        lowering.gate, lowering.weight_bytes = gate, weight_bytes
    with RunPool(opts.jobs, one_at_a_time=weight_bytes >= HEAVY_BYTES, gate=gate) as pool:
        # Lower everything first, handing each runner job to the pool as soon as it exists, so the
        # simulator runs overlap each other and the remaining lowering.
        shared: dict = {}
        # A context binary is lowered before its DLC sibling: the simulator then runs the compiled
        # binary (no second compile in the worker, nor the fp32 source's weights), and the DLC -- the
        # same QNN graph from the same ONNX and options -- shares its outputs.
        order = sorted(range(len(builds)), key=lambda i: _lowering_rank(builds, i))
        lowered = {i: _lower_build(builds[i], _gate(opts, component, builds[i].precision), lowering, traced,
                                   store, pool, shared, progress, slow) for i in order}
        pending = [lowered[i] for i in range(len(builds))]
        early = _attribution_precisions(builds) if opts.attribution == "all" else []
        attribution_jobs = _lower_attribution(opts, traced, early, store, pool, progress)
        comp_entries = [_finish_build(p, traced, component, store, progress) for p in pending]
        if opts.attribution == "auto":     # explain the rejections only
            late = [p for p in _attribution_precisions(builds)
                    if any(e["status"] == "rejected" and e["precision"] == p.value and e["format"] != "pte"
                           for e in comp_entries)]
            on_cpu = {p for p in late if _scored_low_on_cpu(comp_entries, p)}
            attribution_jobs = _lower_attribution(opts, traced, late, store, pool, progress, on_cpu)
        attribution = _collect_attribution(attribution_jobs, progress, traced.name)
    if gate is not None:
        timings["memory_gate"] = gate.report()
        if gate.waits:
            progress.note(f"{comp_name}: {gate.waits} heavy step(s) waited {gate.waited_s:.0f} s for memory "
                          f"(budget {gate.budget / 2**30:.1f} GiB)")
    _link_attribution(comp_entries, attribution)
    kept = inputs.keep_for_hub(store, opts.recipe.name, opts.target, lowering, comp_entries)
    # The component's intermediate graphs (fp32 / fp16 / QDQ ONNX, attribution blocks) are done with:
    # at 1.7B a talker graph's come to ~12 GB, and keeping them to the end of the run filled the disk.
    shutil.rmtree(lowering.work, ignore_errors=True)
    entries.extend(comp_entries)
    timings["total_s"] = round(time.time() - t0, 3)
    return {
        "accepted": any(e["status"] == "accepted" for e in comp_entries),
        "inputs": [s.to_json() for s in traced.inputs],
        "outputs": [s.to_json() for s in traced.outputs],
        "calibration": {"source": traced.calibration_source, "count": len(traced.calibration),
                        "sha256": hash_arrays(traced.calibration)},
        "heldout": {"source": traced.heldout_source, "count": len(traced.heldout),
                    "sha256": hash_arrays(traced.heldout)},
        **({"capture": {"cache": "hit" if cc["hit"] else cc.get("store", "off"), "key": cc["key"]}}
           if (cc := getattr(model, "capture_cache", None)) else {}),
        "weight_bytes": weight_bytes,
        **({"fp32_on_cpu": component.fp32_on_cpu} if component.fp32_on_cpu else {}),
        "agreement_min": component.agreement_min,
        "tie_margins": dict(component.tie_margins),
        "parity_inputs": {**parity_inputs.to_json(), "samples": len(traced.heldout)},
        **kept,                                          # sources, calibration_inputs: for AI Hub
        "rewrites": lowering.rewrite_report,
        "attribution": attribution,
        "gated_outputs": list(component.gated_outputs),
        "samples": keep_audio(store.put_bytes, f"{comp_name}-fp32", traced.reference, component.audio_outputs),
        "timings": timings,
    }


def _step_kind(runner) -> str:
    """The memory.STEP_FACTORS entry of a scoring run: the simulator loading a compiled context binary
    needs less than one compiling its source ONNX."""
    if runner.kind == "qnn-htp" and runner.model.endswith(".ctx.onnx"):
        return "qnn-htp-ctx"
    if runner.lean:
        return "ort-cpu-lean"
    return runner.kind


def _lowering_rank(builds: list[BuildSpec], i: int) -> tuple:
    """Plan order, except that a DLC waits for the context binary of its precision when one is planned."""
    b = builds[i]
    if b.format == Format.DLC:
        ctx = next((j for j, o in enumerate(builds) if o.format == Format.CTX and o.precision == b.precision), None)
        if ctx is not None:
            return (ctx, 1)
    return (i, 0)


def _weight_bytes(module) -> int:
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def _note_capture_cache(model, progress) -> None:
    """Say once per run where the captured inputs came from, when not generated and kept as usual."""
    cc = getattr(model, "capture_cache", None)
    if not cc or cc.get("noted"):
        return
    cc["noted"] = True
    if cc["hit"]:
        progress.note(f"inputs captured from the fp32 model reused from the capture cache (key {cc['key'][:12]}; "
                      f"OMNI_EXPORT_CAPTURE_CACHE=off captures them again)")
    elif cc.get("store") not in ("stored", "off"):
        progress.note(f"captured inputs {cc['store']} in the capture cache")


def _slow_samples(opts: RunOptions, weight_bytes: int, heldout: int) -> list[int] | None:
    """Indices of the held-out samples slow runners score (evenly spread); None: all of them."""
    n = opts.sim_samples
    if n is None:
        n = SLOW_SAMPLES if weight_bytes >= HEAVY_BYTES else 0
    if n <= 0 or n >= heldout:
        return None
    return sorted({round(i * (heldout - 1) / max(1, n - 1)) for i in range(n)})


def _is_slow(spec: BuildSpec, runner) -> bool:
    return runner.kind == "qnn-htp" or (runner.kind == "executorch" and spec.precision == Precision.W8A16)


@dataclass
class _Pending:
    spec: BuildSpec
    entry: dict
    threshold: float
    built: object = None
    future: object = None
    error: str | None = None
    t_lower: float = 0.0
    t_submit: float = 0.0
    samples: list[int] | None = None      # held-out indices this build's runner scored (None: all)


def _gate(opts: RunOptions, component, precision: Precision) -> float:
    return float(opts.gates.get(precision, component.gate_db(precision)))


def _lower_build(spec: BuildSpec, threshold: float, lowering, traced, store: Store, pool, shared: dict,
                 progress, slow: list[int] | None = None) -> _Pending:
    entry = {"name": spec.name, "component": spec.component, "format": spec.format.value,
             "precision": spec.precision.value, "target": spec.target}
    p = _Pending(spec, entry, threshold)
    staging = store.staging(spec.filename)
    t0 = time.time()
    try:
        with progress.stage(f"{spec.component}: lower {spec.format.value} {spec.precision.value}"):
            p.built = lowering.build(spec, staging)
    except Exception as e:  # a failed lowering is a rejected build with its reason, not a crash
        if is_disk_full(e):
            raise                        # ... unless the disk is full: that is no verdict on the model
        p.error = f"lowering failed: {_short(e)}"
        p.t_lower = time.time() - t0
        return p
    p.t_lower = time.time() - t0
    crash_point("lowered")
    runner = p.built.runner
    key = runner.result_key
    p.samples = slow if _is_slow(spec, runner) else None
    if key and key in shared:
        p.future, first = shared[key]    # the same QNN graph already runs for a sibling build
        p.entry["shared_run"] = True
        p.entry["outputs_from"] = first.format.value
    else:
        inputs = traced.heldout if p.samples is None else [traced.heldout[i] for i in p.samples]
        kind = _step_kind(runner)
        p.future = pool.submit(runner, inputs, reserve=lowering.need(kind), alone=kind in ALONE_STEPS)
        if key:
            shared[key] = (p.future, spec)
    p.t_submit = time.time()
    return p


def _finish_build(p: _Pending, traced, component, store: Store, progress) -> dict:
    from .artifacts.samples import keep_audio
    from .parity.gate import judge
    from .parity.metrics import score_outputs
    from .parity.runners import open_runner

    entry = p.entry
    if p.error:
        return _failed(entry, p.threshold, p.error, p.t_lower)
    runner = p.built.runner
    error = verdict = None
    with progress.stage(f"{p.spec.component}: score {p.spec.format.value} {p.spec.precision.value} "
                        f"on {runner.short}") as note:
        try:
            outputs = p.future.result()
            if entry.pop("shared_run", False) and p.spec.format != Format.DLC:
                # still prove this artifact loads on its runtime (a DLC's runner compiles its source
                # ONNX, which the context binary's compile already did)
                open_runner(runner).close()
        except Exception as e:
            error = f"runner failed: {_short(e)}"
        else:
            reference = traced.reference if p.samples is None else [traced.reference[i] for i in p.samples]
            scores = score_outputs(traced.output_names, reference, outputs, traced.logits, component.tie_margins)
            verdict = judge(scores, p.threshold, component.gated_outputs, agreement_min=component.agreement_min)
        if note is not None:         # the verdict on the stage's line, with the job's own seconds
            note.text = error or _headline(verdict, component.gated_outputs) + (
                f" — shares the {entry['outputs_from']}'s run" if "outputs_from" in entry else "")
            note.failed = error is not None or not verdict.accepted
            note.seconds = None if error else getattr(outputs, "wall_s", None)
    if error:
        store.commit(p.built.files, accepted=False)
        return _failed(entry, p.threshold, error, p.t_lower, runner=runner.to_json())
    records = store.commit(p.built.files, verdict.accepted)
    parity = _parity(verdict, runner)
    parity["samples"] = len(reference)
    if p.samples is not None:
        parity["samples_note"] = (f"{len(reference)} of {len(traced.reference)} held-out samples (indices "
                                  f"{p.samples}): a slow runner on a graph past {HEAVY_BYTES >> 20} MB of "
                                  f"weights (--sim-samples)")
    entry.update({
        "status": verdict.status,
        "files": [r.to_json() for r in records],
        "parity": parity,
        "details": p.built.details,
        "samples": keep_audio(store.put_bytes, f"{p.spec.component}-{p.spec.format.value}-{p.spec.precision.value}",
                              outputs, component.audio_outputs),
        "timings": {"lower_s": round(p.t_lower, 3), "run_wait_s": round(time.time() - p.t_submit, 3)},
    })
    return entry


def _headline(verdict: Verdict, gated) -> str:
    """A verdict in a few words: `41.2 dB, accepted` (the lowest gated SNR) or `rejected: <reason>`."""
    snrs = [s.snr_db for s in verdict.scores
            if (not gated or s.name in gated) and s.agreement is None and s.finite]
    if verdict.accepted and snrs:
        return f"{min(snrs):.1f} dB, accepted"
    return f"{verdict.status}: {verdict.reason}"


def _parity(verdict: Verdict, runner) -> dict:
    return {"runner": runner.to_json(), "threshold_db": verdict.threshold_db, "verdict": verdict.status,
            "reason": verdict.reason, "outputs": [s.to_json() for s in verdict.scores]}


def _failed(entry: dict, threshold: float, reason: str, seconds: float, runner: dict | None = None) -> dict:
    entry.update({"status": "rejected", "files": [], "error": reason,
                  "parity": {"runner": runner, "threshold_db": threshold, "verdict": "rejected",
                             "reason": reason, "outputs": []},
                  "details": {}, "timings": {"lower_s": round(seconds, 3)}})
    return entry


# What a failure's text does not say, for errors whose cause we have measured.
HINTS = {
    "QNN_COMMON_ERROR_MEM_ALLOC": "the HTP could not fit a tensor of this graph; a shorter time axis (a smaller "
                                  "streaming chunk) may compile",
}


def _short(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    line = (text[0] if text else type(e).__name__)[:400]
    hints = [h for key, h in HINTS.items() if key in str(e)]
    return line + "".join(f" ({h})" for h in hints)


# ------------------------------------------------------------------------------------- attribution

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


def _lower_attribution(opts, traced, precisions, store: Store, pool, progress, on_cpu: set = frozenset()) -> dict:
    """Per precision: lower each block alone for the target's main runner (ORT CPU for the
    precisions in `on_cpu`) and queue its run.

    Each block is fed the fp32 activations the full graph produced in front of it, so its score
    is the loss that block adds by itself (not the loss it inherits)."""
    from .exporters.lower import Lowering
    from .trace import BlockChain, trace_blocks

    if not precisions or not isinstance(traced.module, BlockChain):
        return {}
    with progress.stage(f"{traced.name}: capture block activations"):
        blocks = trace_blocks(traced, heldout_limit=ATTRIBUTION_SAMPLES)
    lowerings = [Lowering(b, opts.target, store.root / ".staging" / "work" / traced.name / f"block{i}",
                          **_lowering_options(opts, traced.name))
                 for i, b in enumerate(blocks)]
    jobs = {}
    for p in precisions:
        rows = []
        with progress.stage(f"{traced.name}: lower {len(blocks)} blocks alone, {p.value}"):
            for block, lw in zip(blocks, lowerings):
                row = {"block": block.name.split(":", 1)[1]}
                try:
                    spec = lw.cpu_runner(p) if p in on_cpu else lw.primary_runner(p)
                    row["runner"] = spec.label
                    rows.append((row, block, pool.submit(spec, block.heldout)))
                except Exception as e:
                    if is_disk_full(e):
                        raise
                    row.update({"snr_db": None, "error": _short(e)})
                    rows.append((row, block, None))
        jobs[p.value] = rows
    return jobs


def _collect_attribution(jobs: dict, progress, name: str) -> dict:
    from .parity.metrics import score_outputs

    result = {}
    for prec, rows in jobs.items():
        out = []
        with progress.stage(f"{name}: per-block fidelity, {prec}"):
            for row, block, future in rows:
                if future is not None:
                    try:
                        scores = score_outputs(block.output_names, block.reference, future.result())
                        s = min(scores, key=lambda x: x.snr_db)
                        row.update({"snr_db": round(s.snr_db, 3) if s.finite else None,
                                    "psnr_db": round(s.psnr_db, 3) if s.finite else None, "finite": s.finite})
                    except Exception as e:
                        row.update({"snr_db": None, "error": _short(e)})
                out.append(row)
        result[prec] = out
    return result


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


# ---------------------------------------------------------------------------------------- manifest

def _manifest(opts, checkpoint_info: dict, the_plan: Plan, entries, components, seconds: float) -> dict:
    t = opts.target
    return {
        "schema_version": mf.SCHEMA_VERSION,
        "tool": "omni-export",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "recipe": {"name": opts.recipe.name, "version": opts.recipe.version, "doc": opts.recipe.doc},
        "checkpoint": checkpoint_info,
        "target": {"name": t.name, "device": t.device, "soc": t.soc, "soc_model": t.soc_model,
                   "htp_arch": t.htp_arch, "hub_device": t.hub_device, "rewrites": list(t.rewrites),
                   "placement": {c: t.place(c).unit for c in sorted({b.component for b in the_plan.builds})}},
        "options": {"components": sorted({b.component for b in the_plan.builds}),
                    "precisions": sorted({b.precision.value for b in the_plan.builds}),
                    "formats": sorted({b.format.value for b in the_plan.builds}),
                    "attribution": opts.attribution, "rewrites": list(_rewrites(opts)), "jobs": opts.jobs,
                    "gates_db": {p.value: v for p, v in opts.gates.items()},
                    "sim_samples": opts.sim_samples, "htp_optimization": opts.htp_finalize,
                    "recipe_options": _recipe_options(opts)},
        "toolchain": mf.toolchain(),
        "host": mf.host(),
        "components": components,
        "builds": entries,
        "skipped": the_plan.skipped,
        "summary": _summary(entries, components),
        "timings": {"total_s": round(seconds, 3)},
    }


def _summary(entries: list[dict], components: dict, e2e: list[dict] = ()) -> dict:
    ran = [r for r in e2e if r["verdict"] != "skipped"]
    return {
        "accepted": sum(e["status"] == "accepted" for e in entries),
        "rejected": sum(e["status"] == "rejected" for e in entries),
        "components_without_accepted_build": sorted(c for c, i in components.items() if not i["accepted"]),
        # the pipeline ran end to end on some runner and never stayed within its gate
        "end_to_end_failed": bool(ran) and not any(r["verdict"] == "accepted" for r in ran),
    }


def describe_exception() -> str:  # used by the CLI's --debug
    return traceback.format_exc()


__all__ = ["RunOptions", "run", "plan", "Progress", "Result", "Callable", "Sequence"]
