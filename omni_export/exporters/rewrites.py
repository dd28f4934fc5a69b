"""HTP-safe op rewrites, applied to an ExportedProgram before lowering.

Each rewrite replaces one ATen op by a composition of ops the HTP computes accurately in fp16 and
in fixed point. Rewrites know ops, never models. The pipeline checks each rewritten graph against
the original in fp32 (>= 100 dB SNR, else the rewrite is not used) and records the figure.

sin_poly: HTP's fp16 `sin` loses ~40 dB on audio vocoders (SnakeBeta, FACTS.md). Replace it by a
range reduction to [-pi/2, pi/2] and an odd Taylor polynomial to z^11 (truncation error below
6e-8 on that interval):  r = x - 2*pi*round(x / (2*pi));  a = |r|;  z = pi/2 - |a - pi/2|;
sin(x) = sign(r) * z * P(z^2).   (sin(a) = sin(pi - a) folds [pi/2, pi] onto [0, pi/2].)

pow_mul: x ** 2 on HTP fp16 scored 25 dB after the polynomial sin (x * x: 58 dB); small integer
powers become repeated multiplies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

_TWO_PI = 2.0 * math.pi
_HALF_PI = 0.5 * math.pi
# Taylor coefficients of sin(z)/z in z^2, highest first (Horner).
_SIN_COEFFS = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(5, -1, -1))


def sin_poly(x: torch.Tensor) -> torch.Tensor:
    r = x - torch.round(x * (1.0 / _TWO_PI)) * _TWO_PI
    z = _HALF_PI - torch.abs(torch.abs(r) - _HALF_PI)
    z2 = z * z
    p = torch.full_like(z2, _SIN_COEFFS[0])
    for c in _SIN_COEFFS[1:]:
        p = p * z2 + c
    return torch.sign(r) * z * p


def pow_mul(x: torch.Tensor, exponent) -> torch.Tensor:
    """x ** n for small integer n as repeated multiplication; any other exponent stays pow."""
    if isinstance(exponent, (int, float)) and float(exponent).is_integer() and 1 <= exponent <= 4:
        y = x
        for _ in range(int(exponent) - 1):
            y = y * x
        return y
    return torch.ops.aten.pow.Tensor_Scalar(x, exponent)


@dataclass(frozen=True)
class Rewrite:
    name: str
    op: object                      # the ATen overload replaced
    fn: Callable[[torch.Tensor], torch.Tensor]
    doc: str


REWRITES: dict[str, Rewrite] = {
    "sin_poly": Rewrite("sin_poly", torch.ops.aten.sin.default, sin_poly,
                        "sin -> range reduction to [-pi/2, pi/2] + odd polynomial to z^11"),
    "pow_mul": Rewrite("pow_mul", torch.ops.aten.pow.Tensor_Scalar, pow_mul,
                       "x ** n (n = 2..4) -> repeated multiply; HTP's fp16 Pow loses ~30 dB on x ** 2"),
}


def count_op(ep, op) -> int:
    return sum(1 for n in ep.graph.nodes if n.op == "call_function" and n.target == op)


def apply(ep, names: tuple[str, ...]):
    """Return (rewritten program, {rewrite name: ops replaced}). Unknown names raise KeyError."""
    counts = {}
    table = {}
    for name in names:
        rw = REWRITES[name]
        counts[name] = count_op(ep, rw.op)
        if counts[name]:
            table[rw.op] = rw.fn
    if not table:
        return ep, counts
    return ep.run_decompositions(table), counts
