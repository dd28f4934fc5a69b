"""The targets table. A target names a device, its SoC, the formats and precisions it builds.

SoC ids (FACTS.md): SM8750 (Snapdragon 8 Elite, Galaxy S25) soc_model 69, HTP v79;
SM8650 (Snapdragon 8 Gen 3, Galaxy S24) soc_model 57, HTP v75.
"""
from __future__ import annotations

from .core import Format, Placement, Precision, Target, UsageError

# HTP-safe rewrites (exporters/rewrites.py), listed here so the CLI needs no torch import.
REWRITE_NAMES = ("pow_mul", "act_barrier", "sin_poly", "conv_polyphase")

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
_VOCODER_ON_GPU = {"code2wav": _ADRENO}
_HET_PRECISIONS = (Precision.FP32, Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16)
_HET_NOTE = "fp32 runs on the Adreno GPU only (the HTP has no fp32 datapath)"

# A graph that must stay fp32 (Component.fp32_on_cpu) on a target whose unit for it has no fp32: the CPU
# beside the NPU. AI Hub compiles its ONNX for ONNX Runtime on the CPU.
CPU_FP32 = Placement("cpu", (Format.ONNX, Format.PTE), (Precision.FP32,), {Format.ONNX: "onnx"},
                     doc="CPU at fp32 (ONNX Runtime / ExecuTorch XNNPACK) beside the NPU")

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="s25-htp", device="Samsung Galaxy S25 (Snapdragon 8 Elite), Hexagon NPU",
            soc="SM8750", soc_model="69", htp_arch="79", formats=_HTP_FORMATS,
            default_precisions=_HTP_LADDER, hub_device="Samsung Galaxy S25 (Family)",
            rewrites=("pow_mul", "act_barrier", "conv_polyphase"), precisions=_HTP_PRECISIONS, precision_note=_HTP_NOTE,
            default_placement=_HTP_ALL,
            doc="every component on the HTP (NPU); fp16 and calibrated w8a16",
        ),
        Target(
            name="s24-htp", device="Samsung Galaxy S24 (Snapdragon 8 Gen 3), Hexagon NPU",
            soc="SM8650", soc_model="57", htp_arch="75", formats=_HTP_FORMATS,
            default_precisions=_HTP_LADDER, hub_device="Samsung Galaxy S24 (Family)",
            rewrites=("pow_mul", "act_barrier", "conv_polyphase"), precisions=_HTP_PRECISIONS, precision_note=_HTP_NOTE,
            default_placement=_HTP_ALL,
            doc="every component on the HTP (NPU); fp16 and calibrated w8a16",
        ),
        Target(
            name="s25", device="Samsung Galaxy S25 (Snapdragon 8 Elite): Hexagon NPU + Adreno GPU",
            soc="SM8750", soc_model="69", htp_arch="79", formats=(Format.ONNX, Format.DLC, Format.CTX),
            default_precisions=(Precision.FP16, Precision.FP32), hub_device="Samsung Galaxy S25 (Family)",
            rewrites=("pow_mul", "act_barrier", "conv_polyphase"), precisions=_HET_PRECISIONS, precision_note=_HET_NOTE,
            placement=_VOCODER_ON_GPU, default_placement=_LM_NPU,
            doc="talker and predictor on the NPU at fp16, Code2Wav on the Adreno GPU at fp32",
        ),
        Target(
            name="s24", device="Samsung Galaxy S24 (Snapdragon 8 Gen 3): Hexagon NPU + Adreno GPU",
            soc="SM8650", soc_model="57", htp_arch="75", formats=(Format.ONNX, Format.DLC, Format.CTX),
            default_precisions=(Precision.FP16, Precision.FP32), hub_device="Samsung Galaxy S24 (Family)",
            rewrites=("pow_mul", "act_barrier", "conv_polyphase"), precisions=_HET_PRECISIONS, precision_note=_HET_NOTE,
            placement=_VOCODER_ON_GPU, default_placement=_LM_NPU,
            doc="talker and predictor on the NPU at fp16, Code2Wav on the Adreno GPU at fp32",
        ),
        Target(
            name="cpu", device="host CPU (ONNX Runtime, ExecuTorch XNNPACK)",
            soc="x86-64/arm64", soc_model=None, htp_arch=None,
            formats=(Format.ONNX, Format.PTE),
            default_precisions=(Precision.FP32, Precision.FP16, Precision.W8A8),
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
        return CPU_FP32
    return place
