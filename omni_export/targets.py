"""The targets table. A target names a device, its SoC, the formats and precisions it builds.

SoC ids (FACTS.md): SM8750 (Snapdragon 8 Elite, Galaxy S25) soc_model 69, HTP v79;
SM8650 (Snapdragon 8 Gen 3, Galaxy S24) soc_model 57, HTP v75.
"""
from __future__ import annotations

from dataclasses import replace

from .core import UNIT_NAMES, UNITS, Format, Placement, Precision, Target, UsageError

# HTP-safe rewrites (exporters/rewrites.py), listed here so the CLI needs no torch import.
REWRITE_NAMES = ("pow_mul", "act_barrier", "sin_poly", "sin_dense", "conv_polyphase")

_HTP_FORMATS = (Format.ONNX, Format.DLC, Format.CTX, Format.PTE)
_HTP_LADDER = (Precision.FP16, Precision.W8A16)
_HTP_PRECISIONS = (Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16)
_HTP_NOTE = "the HTP has no fp32 datapath"

# What AI Hub compiles each local format's device build for (--target_runtime). The ONNX build
# becomes ONNX Runtime with a precompiled QNN context (what an app using ORT ships), the DLC the
# QNN DLC, the context binary the raw QNN context binary. ExecuTorch programs are not submitted
# (AI Hub takes no .pte).
_HTP_HUB = {Format.ONNX: "precompiled_qnn_onnx", Format.DLC: "qnn_dlc", Format.CTX: "qnn_context_binary"}

_HTP_ALL = Placement("htp", _HTP_FORMATS, _HTP_LADDER, _HTP_HUB,
                     doc="Hexagon NPU; fp16 and calibrated w8a16")
# Heterogeneous targets: the language model on the NPU at fp16, the vocoder on the Adreno GPU at
# fp32 (FACTS.md: Code2Wav 45.8 ms/frame on the S25 GPU at fp32 vs 182 ms on the NPU).
_LM_NPU = Placement("htp", (Format.ONNX, Format.DLC, Format.CTX), (Precision.FP16,), _HTP_HUB,
                    doc="Hexagon NPU at fp16")
_ADRENO = Placement("gpu", (Format.ONNX,), (Precision.FP32,), {Format.ONNX: "qnn_dlc"},
                    doc="Adreno GPU at fp32 (AI Hub: QNN DLC, --compute_unit gpu); scored locally on "
                        "ONNX Runtime CPU at the same precision as a proxy (QNN's GPU backend does not "
                        "run on x86)")
_VOCODER_ON_GPU = {"vocoder": "gpu"}
_HET_PRECISIONS = (Precision.FP32, Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16)
_HET_NOTE = "fp32 runs on the Adreno GPU only (the HTP has no fp32 datapath)"

# A graph that must stay fp32 (Component.fp32_on_cpu) on a target whose unit for it has no fp32: the CPU
# beside the NPU. AI Hub compiles its ONNX for ONNX Runtime on the CPU. Also the CPU of --place COMPONENT=cpu.
CPU_FP32 = Placement("cpu", (Format.ONNX, Format.PTE), (Precision.FP32,), {Format.ONNX: "onnx"},
                     doc="CPU at fp32 (ONNX Runtime / ExecuTorch XNNPACK) beside the NPU")
_HOST_CPU = Placement("cpu", (Format.ONNX, Format.PTE), (Precision.FP32, Precision.FP16, Precision.W8A8),
                      doc="CPU runtimes (ONNX Runtime, ExecuTorch XNNPACK)")
# The phones' units: the NPU (the target's default placement), the Adreno GPU, the CPU beside them.
_PHONE = {"gpu": _ADRENO, "cpu": CPU_FP32}

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="s25-htp", device="Samsung Galaxy S25 (Snapdragon 8 Elite), Hexagon NPU",
            soc="SM8750", soc_model="69", htp_arch="79", formats=_HTP_FORMATS,
            default_precisions=_HTP_LADDER, hub_device="Samsung Galaxy S25 (Family)",
            rewrites=("pow_mul", "act_barrier", "sin_dense", "conv_polyphase"), precisions=_HTP_PRECISIONS, precision_note=_HTP_NOTE,
            default_placement=_HTP_ALL, units={"htp": _HTP_ALL, **_PHONE},
            doc="every component on the HTP (NPU); fp16 and calibrated w8a16",
        ),
        Target(
            name="s24-htp", device="Samsung Galaxy S24 (Snapdragon 8 Gen 3), Hexagon NPU",
            soc="SM8650", soc_model="57", htp_arch="75", formats=_HTP_FORMATS,
            default_precisions=_HTP_LADDER, hub_device="Samsung Galaxy S24 (Family)",
            rewrites=("pow_mul", "act_barrier", "sin_dense", "conv_polyphase"), precisions=_HTP_PRECISIONS, precision_note=_HTP_NOTE,
            default_placement=_HTP_ALL, units={"htp": _HTP_ALL, **_PHONE},
            doc="every component on the HTP (NPU); fp16 and calibrated w8a16",
        ),
        Target(
            name="s25", device="Samsung Galaxy S25 (Snapdragon 8 Elite): Hexagon NPU + Adreno GPU",
            soc="SM8750", soc_model="69", htp_arch="79", formats=(Format.ONNX, Format.DLC, Format.CTX),
            default_precisions=(Precision.FP16, Precision.FP32), hub_device="Samsung Galaxy S25 (Family)",
            rewrites=("pow_mul", "act_barrier", "sin_dense", "conv_polyphase"), precisions=_HET_PRECISIONS, precision_note=_HET_NOTE,
            roles=_VOCODER_ON_GPU, default_placement=_LM_NPU, units={"htp": _LM_NPU, **_PHONE},
            doc="the language model on the NPU at fp16, vocoders (Code2Wav, HiFT) on the Adreno GPU at fp32",
        ),
        Target(
            name="s24", device="Samsung Galaxy S24 (Snapdragon 8 Gen 3): Hexagon NPU + Adreno GPU",
            soc="SM8650", soc_model="57", htp_arch="75", formats=(Format.ONNX, Format.DLC, Format.CTX),
            default_precisions=(Precision.FP16, Precision.FP32), hub_device="Samsung Galaxy S24 (Family)",
            rewrites=("pow_mul", "act_barrier", "sin_dense", "conv_polyphase"), precisions=_HET_PRECISIONS, precision_note=_HET_NOTE,
            roles=_VOCODER_ON_GPU, default_placement=_LM_NPU, units={"htp": _LM_NPU, **_PHONE},
            doc="the language model on the NPU at fp16, vocoders (Code2Wav, HiFT) on the Adreno GPU at fp32",
        ),
        Target(
            name="cpu", device="host CPU (ONNX Runtime, ExecuTorch XNNPACK)",
            soc="x86-64/arm64", soc_model=None, htp_arch=None,
            formats=(Format.ONNX, Format.PTE),
            default_precisions=(Precision.FP32, Precision.FP16, Precision.W8A8),
            default_placement=_HOST_CPU, units={"cpu": _HOST_CPU},
            doc="CPU runtimes only; no QNN formats",
        ),
    )
}

# Which (format, precision) pairs a format can build at all, whatever the target.
FORMAT_PRECISIONS: dict[Format, tuple[Precision, ...]] = {
    Format.ONNX: (Precision.FP32, Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16),
    # HTP has no fp32 datapath; fp16 is the fp16 ONNX compiled with HTP fp16 precision.
    Format.DLC: (Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16),
    Format.CTX: (Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16),
    # XNNPACK: fp32, fp16, PT2E static int8 (w8a8), and int8 weight-only with fp16
    # activations (w8a16: 16-bit float activations; XNNPACK has no int16 activations).
    Format.PTE: (Precision.FP32, Precision.FP16, Precision.W8A16, Precision.W8A8),
}

UNSUPPORTED_REASON: dict[Format, str] = {
    Format.DLC: "the HTP has no fp32 datapath (build fp16 instead)",
    Format.CTX: "the HTP has no fp32 datapath (build fp16 instead)",
    Format.PTE: ("ExecuTorch's XNNPACK takes int4 weights only with int8 dynamic activations (torchao 8da4w), "
                 "not 16-bit ones, and its int4 weight-only program computes wrong outputs (docs/quantization.md); "
                 "w4a16 is built as QDQ for the HTP"),
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target '{name}'; valid: {', '.join(TARGETS)}") from None


def check_precisions(target: Target, precisions) -> None:
    """A UsageError naming the valid ones when the target cannot run a requested precision."""
    valid = target.precisions or tuple(Precision)
    for p in precisions:
        if p not in valid:
            why = f" ({target.precision_note})" if target.precision_note else ""
            raise UsageError(f"target {target.name} cannot run {p.value}{why}; valid precisions for "
                             f"{target.name}: {', '.join(v.value for v in valid)}")


def supports(fmt: Format, precision: Precision) -> bool:
    return precision in FORMAT_PRECISIONS[fmt]


def place_build(target: Target, component: str, precision: Precision, fp32_on_cpu: bool = False) -> Placement:
    """Where one build runs: the component's placement, except the fp32 build of a graph that must stay
    fp32 (Component.fp32_on_cpu) on a unit that has no fp32, which runs on the CPU."""
    place = target.place(component)
    if fp32_on_cpu and precision == Precision.FP32 and precision not in place.runs:
        return replace(CPU_FP32, by=f"fp32_on_cpu: {component}'s fp32 build runs on the CPU beside the {place.unit_name}")
    return place


# --place's words for the units: AI Hub's --compute_unit names (core.UNITS), npu for the HTP.
PLACE_WORDS = {word: unit for unit, word in UNITS.items()}


def parse_place(values) -> dict[str, str]:
    """--place COMPONENT=npu|gpu|cpu (repeatable, or comma-separated) -> {component: unit}."""
    out: dict[str, str] = {}
    for item in (x.strip() for v in values or () for x in str(v).split(",")):
        if not item:
            continue
        comp, eq, word = (x.strip() for x in item.partition("="))
        if not eq or not comp or not word:
            raise UsageError(f"--place {item}: expected COMPONENT=UNIT with UNIT one of {', '.join(PLACE_WORDS)}")
        if word.lower() not in PLACE_WORDS:
            raise UsageError(f"--place {item}: unknown unit '{word}'; valid: {', '.join(PLACE_WORDS)}")
        out[comp] = PLACE_WORDS[word.lower()]
    return out


def place_components(target: Target, recipe, place: dict[str, str] | None = None) -> Target:
    """The target with every component of `recipe` placed: on the unit its role goes to on this target
    (Target.roles; Component.role), else on the target's default unit; `place` ({component: unit},
    --place) overrides both. Each Placement says why in `by`. A component, role or unit the target
    does not have is a UsageError naming it."""
    place = dict(place or {})
    for comp, unit in place.items():
        try:
            recipe.component(comp)
        except UsageError as e:
            raise UsageError(f"--place {comp}={UNITS[unit]}: {e}") from None
        if unit not in target.units:
            raise UsageError(f"--place {comp}={UNITS[unit]}: target {target.name} has no {UNITS[unit]}; its units: "
                             f"{', '.join(UNITS[u] for u in target.units)}")
    default = target.place("")
    placed: dict[str, Placement] = {}
    for c in recipe.components:
        unit = target.roles.get(c.role) if c.role else None
        if unit is not None:
            placed[c.name] = replace(target.units[unit], by=f"role {c.role} ({target.name} places {c.role}s on "
                                                            f"the {UNIT_NAMES[unit]})")
        else:
            placed[c.name] = replace(default, by=f"{target.name}'s default unit")
    for comp, unit in place.items():
        placed[comp] = replace(target.units[unit], by=f"--place {comp}={UNITS[unit]}")
    placed = {c: replace(p, formats=tuple(f for f in p.formats if f in target.formats)) for c, p in placed.items()}
    extra = tuple(p for u in {x.unit for x in placed.values()} for p in target.units[u].runs
                  if target.precisions and p not in target.precisions) if target.units else ()
    return replace(target, placement=placed,
                   precisions=target.precisions + tuple(dict.fromkeys(extra)) if extra else target.precisions)


def placed_on(name: str, units: dict[str, str]) -> Target:
    """Target `name` with each component of `units` ({component: unit}) on that unit: a finished build's
    placement as manifest.json records it (target.placement), or one component's in a job worker."""
    target = get_target(name)
    placed = {c: target.units[u] for c, u in units.items() if u in target.units}
    return replace(target, placement=placed) if placed else target
