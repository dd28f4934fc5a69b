"""HTP-safe op rewrites, applied to an ExportedProgram before lowering.

Each rewrite replaces one ATen op by a composition of ops the HTP computes accurately in fp16 and
in fixed point. Rewrites know ops, never models. The pipeline checks each rewritten graph against
the original in fp32 (>= 100 dB SNR, else the rewrite is not used) and records the figure.

sin_poly: HTP's fp16 `sin` loses ~40 dB on audio vocoders (SnakeBeta, FACTS.md). Replace it by a
range reduction to [-pi/2, pi/2] and an odd Taylor polynomial to z^11 (truncation error below
6e-8 on that interval):  r = x - 2*pi*round(x / (2*pi));  a = |r|;  z = pi/2 - |a - pi/2|;
sin(x) = sign(r) * z * P(z^2).   (sin(a) = sin(pi - a) folds [pi/2, pi] onto [0, pi/2].)

conv_polyphase: the HTP's strided Conv1d returned wrong values on some long inputs (QNN 2.51
simulator, fp16, kernel 2s, padding s/2: stride 3 over 16000 / 20001 samples 3.5 / 4.5 dB while 12001
and 16385 score 69 dB; stride 15 over 24001 samples -1.2 dB; stride 1 and kernel == stride convs fine
at 40001). The strided conv becomes a stride-1 conv over the input folded into its `stride` phases.

pow_mul: x ** 2 on HTP fp16 scored 25 dB after the polynomial sin (x * x: 58 dB); small integer
powers become repeated multiplies.

sin_dense: `sin` is the HTP's dearest elementwise op (QNN 2.51 simulator, fp16, profiled cycles
per element: sin ~300 on a wide activation, round ~70, abs ~1.4), and far dearer on an [N, C, T]
activation with few channels: ~1700 at 6 channels, ~3000 at 3, as the layout's tiles mostly hold
padding. The vocoders' SnakeBeta runs it over every activation of the upsampling stack, whose last
blocks are that narrow (the demo Code2Wav's sin was 69 % of its 4.0 G simulated cycles). A `sin`
over fewer than 8 channels runs on the same values flattened, zero-padded and viewed as
[1, 64, n]; only the layout differs, not one value. Snake over 3 channels x 23127 samples: 252 ->
86 M cycles; 6 x 71040: 850 -> 305 M; at 12 channels the two layout changes cost what the sin saves
(24 -> 27 M), so wider ones stay. A polynomial in cheap ops does not help: the scalar adds of its
Horner steps cost ~60 cycles per element and its small products reach fp16 subnormals, which the
simulator computes slowly (sin_poly: 2-4x the cycles of sin).

act_barrier: the HTP compiler fuses MatMul / Conv + sigmoid, tanh, GELU or SiLU into a fp16
epilogue that costs 15-25 dB (QNN 2.51 simulator: sigmoid(linear(x)) 48 dB, tanh(linear(x)) 44 dB,
GELU 51 dB, against 66-73 dB for the same activation on its own). An exact x * 2 * 0.5 in front of
the activation (power-of-two scalings are exact in floating point) keeps it a separate op:
sigmoid 67 dB, tanh 69 dB, GELU 64 dB.
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


# The dense shape [1, DENSE_ROWS, n], n a multiple of DENSE_COLS (the flattened values zero-padded).
DENSE_ROWS, DENSE_COLS = 64, 32
# Below this many channels the dense sin pays for its two layout changes (simulated cycles of
# Snake: 3 channels 252 -> 86 M, 6 channels 850 -> 305 M, 12 channels 24 -> 27 M).
NARROW_CHANNELS = 8


def _narrow(val) -> bool:
    """An [N, C, T] activation with so few channels that the HTP's tiles mostly hold padding."""
    return isinstance(val, torch.Tensor) and val.dim() == 3 and val.shape[1] < NARROW_CHANNELS


def _narrow_sin(node) -> bool:
    val = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
    return _narrow(val)


def dense_sin(graph, node) -> None:
    """Run a narrow `sin` node on its input flattened, zero-padded and viewed as [1, DENSE_ROWS, n];
    its users get the result cut and viewed back. A graph pass: a decomposition of aten.sin could
    not call aten.sin itself."""
    if not _narrow_sin(node):
        return
    aten = torch.ops.aten
    x, val = node.args[0], node.args[0].meta["val"]
    numel, block = val.numel(), DENSE_ROWS * DENSE_COLS
    padded = -(-numel // block) * block
    steps_in = [(aten.reshape.default, ([numel],))]
    if padded > numel:
        steps_in.append((aten.constant_pad_nd.default, ([0, padded - numel], 0.0)))
    steps_in.append((aten.view.default, ([1, DENSE_ROWS, padded // DENSE_ROWS],)))
    steps_out = [(aten.view.default, ([padded],))]
    if padded > numel:
        steps_out.append((aten.slice.Tensor, (0, 0, numel)))
    steps_out.append((aten.view.default, (list(val.shape),)))

    def chain(src, steps):
        cur, v = src, src.meta["val"]
        for op, args in steps:
            v = op(v, *args)
            cur = graph.call_function(op, (cur, *args))
            cur.meta = {**src.meta, "val": v}
        return cur

    with graph.inserting_before(node):
        dense = chain(x, steps_in)
    node.args = (dense, *node.args[1:])
    node.meta = {**node.meta, "val": aten.sin.default(dense.meta["val"])}
    users = list(node.users)
    with graph.inserting_before(node.next):         # in order, right after the sin
        back = chain(node, steps_out)
    for user in users:
        user.replace_input_with(node, back)


def pow_mul(x: torch.Tensor, exponent) -> torch.Tensor:
    """x ** n for small integer n as repeated multiplication; any other exponent stays pow."""
    if isinstance(exponent, (int, float)) and float(exponent).is_integer() and 1 <= exponent <= 4:
        y = x
        for _ in range(int(exponent) - 1):
            y = y * x
        return y
    return torch.ops.aten.pow.Tensor_Scalar(x, exponent)


def conv_polyphase(x, weight, bias=None, stride=(1,), padding=(0,), dilation=(1,), groups=1):
    """A strided Conv1d as a stride-1 Conv1d over the input folded into `stride` phases per channel
    (space-to-depth): y[t] = sum_k w[k] x[s t + k] with k = s j + phase is a kernel-ceil(K/s) conv of
    X[c s + phase, m] = x[c, s m + phase]. The same sums in the same precision; any other conv stays."""
    s, p, d = (v[0] if isinstance(v, (list, tuple)) else v for v in (stride, padding, dilation))
    if s == 1 or d != 1 or groups != 1 or x.dim() != 3:
        # aten.convolution, not conv1d: this function is conv1d's decomposition
        return torch.ops.aten.convolution.default(x, weight, bias, list(_seq(stride)), list(_seq(padding)),
                                                  list(_seq(dilation)), False, [0], groups)
    n, c, length = x.shape
    o, _, k = weight.shape
    t = (length + 2 * p - k) // s + 1
    kp = -(-k // s)
    m = t + kp - 1                                   # folded length the stride-1 conv reads
    right = s * m - length - p
    x = torch.nn.functional.pad(x, (p, max(right, 0)))[..., :s * m]
    x = x.reshape(n, c, m, s).permute(0, 1, 3, 2).reshape(n, c * s, m)
    w = torch.nn.functional.pad(weight, (0, kp * s - k)).reshape(o, c, kp, s).permute(0, 1, 3, 2)
    return torch.ops.aten.convolution.default(x, w.reshape(o, c * s, kp), bias, [1], [0], [1], False, [0], 1)


def _seq(v):
    return v if isinstance(v, (list, tuple)) else (v,)


def _strided_conv1d(node) -> bool:
    """A conv1d node conv_polyphase changes: stride > 1, no dilation, one group."""
    args = list(node.args) + [None] * 7
    stride, dilation, groups = args[3] or [1], args[5] or [1], args[6] or 1
    val = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
    return (_seq(stride)[0] > 1 and _seq(dilation)[0] == 1 and groups == 1
            and (val is None or val.dim() == 3))


@dataclass(frozen=True)
class Rewrite:
    name: str
    op: object                      # the ATen overload replaced (or a tuple of them for graph passes)
    fn: Callable                    # a decomposition, or a graph pass (graph, node) -> None
    doc: str
    graph_pass: bool = False
    # which matching nodes the rewrite changes (counted as replaced); None: all of them
    when: Callable | None = None
    # the ONNX op types the replaced op exports as: a QNN failure on one names this rewrite (qnn_diagnose)
    onnx_ops: tuple[str, ...] = ()


def barrier(graph, node) -> None:
    """Feed `node` its first input through an exact x * 2 * 0.5."""
    x = node.args[0]
    with graph.inserting_before(node):
        a = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2.0))
        b = graph.call_function(torch.ops.aten.mul.Tensor, (a, 0.5))
    a.meta, b.meta = dict(x.meta), dict(x.meta)
    node.args = (b, *node.args[1:])


ACTIVATIONS = (torch.ops.aten.sigmoid.default, torch.ops.aten.tanh.default, torch.ops.aten.gelu.default,
               torch.ops.aten.silu.default)


REWRITES: dict[str, Rewrite] = {
    "sin_poly": Rewrite("sin_poly", torch.ops.aten.sin.default, sin_poly,
                        "sin -> range reduction to [-pi/2, pi/2] + odd polynomial to z^11", onnx_ops=("Sin",)),
    "sin_dense": Rewrite("sin_dense", torch.ops.aten.sin.default, dense_sin,
                         "sin over an [N, C, T] activation with fewer than 8 channels -> the same sin over "
                         "its values flattened and viewed as [1, 64, n]: sin is the HTP's dearest elementwise "
                         "op, ~10x dearer in a narrow layout (Snake over 3 channels: 519 -> 34 M simulated "
                         "cycles, same SNR)",
                         graph_pass=True, when=_narrow_sin),          # keeps the Sin: avoids no failure on it
    "pow_mul": Rewrite("pow_mul", torch.ops.aten.pow.Tensor_Scalar, pow_mul,
                       "x ** n (n = 2..4) -> repeated multiply; HTP's fp16 Pow loses ~30 dB on x ** 2", onnx_ops=("Pow",)),
    "conv_polyphase": Rewrite("conv_polyphase", torch.ops.aten.conv1d.default, conv_polyphase,
                              "strided Conv1d -> stride-1 Conv1d over the input folded into its phases; the "
                              "HTP's strided conv broke on long inputs (QNN 2.51 simulator, fp16: stride 3 over "
                              "16000 samples 3.5 dB, stride 15 over 24001 -1.2 dB; stride 1 68.7 dB)",
                              when=_strided_conv1d, onnx_ops=("Conv",)),
    "act_barrier": Rewrite("act_barrier", ACTIVATIONS, barrier,
                           "sigmoid / tanh / GELU / SiLU fed through an exact x*2*0.5, so the HTP does not "
                           "fuse them into a MatMul/Conv epilogue (15-25 dB lost there)", graph_pass=True,
                           onnx_ops=("Sigmoid", "Tanh", "Gelu", "Erf")),
}


def count_op(ep, op, when: Callable | None = None) -> int:
    ops = op if isinstance(op, tuple) else (op,)
    return sum(1 for n in ep.graph.nodes if n.op == "call_function" and n.target in ops and (when is None or when(n)))


def apply(ep, names: tuple[str, ...]):
    """Return (rewritten program, {rewrite name: ops replaced}). Unknown names raise KeyError.
    Decompositions run first (one pass), then graph passes on a copy of the program."""
    import copy

    counts, table, passes = {}, {}, []
    for name in names:
        rw = REWRITES[name]
        counts[name] = count_op(ep, rw.op, rw.when)
        if counts[name] and rw.graph_pass:
            passes.append(rw)
        elif counts[name]:
            table[rw.op] = rw.fn
    if table:
        ep = ep.run_decompositions(table)
    if passes:
        # copy the graph, share the weights (a plain deepcopy held a second copy of every weight:
        # +2.1 GiB RssAnon for the 0.6B talker); the passes only add and rewire nodes
        import torch

        shared = [*ep.state_dict.values(), *ep.constants.values(), *ep.graph_module.parameters(),
                  *ep.graph_module.buffers()]
        shared += [v for v in vars(ep.graph_module).values() if isinstance(v, torch.Tensor)]
        ep = copy.deepcopy(ep, {id(t): t for t in shared if isinstance(t, torch.Tensor)})
        g = ep.graph_module.graph
        for rw in passes:
            ops = rw.op if isinstance(rw.op, tuple) else (rw.op,)
            for node in [n for n in g.nodes if n.op == "call_function" and n.target in ops]:
                rw.fn(g, node)
        ep.graph_module.recompile()
    return ep, counts
