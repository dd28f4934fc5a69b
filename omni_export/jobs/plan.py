"""Plan: recipe x target x options -> the builds to make (component, format, precision) and the ones
skipped, with why. Flags are checked here, before any work starts."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core import BuildSpec, Format, Precision, Recipe, Target, UsageError, variant_base
from ..qnn_ep import DEFAULT_FINALIZE
from ..targets import CPU_FP32, UNSUPPORTED_REASON, check_precisions, place_components, supports


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
    jobs: int = 0                                  # worker processes; 0: one per core
    gates: dict = field(default_factory=dict)      # Precision -> dB, overrides the recipe's gates
    e2e: tuple[str, ...] | None = None             # runner kinds for end-to-end parity; None: the target's
    sim_samples: int | None = None                 # held-out samples on slow runners; None: auto, 0: all
    htp_finalize: str | None = DEFAULT_FINALIZE    # QNN HTP graph finalization mode (qnn_ep); None: QNN's
    max_memory: int | None = None                  # bytes the build's process tree should stay under; None: what is free
    executor: str = "local"                        # local | ray[:ADDRESS] (jobs/ray_executor.py)
    shared_dir: str | None = None                  # --shared-dir: Ray jobs' files by content hash there (jobs/ship.py)
    keep_sources: bool = False                     # keep sources/ (the ONNX AI Hub compiles from): --keep-sources, --hub
    repair: str = "auto"                           # precision repair of rejected quantized builds: auto | off
    repair_steps: int = 4                          # its step budget per precision (jobs/repair.py)
    place: dict = field(default_factory=dict)      # --place: {component: unit}, over the recipe's roles

    def __post_init__(self):
        # every component on its unit (the recipe's roles on this target, then --place): what plan,
        # lowering, scoring and the record read from target.place(component)
        self.target = place_components(self.target, self.recipe, self.place)


@dataclass
class Plan:
    builds: list[BuildSpec]
    skipped: list[dict]


def plan(opts: RunOptions, available: tuple[str, ...] | None = None) -> Plan:
    """Builds for the requested (or all available) components x precisions x formats."""
    if opts.shared_dir is not None:
        from .ship import check_shared_dir

        if not (opts.executor or "local").startswith("ray"):
            raise UsageError(f"--shared-dir {opts.shared_dir}: only --executor ray ships files between machines")
        opts.shared_dir = check_shared_dir(opts.shared_dir)
    comps = opts.components or tuple(c.name for c in opts.recipe.components
                                     if available is None or c.name in available)
    for c in comps:
        opts.recipe.component(c)
        if available is not None and c not in available:
            halves = [h for h in (f"{c}_part1", f"{c}_part2") if h in available]
            hint = (f" ({c} is split in two here, as the recipe's options chose: --components "
                    f"{','.join(halves)})" if halves else "")
            raise UsageError(f"this checkpoint has no {c}; its components: {', '.join(available)}{hint}")
    # a component's shape variants (Component.variants: code2wav_n1, ...) come with it (only a component
    # that has variants: hift_f0 is a graph of its own, not hift at f = 0)
    comps = tuple(dict.fromkeys(x for c in comps for x in (c, *(a for a in available or ()
                                                                 if variant_base(a) == c
                                                                 and opts.recipe.component(c).variants))))
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
