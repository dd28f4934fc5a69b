"""ExecuTorch: XNNPACK .pte at fp32, fp16, PT2E static int8 (w8a8) and int8 weight-only (w8a16).

Knows the format, never the model. Inputs and outputs stay fp32/int32 at the boundary; casts to
fp16 happen inside the program, so every .pte is called the same way.

w8a16 here means int8 per-channel weights stored in the program and dequantized at run time into
fp16 compute (16-bit float activations): XNNPACK has no 16-bit integer activations. Those
dequantized layers run on ExecuTorch's portable kernels, not XNNPACK: small, not fast.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..core import Precision
from .patches.fx_passes import fast_passes, skip_idle_decompositions, skip_idle_retraces
from .patches.xnnpack_preprocess import conv_weights_keep_fp16, preprocess_shares_weights

SCHEMES = {
    Precision.FP32: "fp32, XNNPACK",
    Precision.FP16: "fp16 weights and compute, XNNPACK (fp32 I/O, cast inside)",
    Precision.W8A8: "PT2E static int8: per-channel symmetric int8 weights, int8 activations "
                    "(HistogramObserver), XNNPACKQuantizer",
    Precision.W8A16: "int8 per-channel weight-only, dequantized to fp16 compute at run time "
                     "(portable kernels; XNNPACK has no int16 activations)",
}


# PT2E w8a8: calibration calls run through the prepared model. XNNPACK's symmetric config observes
# activations with HistogramObserver, ~ms per observer per call: Spark's demo decode graph (256
# captured calls) took 188 s to lower with all of them.
PT2E_CALIBRATION_CALLS = 64


def _spread(calls: Sequence, limit: int):
    """At most `limit` of `calls`, evenly spaced (first and last kept), read one at a time."""
    if len(calls) <= limit:
        yield from calls
        return
    import numpy as np

    for i in np.linspace(0, len(calls) - 1, limit).round().astype(int):
        yield calls[int(i)]


class _CastIO(nn.Module):
    """Float inputs -> dtype inside the program, float outputs -> fp32."""

    def __init__(self, inner: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, *args):
        args = [a.to(self.dtype) if a.is_floating_point() else a for a in args]
        out = self.inner(*args)
        if isinstance(out, tuple):
            return tuple(o.float() if o.is_floating_point() else o for o in out)
        return out.float() if out.is_floating_point() else out


class _Int8Weight(nn.Module):
    """A Linear / Conv1d / ConvTranspose1d whose weight is stored int8 per output channel.

    Applied in ops XNNPACK takes. XNNPACK has no weight-only int8 kernel and its linear and
    convolution want a constant weight, not the dequantized one computed here; as portable ops
    they split the program into one XNNPACK partition per layer (the 0.6B talker decode: ~200, and
    ExecuTorch's lowering is quadratic in them) and the portable conv kernels run code2wav's
    chunks in minutes. XNNPACK does take a bmm of two computed tensors, so:
      Linear           x @ W^T as one bmm;
      Conv1d           (stride 1, groups 1, no padding: the recipes pad outside) the K taps'
                       shifted slices of x stacked on the channel axis, one bmm with W as
                       [Cout, K * Cin]; depthwise (groups = channels) as K multiply-adds;
      ConvTranspose1d  (groups 1, no padding) one bmm gives every tap's [Cout, T] product; taps
                       are interleaved s at a time (stride s) and the ceil(K / s) phases
                       overlap-added with pads.
    Other configurations keep F.conv1d / F.conv_transpose1d. The int8 -> compute dtype casts read
    only constants and run before the delegate."""

    def __init__(self, layer: nn.Module, hessian=None):
        super().__init__()
        self.kind = type(layer).__name__
        self.layer = layer
        self.rounding = None
        w = layer.weight.detach()
        axis = 1 if self.kind == "ConvTranspose1d" else 0
        dims = [d for d in range(w.dim()) if d != axis]
        scale = w.abs().amax(dim=dims, keepdim=True).clamp(min=1e-12) / 127.0
        if hessian is not None and self.kind == "Linear":      # GPTQ on the same grid (exporters/gptq.py)
            from .gptq import round_rows

            ints, self.rounding = round_rows(w.double().numpy(), hessian, scale.double().numpy()[:, 0], -127, 127)
            wq = torch.from_numpy(ints).to(torch.int8)
        else:
            wq = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        self.form = self._form(layer)
        if self.form == "bmm":                     # [in, out]
            wq, scale = wq.t().contiguous(), scale.reshape(1, -1)
        elif self.form == "taps":                  # [Cout, K * Cin], tap-major columns
            cout, cin, k = wq.shape
            wq, scale = wq.permute(0, 2, 1).reshape(cout, k * cin).contiguous(), scale.reshape(cout, 1)
        elif self.form == "depthwise":             # [K, C, 1]
            wq, scale = wq.permute(2, 0, 1).contiguous(), scale.reshape(1, -1, 1)
        elif self.form == "phases":                # [P * s * Cout, Cin], rows (tap, out)
            cin, cout, k = wq.shape
            s = layer.stride[0]
            taps = -(-k // s) * s
            wide = torch.zeros(cin, cout, taps, dtype=wq.dtype)
            wide[:, :, :k] = wq
            wq = wide.permute(2, 1, 0).reshape(taps * cout, cin).contiguous()
            scale = scale.reshape(1, cout).repeat(taps, 1).reshape(taps * cout, 1)
        self.register_buffer("wq", wq)
        self.register_buffer("scale", scale)
        del layer.weight

    @staticmethod
    def _form(m: nn.Module) -> str:
        kind = type(m).__name__
        if kind == "Linear":
            return "bmm"
        plain = m.padding == (0,) and m.stride == (1,) if kind == "Conv1d" else \
            m.padding == (0,) and m.output_padding == (0,) and m.dilation == (1,)
        if kind == "Conv1d" and plain and m.groups == 1:
            return "taps"
        if kind == "Conv1d" and plain and m.groups == m.in_channels == m.out_channels:
            return "depthwise"
        if kind == "ConvTranspose1d" and plain and m.groups == 1:
            return "phases"
        return "conv"

    def forward(self, x):
        w = self.wq.to(x.dtype) * self.scale.to(x.dtype)
        m = self.layer
        bias = None if m.bias is None else m.bias.to(x.dtype)
        if self.form == "bmm":
            k, n = w.shape
            y = torch.bmm(x.reshape(1, -1, k), w.reshape(1, k, n)).reshape(*x.shape[:-1], n)
            return y if bias is None else y + bias
        if self.form != "conv" and x.shape[0] == 1:
            if self.form == "phases":
                y = self._transposed(x, w)
            else:
                k, d = m.kernel_size[0], m.dilation[0]
                t = x.shape[-1] - (k - 1) * d
                # one tap (a 1x1 conv) reads x as it is: a whole-length slice is an alias_copy and a
                # cat of one tensor a copy, neither an op XNNPACK takes (each split the program)
                taps = [x] if k == 1 else [x[:, :, j * d: j * d + t] for j in range(k)]
                if self.form == "taps":
                    y = torch.bmm(w.reshape(1, *w.shape), taps[0] if k == 1 else torch.cat(taps, dim=1))
                else:
                    y = taps[0] * w[0:1]
                    for j in range(1, k):
                        y = y + taps[j] * w[j:j + 1]
            return y if bias is None else y + bias.reshape(1, -1, 1)
        w = self._plain_weight(w)
        if self.kind == "Conv1d":
            return F.conv1d(x, w, bias, m.stride, m.padding, m.dilation, m.groups)
        return F.conv_transpose1d(x, w, bias, m.stride, m.padding, m.output_padding, m.groups, m.dilation)

    def _transposed(self, x, w):
        m = self.layer
        s, k, cout = m.stride[0], m.kernel_size[0], m.out_channels
        t = x.shape[-1]
        phases = w.shape[0] // (s * cout)
        z = torch.bmm(w.reshape(1, *w.shape), x).reshape(phases, s, cout, t)
        y = None
        for p in range(phases):
            # taps p*s .. p*s+s-1 write samples t*s + p*s + j: interleave them, shift by p*s
            part = z[p:p + 1].reshape(s, cout, t).permute(1, 2, 0).reshape(1, cout, t * s)
            part = F.pad(part, (p * s, (phases - 1 - p) * s))
            y = part if y is None else y + part
        n = (t - 1) * s + k
        return y if y.shape[-1] == n else y[..., :n]        # a whole-length slice: an alias_copy, not an XNNPACK op

    def _plain_weight(self, w):
        """The dequantized weight in the layer's own layout (for the F.conv fallback)."""
        m = self.layer
        if self.form == "taps":
            cout, cin, k = m.out_channels, m.in_channels, m.kernel_size[0]
            return w.reshape(cout, k, cin).permute(0, 2, 1)
        if self.form == "depthwise":
            return w.permute(1, 2, 0)
        if self.form == "phases":
            cin, cout, k, s = m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0]
            return w.reshape(-1, cout, cin).permute(2, 1, 0)[:, :, :k]
        return w


def _int8_weights(module: nn.Module, hessians: dict | None = None, prefix: str = "") -> int:
    n = 0
    for name, child in list(module.named_children()):
        if type(child) in (nn.Linear, nn.Conv1d, nn.ConvTranspose1d):
            setattr(module, name, _Int8Weight(child, (hessians or {}).get(prefix + name)))
            n += 1
        else:
            n += _int8_weights(child, hessians, f"{prefix}{name}.")
    return n


# XNNPACK's partitioner (executorch 1.5.1) merges candidate groups pairwise with a cycle check over
# transitive users: quadratic. On the fused predictor frame (15 unrolled steps, ~7500 nodes) it
# ran > 5 min and > 5 GiB on the tiny demo. Past this many nodes, partitions are formed in one
# pass instead (`level_partitions`).
LEVEL_PARTITION_NODES = 4000


def level_partitions(graph, supported: set) -> dict:
    """Supported call_function nodes -> partition index, in one topological pass.

    A supported node joins the highest partition among its inputs; an unsupported node sits one
    above the supported nodes it reads, so anything downstream of it lands in a later partition.
    Each index is then convex (no path leaves it through an unsupported node and comes back), and
    the indices are as few as a single pass can make them: an unsupported op that reads only
    inputs or constants (a gather of an input, a mask built from constants) opens no new one."""
    level = {}
    for n in graph.nodes:
        ins = n.all_input_nodes
        if n.op != "call_function":
            level[n] = 0
        elif n in supported:
            level[n] = max((level[i] for i in ins), default=0)
        else:
            level[n] = max((level[i] + (i in supported) for i in ins), default=0)
    return {n: level[n] for n in graph.nodes if n.op == "call_function" and n in supported}


def _level_xnnpack_partitioner():
    """XnnpackPartitioner with its own per-op support checks; partitions from `level_partitions`,
    each with the constants its ops read (one partition each; to_backend copies shared ones)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.backend.canonical_partitioners.config_partitioner import is_constant_data
    from torch.fx.passes.infra.partitioner import Partition

    class Level(XnnpackPartitioner):
        def generate_partitions(self, ep):
            supported = {n for g in self.get_matched_nodes_from_configs(ep) for n in g
                         if n.op == "call_function"}
            parts: dict[int, Partition] = {}
            for node, lv in level_partitions(ep.graph_module.graph, supported).items():
                parts.setdefault(lv, Partition(id=lv)).add_node(node)
            taken = set()
            for part in parts.values():
                for node in list(part.nodes):
                    for arg in node.all_input_nodes:
                        if arg.op == "placeholder" and arg not in taken and is_constant_data(ep, arg):
                            part.add_node(arg)
                            taken.add(arg)
            return list(parts.values())

    return Level()


def _layer_norm_as_means(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """aten.layer_norm as mean / sub / mul / rsqrt, ops XNNPACK delegates. ExecuTorch 1.5.1 runs
    layer_norm on its own kernel, which accumulates fp16 inputs in fp16: an fp16 .pte of
    nn.LayerNorm(256) scored 3 dB against fp32 (1024 wide, 3 dB; 24 wide, 70 dB), and Code2Wav's
    ConvNeXt norms at the 0.6B widths made its whole fp16 .pte score -4 dB. This form: 66 dB."""
    dims = tuple(range(-len(normalized_shape), 0))
    xc = x - x.mean(dims, keepdim=True)
    y = xc * torch.rsqrt((xc * xc).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _fp16_safe(program):
    """The program with every layer_norm decomposed into `_layer_norm_as_means` (other ops kept).
    A program without one is returned as is: run_decompositions retraces the whole program."""
    op = torch.ops.aten.layer_norm.default
    if not any(n.op == "call_function" and n.target is op for n in program.graph.nodes):
        return program
    return program.run_decompositions({op: _layer_norm_as_means})


def _lower(program, path: Path) -> dict:
    """Write `program` as an XNNPACK .pte; returns how it was delegated, for the manifest: XNNPACK
    partitions (`xnnpack_delegates`; each op XNNPACK does not take between two others splits the
    graph, and the lowering re-legalises the graph per partition) and the ops left to ExecuTorch's
    portable kernels (`portable_ops`)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    big = len(program.graph.nodes) > LEVEL_PARTITION_NODES
    partitioner = _level_xnnpack_partitioner() if big else XnnpackPartitioner()
    with conv_weights_keep_fp16():         # fp16 convolution weights stored as fp16, not fp32
        edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
        calls = [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
        et = edge.to_executorch()
    delegates = sum("executorch_call_delegate" in c for c in calls)
    portable = sum("executorch_call_delegate" not in c and "getitem" not in c for c in calls)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        # streamed from the serialized pieces: `et.buffer` joins them into one more contiguous copy of
        # the whole program (and keeps it), a copy of every weight at the lowering's peak
        et.write_to_file(f)
    return {"xnnpack_delegates": delegates, "portable_ops": portable}


# ExecuTorch's memoised values that hold no program of ours: XNNPACK's pattern graphs (each a few
# small modules exported and lowered to edge: ConvertToSDPAPass and ConvertToUpsampleBilinear2d
# rebuilt them in every .pte job, ~5 s of a small graph's lowering) and the flatbuffer schema.
KEPT_CACHES = frozenset({
    "executorch.backends.xnnpack.partition.graphs.sdpa.get_graphs",
    "executorch.backends.xnnpack.partition.graphs.bilinear_2d._get_bilinear_2d_graphs",
    "executorch.exir._serialize._flatbuffer_program._install_fast_packers",
    "executorch.exir._serialize._flatbuffer_program._patch_generated_flatbuffer_aliases",
    "executorch.exir._serialize._flatbuffer_program._get_schema_info",
})


def release_lowering_caches() -> None:
    """Drop what torch and ExecuTorch keep of the last lowered program. Two globals hold it, with the
    fp16 / int8 copy of every weight: XNNPACK's partitioner configs keep a module-level WhyNoPartition
    whose `node` is the last node it rejected (its graph holds the lowered modules and their
    ExportedPrograms), exir.backend.utils memoises `is_same_node` on graph nodes in an unbounded
    lru_cache, and FakeTensorMode's class-level dispatch cache keys hold the delegate call's
    lowered module. Lowering the 0.6B talker decode graph to an fp16 .pte left 197 fp16 parameters
    (0.83 GB) alive and RssAnon 2.0 GiB above its start after gc; every .pte build added to it."""
    import functools
    import gc
    import sys

    from executorch.exir.backend.utils import WhyNoPartition

    from ..memory import trim_heap
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name, mod in list(sys.modules.items()):
        if name.startswith("executorch.") and mod is not None:
            for key, value in list(vars(mod).items()):
                if isinstance(value, WhyNoPartition):
                    value.node = None
                elif isinstance(value, functools._lru_cache_wrapper) and f"{name}.{key}" not in KEPT_CACHES:
                    value.cache_clear()
    FakeTensorMode.cache_clear()
    gc.collect()
    trim_heap()


def _copy(module: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of `module` to convert without touching the original: its floating-point parameters and
    buffers are new tensor objects over the same memory (dtype None: shared, to be replaced or
    converted in the copy -- Module.half() sets `.data` of the copy's own objects) or already
    converted to `dtype`. copy.deepcopy held a second fp32 copy of every weight first: 1.76 GB for
    the 0.6B talker, 3.4 GB at 1.7B, on top of the fp16 one. A tensor that views another of the
    module's tensors (a block of rows of a flat buffer registered beside it) stays a view of that
    tensor's copy instead of becoming a converted copy of its own."""
    memo = {}
    for t in sorted(list(module.parameters()) + list(module.buffers()), key=lambda t: t._base is not None):
        if id(t) in memo:
            continue
        data, base = t.detach(), t._base
        if dtype is not None and data.is_floating_point():
            if base is not None and id(base) in memo and base.is_contiguous():
                b = memo[id(base)]
                data = b.detach().as_strided(t.shape, t.stride(),
                                             b.storage_offset() + t.storage_offset() - base.storage_offset())
            else:
                data = data.to(dtype)
        memo[id(t)] = nn.Parameter(data, requires_grad=False) if isinstance(t, nn.Parameter) else data
    out = copy.deepcopy(module, memo)
    return out.to(dtype) if dtype is not None else out


def fp16_program(module: nn.Module) -> tuple[nn.Module, dict]:
    """The module an fp16 .pte is exported from: an fp16 copy, fp32 I/O, every Linear / convolution
    whose outputs sum more than halfsums.SUM_TERMS products split into short sums (phones' XNNPACK
    accumulates fp16 products in fp16: docs/fp16-pte.md). With what the manifest records of it."""
    from ..halfsums import SUM_TERMS, split_sums

    m = _copy(module, torch.float16)
    n = split_sums(m)
    return _CastIO(m, torch.float16).eval(), {"terms_per_sum": SUM_TERMS, "layers_split": n}


def _int_safe(quantizer_cls):
    """The quantizer, except that integer add / mul keep their scalar operands. XNNPACKQuantizer's
    transform_for_annotation turns every scalar operand of add / mul into a float tensor constant,
    integer ones too: the Qwen3-TTS predictor decode step's int32 `step + 1` became float and its
    w8a8 .pte failed calibration ("Tensor dtype mismatch! Expected: Int, Got: float")."""

    class IntSafe(quantizer_cls):
        def transform_for_annotation(self, model):
            kept = []
            for n in model.graph.nodes:
                val = n.meta.get("val")
                if (n.op == "call_function" and n.target in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
                        and isinstance(val, torch.Tensor) and not val.dtype.is_floating_point):
                    kept.append((n, n.target))
                    n.target = _hidden_from_annotation
            try:
                return super().transform_for_annotation(model)
            finally:
                for n, target in kept:
                    n.target = target

    IntSafe.__name__ = IntSafe.__qualname__ = f"IntSafe{quantizer_cls.__name__}"
    return IntSafe


def _hidden_from_annotation(*args, **kwargs):     # a stand-in target, never called
    raise AssertionError("a node hidden from the quantizer's annotation transform was run")


def export_pte(module: nn.Module, example: Sequence[torch.Tensor], path: Path, precision: Precision,
               calibration: Sequence[Sequence[torch.Tensor]] = (), weight_rounding: str = "nearest",
               consume: bool = False) -> dict:
    """Write a .pte; returns details for the manifest. Quantized builds need calibration args.
    `weight_rounding` "gptq" rounds the w8a16 int8 weights of Linear layers by GPTQ over the
    calibration args (exporters/gptq.py); the PT2E w8a8 build keeps its quantizer's rounding.
    `consume`: the caller will not use `module` again, so the fp16 and w8a16 builds free its
    floating-point weights once they hold their converted copy (`release_weights`): at 0.6B the
    talker's 1.77 GB of fp32 weights were alive through its whole fp16 lowering."""
    from .gptq import check_method

    check_method(weight_rounding)
    try:
        with fast_passes(), skip_idle_retraces(), skip_idle_decompositions(), preprocess_shares_weights():
            return _export_pte(module, example, path, precision, calibration, weight_rounding, consume)
    finally:
        release_lowering_caches()


def release_weights(*modules: nn.Module) -> None:
    """Point every floating-point parameter and buffer of `modules` at an empty tensor: the memory is
    freed unless another tensor still views it (a converted copy made by `_copy` has its own)."""
    for module in modules:
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point() and t.numel():
                t.data = torch.empty(0, dtype=t.dtype)


def _export_pte(module: nn.Module, example: Sequence[torch.Tensor], path: Path, precision: Precision,
                calibration: Sequence[Sequence[torch.Tensor]] = (), weight_rounding: str = "nearest",
                consume: bool = False) -> dict:
    example = tuple(example)
    details = {"scheme": SCHEMES[precision]}
    given = module

    def converted():            # the converted copy exists: the fp32 weights may go (`consume`)
        if consume:
            release_weights(given, module)
            from ..memory import trim_heap

            trim_heap()

    variant = getattr(module, "executorch_variant", None)
    if callable(variant):
        # the same function in ops XNNPACK delegates; parity still scores the .pte against the
        # original module's fp32 outputs
        module = variant()
        details["module_variant"] = type(module).__name__
    if precision == Precision.FP32:
        details.update(_lower(torch.export.export(module, example), path))
    elif precision == Precision.FP16:
        m, details["fp16_sums"] = fp16_program(module)
        converted()
        details.update(_lower(_fp16_safe(torch.export.export(m, example)), path))
    elif precision == Precision.W8A16:
        inner = _copy(module)
        hessians = None
        if weight_rounding == "gptq":
            if not calibration:
                raise ValueError("GPTQ weight rounding needs calibration data; none was given")
            from .gptq import linear_hessians

            linears = [n for n, m in inner.named_modules() if type(m) is nn.Linear]
            hessians = linear_hessians(inner, calibration, linears)
        details["int8_layers"] = _int8_weights(inner, hessians)
        details["weight_rounding"] = "nearest"
        if hessians is not None:
            from .gptq import summary

            records = [m.rounding for m in inner.modules() if isinstance(m, _Int8Weight) and m.rounding]
            details["weight_rounding"] = {"method": "gptq", **summary(records, details["int8_layers"] - len(records))}
            del hessians
        m = _CastIO(_copy(inner, torch.float16), torch.float16).eval()
        converted()
        details.update(_lower(_fp16_safe(torch.export.export(m, example)), path))
    elif precision == Precision.W8A8:
        if not calibration:
            raise ValueError("w8a8 needs calibration data; none was given")
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer, get_symmetric_quantization_config)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = _int_safe(XNNPACKQuantizer)().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(torch.export.export(module, example).module(), quantizer)
        with torch.no_grad():
            for args in _spread(calibration, PT2E_CALIBRATION_CALLS):
                prepared(*args)
        converted = convert_pt2e(prepared)
        details.update(_lower(torch.export.export(converted, example), path))
        details["calibration_samples"] = min(len(calibration), PT2E_CALIBRATION_CALLS)
        if len(calibration) > PT2E_CALIBRATION_CALLS:
            details["calibration_note"] = (f"{PT2E_CALIBRATION_CALLS} of {len(calibration)} captured calls, "
                                           f"evenly spread (HistogramObserver costs ~ms per observer per call)")
    else:
        raise ValueError(f"no ExecuTorch scheme for {precision}")
    return details
