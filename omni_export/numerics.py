"""Versions of the code that decides what a build outputs: the build and capture caches key on these,
not on omni-export's source, so an edit that changes no output (a docstring, the reports, the
scheduler) reuses every artifact and score.

Bump a part's number in the same commit as a change to its code that changes what it outputs: an
artifact's bytes, a captured input, a score. tests/test_numerics.py fails when the demo's ONNX or .pte
change while every number here stayed the same. A recipe's graphs have versions of
their own (Recipe.version for what every graph shares, such as the captured prompts;
Component.version per graph).
"""
from __future__ import annotations

from .core import Format, Precision

VERSIONS = {
    "capture": 1,     # captured inputs and fp32 references: captured.py, trace.py, weights.py, blocks.py
    "onnx": 4,        # the fp32 ONNX and the HTP-safe rewrites: exporters/onnx.py (export), rewrites.py, patches/
                      # 2: no Python stack traces (source paths) in the nodes' metadata
                      # 3: the HTP targets' default rewrites add sin_dense (a narrow sin in a dense layout)
                      # 4: a weight several nodes read is one constant (share_equal_weights,
                      #    fold_shared_transposes), not a copy or a Transpose per reader
    "fp16": 1,        # the fp16 ONNX: exporters/onnx.py (to_fp16, share_matmul_weights)
    "quantize": 3,    # QDQ ONNX: exporters/onnx.py (quantize_qdq and its calibration), exporters/gptq.py
                      # 2: large 16-bit tables as 8-bit codes with a scale per row (tables_per_row)
                      # 3: linears per channel take Gemm too, one Conv weight per weight (linears_as_conv)
    "int4": 3,        # w4a16's int4 weights: exporters/onnx.py (int4_overrides, int4_blocks), gptq.py's block grid
                      # 2: int4 only for MatMul / Conv weights (other constants as w8a16), per block of input channels
                      # 3: a weight several nodes read is re-cut in blocks too (int4_blocks)
    "qnn": 1,         # DLCs and context binaries: qnn_ep.py, exporters/lower.py (provider options)
    "pte": 5,         # ExecuTorch programs: exporters/executorch.py, exporters/gptq.py, halfsums.py and the
                      # recipes' XNNPACK forms (recipes/qwen3_tts/xnnpack.py)
                      # 2: fp16 products in sums of <= 128 terms (halfsums.py)
                      # 3: those short sums as a grouped 1x1 convolution and a linear of ones (SplitLinear)
                      # 4: fp16 convolution weights stored as fp16, not fp32 (patches/xnnpack_preprocess.py)
                      # 5: the int8 1x1 convolution and whole-length transposed one without a copy op
                      #    XNNPACK refuses (w8a16 Code2Wav: one delegate, was 20)
    "parity": 2,      # scores and verdicts: parity/metrics.py, parity/gate.py, runtime/runners.py
                      # 2: summed embeddings gated against their codebook rows (RowSum); the reason gives
                      # raw agreement and excused rows; the fused frame scores 4 samples on the simulator
    "repair": 4,      # precision repair's search (which blocks it keeps in float): jobs/repair.py
                      # 2: a real-size transformer's search: linears per channel, then layers at 16-bit
                      # weights as the estimate needs; steps score the rejected build's simulator samples
                      # 3: the weights of the nodes kept in float stored as fp16 (float_weights_as_fp16)
                      # 4: over w4a16 a step raises blocks to 8-bit weights, not float; a weighted op of
                      # the root module (a tied LM head) is a block (exporters/onnx.block_nodes); a step
                      # that passes with no weight left at the base width is no repair
}


def for_build(fmt: Format, precision: Precision) -> dict[str, int]:
    """The parts whose code decides a build's bytes and scores."""
    parts = ["capture", "parity"]
    if fmt == Format.PTE:
        parts.append("pte")
    else:
        parts.append("onnx")
        if precision == Precision.FP16:
            parts.append("fp16")
        elif precision.quantized:
            parts.append("quantize")
            if precision.base == Precision.W4A16:
                parts.append("int4")
            if precision.mixed:
                parts.append("repair")
        if fmt in (Format.DLC, Format.CTX):
            parts.append("qnn")
    return {p: VERSIONS[p] for p in sorted(parts)}
