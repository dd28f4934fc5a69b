"""What a host whose XNNPACK sums fp16 products in fp16 computes: an emulation for measuring.

ExecuTorch 1.5.1's XNNPACK runs an fp16 matrix product (linear, bmm, convolution) with a kernel
chosen from the host CPU (omni_export/cpu.py): on x86 CPUs without AVX512-FP16 it accumulates in
fp32 (`xnn_f16_f32acc_gemm_*`), on CPUs with it (`*__avx512fp16_broadcast`) and on Arm64 CPUs with
fp16 arithmetic (the phones) in fp16: one accumulator per output, initialised to the bias, one fused
multiply-add per reduction term, each rounded to fp16. A fp16 .pte scored on the first kind of host
says little about the second (docs/fp16-pte.md).

`Fp16Accumulation` is a TorchDispatchMode under which the fp16 aten matrix products of an eager
module are computed that way (sequential fp16 sum; each product exact in float32, the sum rounded
to float32 and then to fp16: a double rounding, which differs from one rounding by one fp16 ulp
only when the first lands on a tie of the second); every other op is torch's own. The 0.6B text projection under it scores what the fp16 .pte scored on an
AVX512-FP16 Xeon (docs/fp16-pte.md). It is slow (one pass per reduction term): for a few blocks,
not for whole models in tests.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def sequential_mm(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None = None) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] summed in fp16 term by term (k = 0, 1, ...), from `init`
    (broadcast to the output; zeros when None). Inputs fp16; result fp16."""
    shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    acc = torch.zeros(shape, dtype=torch.float32)
    if init is not None:
        acc += init.to(torch.float16).float()
    a32, b32 = a.float(), b.float()
    half = torch.empty(shape, dtype=torch.float16)
    for k in range(a.shape[-1]):
        torch.addcmul(acc, a32[..., k:k + 1], b32[..., k:k + 1, :], out=acc)
        half.copy_(acc)
        acc.copy_(half)
    return half


def _conv(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Convolution 1-D as unfold + sequential_mm over (tap, channel) terms, tap-major as XNNPACK's
    indirect GEMM walks them. A transposed convolution is the plain one over the stride-dilated
    input with the flipped kernel: the inserted zeros add exact zeros."""
    if x.dim() != 3:
        raise NotImplementedError("fp16 accumulation emulates 1-D convolutions only")
    if transposed:
        s, p, d, op = stride[0], padding[0], dilation[0], output_padding[0]
        cin, cpg, k = w.shape                      # [Cin, Cout/groups, K]
        n, _, t = x.shape
        up = x.new_zeros(n, cin, (t - 1) * s + 1)
        up[..., ::s] = x
        wt = w.reshape(groups, cin // groups, cpg, k).transpose(1, 2).reshape(groups * cpg, cin // groups, k)
        edge = d * (k - 1) - p
        up = F.pad(up, (edge, edge + op))
        return _conv(up, wt.flip(-1), bias, (1,), (0,), (d,), False, (0,), groups)
    s, p, d = stride[0], padding[0], dilation[0]
    x = F.pad(x, (p, p))
    cout, cpg, k = w.shape
    n, _, t = x.shape
    tout = (t - d * (k - 1) - 1) // s + 1
    outs = []
    for g in range(groups):
        xg = x[:, g * cpg:(g + 1) * cpg]
        taps = [xg[:, :, j * d: j * d + (tout - 1) * s + 1: s] for j in range(k)]   # [N, cpg, Tout] each
        cols = torch.cat(taps, dim=1)                                                 # tap-major terms
        wg = w[g * (cout // groups):(g + 1) * (cout // groups)].permute(0, 2, 1).reshape(cout // groups, k * cpg)
        init = None if bias is None else bias[g * (cout // groups):(g + 1) * (cout // groups), None]
        outs.append(sequential_mm(wg[None], cols, init))
    return torch.cat(outs, dim=1)


def _is_half(*ts) -> bool:
    return all(isinstance(t, torch.Tensor) and t.dtype == torch.float16 for t in ts)


class Fp16Accumulation(TorchDispatchMode):
    """Within the block, fp16 mm / addmm / bmm / convolution sum in fp16 as XNNPACK does on
    AVX512-FP16 and Arm64 fp16 hosts; `count` maps each emulated op to how many ran."""

    def __init__(self):
        super().__init__()
        self.count: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self._emulated(func, args, kwargs)
        if out is None:
            return func(*args, **kwargs)
        self.count[func.__name__] = self.count.get(func.__name__, 0) + 1
        return out

    @staticmethod
    def _emulated(func, args, kwargs):
        if func is aten.mm.default and _is_half(*args[:2]):
            return sequential_mm(args[0], args[1])
        if func is aten.bmm.default and _is_half(*args[:2]):
            return sequential_mm(args[0], args[1])
        if func is aten.addmm.default and _is_half(*args[:3]) \
                and kwargs.get("beta", 1) == 1 and kwargs.get("alpha", 1) == 1:
            return sequential_mm(args[1], args[2], args[0])
        if func is aten.convolution.default and _is_half(args[0], args[1]):
            return _conv(*args)
        return None
