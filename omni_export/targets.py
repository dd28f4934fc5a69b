"""The targets table. A target names a device, its SoC, the formats and precisions it builds.

SoC ids (FACTS.md): SM8750 (Snapdragon 8 Elite, Galaxy S25) soc_model 69, HTP v79;
SM8650 (Snapdragon 8 Gen 3, Galaxy S24) soc_model 57, HTP v75.
"""
from __future__ import annotations

from .core import Format, Precision, Target, UsageError

# HTP-safe rewrites (exporters/rewrites.py), listed here so the CLI needs no torch import.
REWRITE_NAMES = ("pow_mul", "act_barrier", "sin_poly")

_HTP_FORMATS = (Format.ONNX, Format.DLC, Format.CTX, Format.PTE)
_HTP_LADDER = (Precision.FP16, Precision.W8A16)
_HTP_PRECISIONS = (Precision.FP16, Precision.W8A16, Precision.W8A8)
_HTP_NOTE = "the HTP has no fp32 datapath"

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="s25-htp", device="Samsung Galaxy S25 (Snapdragon 8 Elite), Hexagon NPU",
            soc="SM8750", soc_model="69", htp_arch="79", formats=_HTP_FORMATS,
            default_precisions=_HTP_LADDER, hub_device="Samsung Galaxy S25 (Family)",
            rewrites=("pow_mul", "act_barrier"), precisions=_HTP_PRECISIONS, precision_note=_HTP_NOTE,
            doc="every component on the HTP (NPU); fp16 and calibrated w8a16",
        ),
        Target(
            name="s24-htp", device="Samsung Galaxy S24 (Snapdragon 8 Gen 3), Hexagon NPU",
            soc="SM8650", soc_model="57", htp_arch="75", formats=_HTP_FORMATS,
            default_precisions=_HTP_LADDER, hub_device="Samsung Galaxy S24 (Family)",
            rewrites=("pow_mul", "act_barrier"), precisions=_HTP_PRECISIONS, precision_note=_HTP_NOTE,
            doc="every component on the HTP (NPU); fp16 and calibrated w8a16",
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
    Format.ONNX: (Precision.FP32, Precision.FP16, Precision.W8A16, Precision.W8A8),
    # HTP has no fp32 datapath; fp16 comes from the fp32 ONNX with HTP fp16 precision.
    Format.DLC: (Precision.FP16, Precision.W8A16, Precision.W8A8),
    Format.CTX: (Precision.FP16, Precision.W8A16, Precision.W8A8),
    # XNNPACK: fp32, fp16, PT2E static int8 (w8a8), and int8 weight-only with fp16
    # activations (w8a16: 16-bit float activations; XNNPACK has no int16 activations).
    Format.PTE: (Precision.FP32, Precision.FP16, Precision.W8A16, Precision.W8A8),
}

UNSUPPORTED_REASON: dict[Format, str] = {
    Format.DLC: "the HTP has no fp32 datapath (build fp16 instead)",
    Format.CTX: "the HTP has no fp32 datapath (build fp16 instead)",
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
