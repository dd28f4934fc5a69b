"""Matrix products as sums of short ones, for fp16 programs run by XNNPACK.

XNNPACK's fp16 kernels on phones (Arm64 with fp16 arithmetic) and on AVX512-FP16 x86 hosts keep one
fp16 accumulator per output and round after every term (omni_export/exporters/fp16acc.py). The
rounding error grows with the number of terms: one 0.6B linear of 1024 / 3072 inputs scores ~46 /
~42 dB against fp32, and the 0.6B talker, predictor and text projection .pte builds scored 33-40 dB
on such a host. Splitting the reduction into slices of at most SUM_TERMS terms, each its own product,
and adding the partial results (pairwise in `linear` and SplitConv, as one short sum in SplitLinear)
bounds every accumulator's run: ~56 dB per product at 128 terms (docs/fp16-pte.md).

Every helper here returns the plain op for inputs that are not fp16 (fp32 programs, ONNX and QNN
traces keep their forms), and the split forms use only ops XNNPACK delegates (slice, linear /
convolution with constant weights, add, pad, transpose), so a program stays one XNNPACK partition.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SUM_TERMS = 128


def spans(n: int, width: int | None = None) -> list[tuple[int, int]]:
    """[(start, end)) slices of range(n), `width` (default SUM_TERMS, read at the call) long."""
    width = width or SUM_TERMS
    return [(a, min(a + width, n)) for a in range(0, n, width)]


def pairwise(parts: list[torch.Tensor]) -> torch.Tensor:
    """parts[0] + parts[1] + ..., added as a balanced tree (each partial sum rounds once per level)."""
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, bias); for fp16 with more than SUM_TERMS inputs, the pairwise sum of F.linear over
    slices of the inputs (the bias joins the first). For a computed `w` (a gathered head): slicing a
    constant weight makes a computed one, which XNNPACK's linear does not take; use SplitLinear."""
    k = x.shape[-1]
    if x.dtype != torch.float16 or k <= SUM_TERMS:
        return F.linear(x, w, bias)
    return pairwise([F.linear(x[..., a:b], w[:, a:b], bias if a == 0 else None) for a, b in spans(k)])


class SplitLinear(nn.Module):
    """An fp16 nn.Linear whose outputs sum more than SUM_TERMS products, as S = ceil(in / SUM_TERMS)
    short sums and their sum, in two ops with constant weights:

      a 1x1 convolution of S groups: group s multiplies input slice s (zero-padded to SUM_TERMS) by
        the weight's columns s, giving S partial products per output (the bias starts the first);
      a linear with a row of ones over the S partials of each output (a sum of S terms).

    The same short sums as F.linear over slices and pairwise adds (`linear`), with 2 ops per layer
    instead of ~3 S: ExecuTorch lowered a 0.6B-width pair of decoder layers in 8.9 CPU-s, against
    23.4 for the slices (5.4 unsplit; 59.5 / 59.9 / 50.3 dB on an AVX512-FP16 host, docs/fp16-pte.md)."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        w = layer.weight.detach()
        out, k = w.shape
        self.groups, self.pad, self.out = len(spans(k)), -k % SUM_TERMS, out
        if self.pad:
            w = F.pad(w, (0, self.pad))
        w = w.reshape(out, self.groups, SUM_TERMS).transpose(0, 1)
        self.register_buffer("weight", w.reshape(self.groups * out, SUM_TERMS, 1).contiguous())
        layer.weight = None             # the layer's own copy goes now, not when the caller drops the layer
        bias = None
        if layer.bias is not None:
            bias = torch.cat([layer.bias.detach(), layer.bias.new_zeros((self.groups - 1) * out)])
        self.register_buffer("bias", bias)
        self.register_buffer("ones", torch.ones(1, self.groups, dtype=w.dtype))

    def forward(self, x):
        lead, s = x.shape[:-1], self.groups
        x = x.reshape(1, -1, x.shape[-1])
        if self.pad:
            x = F.pad(x, (0, self.pad))
        y = F.conv1d(x.transpose(1, 2), self.weight, self.bias, groups=s)          # [1, S * out, N]
        y = y.transpose(1, 2).reshape(1, -1, s, self.out).transpose(-1, -2)      # [1, N, out, S]
        return F.linear(y, self.ones).reshape(*lead, self.out)


class SplitConv(nn.Module):
    """An fp16 nn.Conv1d / nn.ConvTranspose1d of one group whose output sums more than SUM_TERMS terms
    (input channels x taps reaching an output: K for a convolution, ceil(K / stride) transposed), as the
    pairwise sum of the same convolution over slices of the input channels."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.transposed = isinstance(layer, nn.ConvTranspose1d)
        k, s = layer.kernel_size[0], layer.stride[0]
        reach = -(-k // s) if self.transposed else k
        self.slices = spans(layer.in_channels, max(1, SUM_TERMS // reach))
        w = layer.weight.detach()
        for i, (a, b) in enumerate(self.slices):          # [Cout, Cin, K] / transposed [Cin, Cout, K]
            self.register_buffer(f"w{i}", (w[a:b] if self.transposed else w[:, a:b]).contiguous())
        del layer.weight

    def forward(self, x):
        m = self.layer
        parts = []
        for i, (a, b) in enumerate(self.slices):
            w, bias = getattr(self, f"w{i}"), m.bias if i == 0 else None
            if self.transposed:
                parts.append(F.conv_transpose1d(x[:, a:b], w, bias, m.stride, m.padding, m.output_padding, 1,
                                                m.dilation))
            else:
                parts.append(F.conv1d(x[:, a:b], w, bias, m.stride, m.padding, m.dilation, 1))
        return pairwise(parts)


def terms(layer: nn.Module) -> int:
    """How many products one output of `layer` sums."""
    if isinstance(layer, nn.Linear):
        return layer.in_features
    k, s = layer.kernel_size[0], layer.stride[0]
    per_group = layer.in_channels // layer.groups
    return per_group * (-(-k // s) if isinstance(layer, nn.ConvTranspose1d) else k)


def split_sums(module: nn.Module) -> int:
    """Replace, in place, every Linear / one-group Conv1d / ConvTranspose1d of `module` (fp16) whose
    outputs sum more than SUM_TERMS products by its split form. Returns how many were replaced; a layer
    reachable twice is replaced by one shared module."""
    done: dict[int, nn.Module] = {}

    def walk(m: nn.Module) -> None:
        for name, child in list(m.named_children()):
            if id(child) in done:
                setattr(m, name, done[id(child)])
            elif type(child) in (nn.Linear, nn.Conv1d, nn.ConvTranspose1d) and terms(child) > SUM_TERMS \
                    and (type(child) is nn.Linear or child.groups == 1):
                done[id(child)] = SplitLinear(child) if type(child) is nn.Linear else SplitConv(child)
                setattr(m, name, done[id(child)])
            else:
                walk(child)

    walk(module)
    return len(done)
