"""What the scoring host's CPU decides about the numbers: its model and the instruction-set flags
that steer the kernels the runtimes pick at run time.

ExecuTorch 1.5.1's XNNPACK chooses its fp16 matrix-multiply kernel from the host CPU: with
AVX512-FP16 (recent Xeons) it accumulates in fp16 (`xnn_f16_gemm_minmax_ukernel_*__avx512fp16_*`),
on other x86 CPUs in fp32 (`xnn_f16_f32acc_gemm_*`); Arm64 CPUs with fp16 arithmetic (phones)
accumulate in fp16. The same fp16 .pte scored 25.6-39.9 dB on one host and 53.5-68.4 dB on another
(docs/benchmarks.md, the job graph's 0.6B build): a fp16 .pte verdict is only comparable between
hosts of the same accumulation.
"""
from __future__ import annotations

import platform
from functools import cache
from pathlib import Path

# flags that change which kernels XNNPACK / ONNX Runtime / the QNN simulator run on x86 and Arm
FLAGS = ("avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
         "amx_tile", "amx_bf16", "amx_fp16", "asimd", "asimdhp", "asimddp", "sve", "i8mm", "bf16")


@cache
def cpu_facts() -> dict:
    """{"cpu_model", "cpu_flags" (those of FLAGS the CPU has), "xnnpack_fp16_accumulation"}."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Hardware", "CPU part") and model is None:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu_model": model or platform.processor() or None,
            "cpu_flags": [f for f in FLAGS if f in flags],
            "xnnpack_fp16_accumulation": xnnpack_fp16_accumulation(flags, platform.machine())}


def xnnpack_fp16_accumulation(flags: set[str], machine: str) -> str | None:
    """'fp16' or 'fp32': how XNNPACK sums fp16 products on this CPU (None when unknown)."""
    if machine in ("x86_64", "AMD64", "i686"):
        return "fp16" if "avx512_fp16" in flags else "fp32"
    if machine in ("aarch64", "arm64"):
        return "fp16" if "asimdhp" in flags else "fp32"
    return None
