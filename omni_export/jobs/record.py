"""Record: what a finished job graph found, as the manifest (options, toolchain, builds, summary), and
the end-to-end rows the recipe runs over the accepted builds."""
from __future__ import annotations

import time

from ..artifacts import manifest as mf
from ..core import Precision
from .component import HEAVY_BYTES, SLOW_SAMPLES
from .errors import short
from .plan import Plan, RunOptions


def gate(opts: RunOptions, component, precision: Precision) -> float:
    return float(opts.gates.get(precision.base, component.gate_db(precision)))


def slow_samples(opts: RunOptions, weight_bytes: int, heldout: int, heavy: int = 0) -> list[int] | None:
    """Indices of the held-out samples slow runners score (evenly spread); None: all of them. `heavy`:
    how many of a graph past HEAVY_BYTES (its Component.sim_samples; 0: SLOW_SAMPLES)."""
    n = opts.sim_samples
    if n is None:
        n = (heavy or SLOW_SAMPLES) if weight_bytes >= HEAVY_BYTES else 0
    if n <= 0 or n >= heldout:
        return None
    return sorted({round(i * (heldout - 1) / max(1, n - 1)) for i in range(n)})


def e2e_runners(opts: RunOptions, manifest: dict) -> dict:
    """Runner kind -> precisions for end-to-end parity ({} when the recipe or user skips it)."""
    if not opts.recipe.end_to_end or opts.e2e == ():
        return {}
    kinds = opts.e2e or (("htp",) if opts.target.has_htp and not heavy(manifest) else ("ort",))
    from ..runtime.graphs import RUNNER_FORMATS

    order = [p.value for p in Precision]
    runners = {}
    for k in kinds:
        precs = sorted({b["precision"] for b in manifest["builds"] if b["format"] == RUNNER_FORMATS[k][0] and not (
            b["precision"] == "fp32" and manifest["components"].get(b["component"], {}).get("fp32_on_cpu"))},
            key=order.index)           # a graph kept at fp32 on the CPU makes no fp32 row of its own
        if precs:
            runners[k] = tuple(precs)
    return runners


def heavy(manifest: dict) -> list[str]:
    """Components whose graphs are past HEAVY_BYTES of weights: the HTP simulator needs tens of
    seconds per call for them, so end-to-end parity (hundreds of calls) runs on ORT CPU instead."""
    return sorted(c for c, info in manifest["components"].items()
                  if (info.get("weight_bytes") or 0) >= HEAVY_BYTES)


def e2e_runner_note(opts: RunOptions, manifest: dict) -> str | None:
    big = heavy(manifest)
    if opts.e2e or not opts.target.has_htp or not big:
        return None
    return (f"end-to-end parity runs on ORT CPU (the fp16 / QDQ ONNX builds): {', '.join(big)} "
            f"past {HEAVY_BYTES >> 20} MB of weights take tens of seconds per call on the HTP simulator")


def failed_e2e_row(runners: dict, precisions, error: BaseException) -> dict:
    """A row whose run failed: a rejected pipeline, recorded with its reason."""
    return {"runner": ",".join(runners), "precision": ",".join(precisions), "verdict": "rejected",
            "reason": f"end-to-end run failed: {short(error)}"}


def rewrites(opts: RunOptions) -> tuple[str, ...]:
    return opts.target.rewrites if opts.rewrites is None else tuple(opts.rewrites)


def lowering_options(opts: RunOptions, component: str) -> dict:
    """How a component's graphs (and its attribution blocks) are lowered: the target's rewrites and the
    component's QDQ choices."""
    c = opts.recipe.component(component)
    return {"rewrites": rewrites(opts), "headroom": c.activation_headroom,
            "per_channel_linears": c.per_channel_linears, "weight_rounding": c.weight_rounding,
            "htp_finalize": opts.htp_finalize}


def recipe_options(opts: RunOptions) -> dict:
    values = {o.name: o.default for o in opts.recipe.options}
    values.update({k: v for k, v in opts.recipe_options.items() if v is not None})
    return values


def manifest(opts, checkpoint_info: dict, the_plan: Plan, entries, components, seconds: float) -> dict:
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
                    "attribution": opts.attribution, "rewrites": list(rewrites(opts)), "jobs": opts.jobs,
                    "gates_db": {p.value: v for p, v in opts.gates.items()},
                    "sim_samples": opts.sim_samples, "htp_optimization": opts.htp_finalize,
                    "keep_sources": opts.keep_sources, "repair": opts.repair, "repair_steps": opts.repair_steps,
                    "recipe_options": recipe_options(opts)},
        "toolchain": mf.toolchain(),
        "host": mf.host(),
        "components": components,
        "builds": entries,
        "skipped": the_plan.skipped,
        "summary": summary(entries, components),
        "timings": {"total_s": round(seconds, 3)},
    }


def summary(entries: list[dict], components: dict, e2e: list[dict] = ()) -> dict:
    ran = [r for r in e2e if r["verdict"] != "skipped"]
    return {
        "accepted": sum(e["status"] == "accepted" for e in entries),
        "rejected": sum(e["status"] == "rejected" for e in entries),
        "components_without_accepted_build": sorted(c for c, i in components.items() if not i["accepted"]),
        # the pipeline ran end to end on some runner and never stayed within its gate
        "end_to_end_failed": bool(ran) and not any(r["verdict"] == "accepted" for r in ran),
    }


def bundle(out, m: dict, progress) -> dict:
    """OUT/bundle/ (artifacts/bundle.py) from the accepted builds, at the end of every build; one that
    cannot be made (no accepted build, the checkpoint's host data gone) is recorded with why and an
    older one removed, never failing the build."""
    from ..artifacts import bundle as bd
    from ..core import UsageError
    from ..recipes import bundle_host
    from ..reports.view import human_bytes

    with progress.stage("write the bundle") as note:
        try:
            rec = bd.write(out, m, bundle_host)
        except UsageError as e:
            bd.remove(out / "bundle")
            note.text, note.failed = str(e), True
            return {"error": str(e)}
        note.text = f"{len(rec['graphs'])} graph(s), {human_bytes(rec['bytes'])} in {rec['path']}/"
        return rec


def finish(build, the_plan: Plan, order: list[str], graph, seeds: dict, started: float) -> dict:
    """The manifest of a finished job graph, the end-to-end rows, the reports; OUT's documents written last."""
    from ..artifacts import reproducibility as repro
    from ..reports import write_reports

    opts, model = build.opts, build.loaded_model
    entries = [e for name in order for e in build.entries.get(name, [])]
    components = {name: build.components[name] for name in order if name in build.components}
    info = model.info if model is not None else (build.previous or {}).get("checkpoint")
    if info is None:                    # a resumed run whose previous record stopped before the manifest
        model = build.model()
        info = model.info
    m = manifest(opts, info, the_plan, entries, components, time.time() - started)
    m["created"] = build.created
    m["jobs"] = {"executor": opts.executor, "workers": opts.jobs,
                 **({"shared_dir": opts.shared_dir} if opts.shared_dir else {}),
                 **({"files": build.shipped} if getattr(build, "shipped", None) is not None else {}),
                 **({"reran": build.reran} if getattr(build, "reran", 0) else {}),
                        **({"memory_gate": build.memory_gate} if build.memory_gate else {}),
                        # jobs answered from the job store (a killed run's finished jobs, jobs/results.py)
                        "cached": sum(j.cached for j in graph.jobs.values()),
                        "graph": [j.record() for j in graph.jobs.values()]}
    # the end-to-end rows ran as jobs of the graph (jobs/e2e.py); none when the recipe or user skips them
    e2e = build.e2e
    runners = e2e.runners if e2e is not None else {}
    m["end_to_end"] = (e2e.finished_rows() if e2e is not None else None) or []
    if e2e is not None and e2e.note:
        m["end_to_end_runner_note"] = e2e.note
    e2e_reused = e2e.reused if e2e is not None and e2e.runners else build.cache.reuse_e2e(runners) is not None
    model = build.loaded_model or model
    m["summary"] = summary(entries, components, m["end_to_end"])
    model_seeds = model.seeds if model is not None else {
        k: v for k, v in (build.previous.get("seeds") or {}).items() if k not in seeds}
    m["seeds"] = {**seeds, **model_seeds}
    m["reproducibility"] = repro.declared(m)
    m["cache"] = build.cache.summary(build.available or sorted(components), runners, e2e_reused)
    build.store.claim()                 # the old manifest lists the old bundle's files
    m["bundle"] = bundle(build.store.root, m, build.progress)
    m["timings"]["total_s"] = round(time.time() - started, 3)
    if build.eta is not None:
        m["timings"]["eta"] = build.eta.record()          # the first ETA against the wall (jobs/eta.py)
    try:
        with build.progress.stage("write parity.json, report.md, report.html"):
            write_reports(build.store.root, m, write=build.store.write_text)
    except Exception:
        # a report that fails to render loses no build: the artifacts and the manifest are written
        # (`omni-export report OUT` writes the reports again), then the error goes up as it came
        build.store.finish(m)
        raise
    build.store.finish(m)
    return m
