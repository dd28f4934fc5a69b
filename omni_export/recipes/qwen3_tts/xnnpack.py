"""Ops written in forms XNNPACK delegates, for the recipe's ExecuTorch programs (same values).

An ExecuTorch program lowers as one XNNPACK partition only when every op between its inputs and
outputs is one XNNPACK takes; each op it does not take splits the graph, and ExecuTorch's lowering is
quadratic in the partitions (each re-legalises the whole graph): in the plain forms the 0.6B talker
decode graph lowered in 226 partitions, its fp16 .pte in 250-380 s, and in ~100 s as one. While a graph is traced through
`XnnpackForms` (`Forms.on`), the recipe's modules write:

- a mean over the last axis as a matmul with a 1/n row (XNNPACK's mean only averages 4-D inputs over
  the last two dims), in fp16 as sums of at most halfsums.SUM_TERMS products (phones' XNNPACK sums
  fp16 products in fp16: docs/fp16-pte.md);
- attention's products as 3-D bmm (a 4-D matmul lowers to expand_copy, which XNNPACK does not take);
- SiLU as x * sigmoid(x) (F.silu on fp16 decomposes to an fp32 SiLU between two casts);
- in fp16, GELU as x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (its tanh form; XNNPACK has no fp16
  GELU): at most 4.7e-4 from the erf form (at x = -2.7), under half an fp16 step of any input past
  |x| = 1; computed in fp16, at most 2.0e-3 from the erf form of its fp16 input over [-12, 12]
  (PyTorch's own fp16 GELU: 1.0e-3), one fp16 step of an output near 2;
- an upsampled frame mask as a matmul with a column of ones (expand is not taken).

Every other trace (ONNX, QNN, eager) keeps the plain forms.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...halfsums import SUM_TERMS, pairwise, spans

GELU_TANH = 2.0 * math.sqrt(2.0 / math.pi)


class Forms:
    """The trace's state: on while an `XnnpackForms` module runs."""
    on = False
    rows: dict = {}          # (n, width) -> the tracing module's [1, width] buffer of 1/n
    ones: dict = {}          # factor -> the tracing module's [factor, 1] buffer of ones

    @classmethod
    def row(cls, n: int, width: int, dtype=None):
        r = cls.rows[n, width]
        return r if dtype is None or r.dtype == dtype else r.to(dtype)


def mean_last(x: torch.Tensor) -> torch.Tensor:
    """x.mean(-1, keepdim=True); in the forms, a matmul with a 1/n row (short sums in fp16)."""
    if not Forms.on:
        return x.mean(-1, keepdim=True)
    n = x.shape[-1]
    if x.dtype == torch.float16 and n > SUM_TERMS:    # short fp16 sums (omni_export/halfsums.py)
        return pairwise([F.linear(x[..., a:b], Forms.row(n, b - a)) for a, b in spans(n)])
    return F.linear(x, Forms.row(n, n, x.dtype))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x) if Forms.on else F.silu(x)


def gelu(x: torch.Tensor) -> torch.Tensor:
    if Forms.on and x.dtype == torch.float16:
        return x * torch.sigmoid(GELU_TANH * (x + 0.044715 * (x * x * x)))
    return F.gelu(x)


def repeat_last(x: torch.Tensor, factor: int) -> torch.Tensor:
    """[..., t] -> [..., t * factor], each element `factor` times, as a matmul with a column of ones
    (in the forms only: XnnpackForms holds the columns)."""
    *lead, t = x.shape
    ones = Forms.ones[factor]
    return F.linear(x.reshape(*lead, t, 1), ones if ones.dtype == x.dtype else ones.to(x.dtype)).reshape(*lead, t * factor)


class XnnpackForms(nn.Module):
    """`inner` traced in XNNPACK forms (same values). The constants the forms read are its buffers:
    a 1/n row for each mean width (modules with a `mean_width`), whole and in the slices of an fp16
    trace's short sums (a slice of a constant is a computed weight, which XNNPACK's linear does not
    take), and a column of ones for each factor of `repeat_factors` (modules that list theirs)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        widths = sorted({m.mean_width for m in inner.modules() if hasattr(m, "mean_width")})
        self.rows = sorted({(n, n) for n in widths} | {(n, b - a) for n in widths if n > SUM_TERMS
                                                       for a, b in spans(n)})
        for n, w in self.rows:
            self.register_buffer(f"mean_row{n}" if w == n else f"mean_row{n}_{w}", torch.full((1, w), 1.0 / n))
        self.factors = sorted({f for m in inner.modules() for f in getattr(m, "repeat_factors", ()) if f > 1})
        for f in self.factors:
            self.register_buffer(f"ones{f}", torch.ones(f, 1))

    def forward(self, *args):
        Forms.on = True
        Forms.rows = {(n, w): getattr(self, f"mean_row{n}" if w == n else f"mean_row{n}_{w}") for n, w in self.rows}
        Forms.ones = {f: getattr(self, f"ones{f}") for f in self.factors}
        try:
            return self.run(*args)
        finally:
            Forms.on, Forms.rows, Forms.ones = False, {}, {}

    def run(self, *args):
        return self.inner(*args)
