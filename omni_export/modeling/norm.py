"""RMSNorm with a loaded weight, written weight * x / sqrt(mean(x^2) + eps).

The same value as upstream's x * rsqrt(.), but QNN's HTP runs the quantized (w8a16) Rsqrt badly.
Measured on the simulator (RMSNorm + Linear, soc 69, w8a16): rsqrt 7.4 dB vs 42.6 dB on ORT CPU for
the same QDQ file; 1 / sqrt 31.9 dB on both. On Spark's layer-0 input norm alone (tiny demo, QNN 2.51)
the Reciprocal of the small-range sqrt output scored 3.6 dB where the Div scores 32 dB."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))
