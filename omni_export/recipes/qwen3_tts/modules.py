"""Export-friendly Qwen3-TTS modules that load the official tensor names.

Code2Wav decodes one static streaming chunk: codes [1, Q, T] (T = left context L + chunk N frames)
and a frame mask [1, T] (1 = real frame, 0 = padding) -> waveform [1, 1, N * 1920]: the samples of
the N new frames, the only ones the host keeps. The transformer attends over all T frames; after it
every layer is causal with a short reach, so each block crops its input to the samples that can
still reach the new frames' output (`crop_to_chunk`). That is exact, and the conv decoder, where the
largest tensors live, runs on N + ~10 frames instead of T (its last block on ~N frames).
Every table (codebooks, RoPE, attention mask pattern) is a constant fixed at build time. The mask
zeroes padded frames before every time-mixing op and hides them from attention, which makes a
chunk with less than L frames of context decode exactly as upstream's `chunked_decode` does for
its shorter first chunks (the decoder is causal, so right padding never reaches earlier samples).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import attend
from ...blocks import Block, BlockChain
from ...modeling.rope import rope_table
from .checkpoint import Code2WavConfig
from .xnnpack import Forms, XnnpackForms, gelu, mean_last, repeat_last, silu

# Additive attention mask value. Finite and moderate so that quantized graphs keep a fine
# activation scale on the masked scores (exp(-100) is 0 in fp16 and 4e-44 in fp32).
MASK_VALUE = -100.0


def _load(module: nn.Module, tensors: dict, prefix: str) -> None:
    """Copy tensors named `prefix + param` into module params (all must exist)."""
    state = {}
    for name, _ in module.named_parameters():
        key = prefix + name
        if key not in tensors:
            raise KeyError(f"tensor '{key}' missing for {type(module).__name__}")
        state[name] = tensors[key]
    module.load_state_dict(state, strict=False)


def mask_at(frame_mask: torch.Tensor, factor: int) -> torch.Tensor:
    """[1, T] frame mask -> [1, 1, T * factor] sample mask at an upsampled resolution."""
    b, t = frame_mask.shape
    if factor == 1:
        return frame_mask.reshape(b, 1, t)
    if Forms.on:            # expand is not an op XNNPACK takes (xnnpack.py)
        return repeat_last(frame_mask.reshape(b, 1, t), factor)
    return frame_mask.reshape(b, 1, t, 1).expand(b, 1, t, factor).reshape(b, 1, t * factor)


def tail(x: torch.Tensor, n: int | None) -> torch.Tensor:
    """The last n samples of the time axis (all of them when n is None)."""
    return x if n is None else x[..., x.shape[-1] - n:]


class CausalConv1d(nn.Module):
    """Left-padded conv (stride 1): output length equals input length."""

    def __init__(self, cin: int, cout: int, k: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, dilation=dilation, groups=groups)
        self.pad = (k - 1) * dilation

    def forward(self, x):
        return self.conv(F.pad(x, (self.pad, 0)))


class CausalConvTranspose1d(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, k, stride=stride)
        self.trim = k - stride

    def forward(self, x):
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim] if self.trim else y


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta) + 1e-9) * sin(x * exp(alpha))^2 with exp() folded into constants at load."""

    def __init__(self, ch: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(ch))
        self.beta = nn.Parameter(torch.zeros(ch))
        self.register_buffer("freq", torch.ones(1, ch, 1), persistent=False)
        self.register_buffer("inv_mag", torch.ones(1, ch, 1), persistent=False)

    def fold(self) -> None:
        with torch.no_grad():
            self.freq.copy_(torch.exp(self.alpha).reshape(1, -1, 1))
            self.inv_mag.copy_((1.0 / (torch.exp(self.beta) + 1e-9)).reshape(1, -1, 1))

    def forward(self, x):
        return x + self.inv_mag * torch.sin(x * self.freq).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, ch: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(ch)
        self.conv1 = CausalConv1d(ch, ch, 7, dilation=dilation)
        self.act2 = SnakeBeta(ch)
        self.conv2 = CausalConv1d(ch, ch, 1)

    def forward(self, x, m):
        h = self.conv1(self.act1(x) * m)
        return x + self.conv2(self.act2(h))


# --------------------------------------------------------------------------- blocks

class RVQDecode(Block):
    """codes [1, Q, T] -> [1, codebook_dim, T] through one folded table [Q * bins, codebook_dim].

    Upstream: per codebook, embedding_sum / clamp(cluster_usage, 1e-5) gathered, summed within the
    semantic (1) and acoustic (Q-1) groups, each group through its 1x1 output_proj. The projection
    is linear and bias-free, so it folds into each codebook's table.
    """

    def __init__(self, c: Code2WavConfig):
        super().__init__()
        self.q, self.bins = c.num_quantizers, c.codebook_size
        self.register_buffer("table", torch.zeros(self.q * self.bins, c.codebook_dim))
        self.register_buffer("offsets", (torch.arange(self.q, dtype=torch.int32) * self.bins).reshape(1, -1, 1))

    def fold(self, t: dict) -> None:
        rows = []
        for i in range(self.q):
            group, j = ("rvq_first", i) if i == 0 else ("rvq_rest", i - 1)
            base = f"quantizer.{group}.vq.layers.{j}._codebook."
            emb = t[base + "embedding_sum"] / t[base + "cluster_usage"].clamp(min=1e-5)[:, None]
            proj = t[f"quantizer.{group}.output_proj.weight"][:, :, 0]     # [dim, dim/2]
            rows.append(emb @ proj.T)
        with torch.no_grad():
            self.table.copy_(torch.cat(rows, 0))

    def forward(self, codes):
        b, q, t = codes.shape
        idx = (codes + self.offsets).reshape(b, q * t)
        emb = F.embedding(idx, self.table)                    # [b, q*t, dim]
        emb = emb.reshape(b, q, t, -1).sum(dim=1)             # [b, t, dim]
        return emb.transpose(1, 2)


class PreConv(Block):
    def __init__(self, c: Code2WavConfig):
        super().__init__()
        self.pre_conv = CausalConv1d(c.codebook_dim, c.latent_dim, 3)

    def forward(self, h, frame_mask):
        return self.pre_conv(h * mask_at(frame_mask, 1))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    @property
    def mean_width(self) -> int:            # XnnpackForms' 1/n rows
        return self.weight.shape[0]

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(mean_last(x.pow(2)) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def forward(self, x, cos, sin, bias):
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if Forms.on:        # grouped heads folded into rows, products as 3-D bmm (xnnpack.py)
            out = attend(q, k, v, bias, bmm=True).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
            return self.o_proj(out)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * (self.head_dim ** -0.5) + bias
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, c: Code2WavConfig):
        super().__init__()
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                   c.attn_head_dim, c.attention_bias)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(c.hidden_size)
        self.mlp_layer_scale = LayerScale(c.hidden_size)

    def forward(self, x, cos, sin, bias):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, bias))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(Block):
    """Sliding-window causal transformer over the chunk; static RoPE and mask-pattern tables."""

    def __init__(self, c: Code2WavConfig, frames: int):
        super().__init__()
        self.input_proj = nn.Linear(c.latent_dim, c.hidden_size)
        self.output_proj = nn.Linear(c.hidden_size, c.latent_dim)
        self.layers = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        cos, sin = rope_table(frames, c.attn_head_dim, c.rope_theta)
        self.register_buffer("cos", cos[None, None], persistent=False)
        self.register_buffer("sin", sin[None, None], persistent=False)
        i = torch.arange(frames)[:, None]
        j = torch.arange(frames)[None, :]
        allowed = (j <= i) & (i - j < c.sliding_window)
        # Past keys are allowed when they are real frames; a frame always sees itself, so padded
        # query rows stay well defined (never fully masked) without touching the real rows.
        self.register_buffer("past", (allowed & (j < i)).float()[None, None], persistent=False)
        self.register_buffer("self_", (j == i).float()[None, None], persistent=False)

    def forward(self, h, frame_mask):
        keys = frame_mask.reshape(frame_mask.shape[0], 1, 1, -1)       # [1, 1, 1, T]
        bias = (1.0 - self.past * keys - self.self_) * MASK_VALUE      # [1, 1, T, T]
        x = self.input_proj(h.transpose(1, 2))
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, bias)
        return self.output_proj(self.norm(x)).transpose(1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    @property
    def mean_width(self) -> int:            # XnnpackForms' 1/n rows
        return self.norm.normalized_shape[-1]

    def _norm(self, h):
        """The layer norm; in XNNPACK forms (xnnpack.py) its two means as matmuls (XNNPACK has no
        layer norm, and its mean takes only 4-D inputs)."""
        if not Forms.on:
            return self.norm(h)
        d = h - mean_last(h)
        return d * torch.rsqrt(mean_last(d * d) + self.norm.eps) * self.norm.weight + self.norm.bias

    def forward(self, x, m):
        h = self.dwconv(x * m).transpose(1, 2)
        h = self.pwconv2(gelu(self.pwconv1(self._norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class _AtScale(Block):
    """A block after the transformer, at `scale` samples per frame in, `scale * factor` out: the
    frame mask repeats it reads (XnnpackForms' columns of ones)."""
    scale: int = 1
    factor: int = 1

    @property
    def repeat_factors(self) -> tuple[int, int]:
        return self.scale, self.scale * self.factor


class Upsample(_AtScale):
    """Causal transposed conv (x factor) + ConvNeXt block, at `scale` samples per frame so far."""

    keep: int | None = None     # input samples kept (crop_to_chunk)

    def __init__(self, dim: int, factor: int, scale: int):
        super().__init__()
        self.up = CausalConvTranspose1d(dim, dim, factor, factor)
        self.block = ConvNeXtBlock(dim)
        self.scale, self.factor = scale, factor

    def reach(self, need: int) -> int:
        """Left context (input samples) that `need` samples of output left context depend on."""
        return -(-(need + 6) // self.factor)         # dwconv k=7; transposed k = stride: no overlap

    def forward(self, h, frame_mask):
        h = self.up(tail(h, self.keep) * tail(mask_at(frame_mask, self.scale), self.keep))
        out = None if self.keep is None else self.keep * self.factor
        return self.block(h, tail(mask_at(frame_mask, self.scale * self.factor), out))


class ConvIn(_AtScale):
    keep: int | None = None

    def __init__(self, cin: int, cout: int, scale: int):
        super().__init__()
        self.conv = CausalConv1d(cin, cout, 7)
        self.scale, self.factor = scale, 1

    def reach(self, need: int) -> int:
        return need + 6

    def forward(self, h, frame_mask):
        return self.conv(tail(h, self.keep) * tail(mask_at(frame_mask, self.scale), self.keep))


class DecoderBlock(_AtScale):
    """SnakeBeta -> causal transposed conv (x rate) -> residual units, dilations 1 / 3 / 9."""

    keep: int | None = None
    DILATIONS = (1, 3, 9)

    def __init__(self, cin: int, cout: int, rate: int, scale: int):
        super().__init__()
        self.act = SnakeBeta(cin)
        self.up = CausalConvTranspose1d(cin, cout, 2 * rate, rate)
        self.units = nn.ModuleList(ResidualUnit(cout, d) for d in self.DILATIONS)
        self.scale, self.rate, self.factor = scale, rate, rate

    def reach(self, need: int) -> int:
        # units: k=7 convs at dilations 1, 3, 9; transposed k = 2 * stride: one more input sample
        return -(-(need + 6 * sum(self.DILATIONS)) // self.rate) + 1

    def forward(self, h, frame_mask):
        h = self.up(self.act(tail(h, self.keep)) * tail(mask_at(frame_mask, self.scale), self.keep))
        m = tail(mask_at(frame_mask, self.scale * self.rate), None if self.keep is None else self.keep * self.rate)
        for unit in self.units:
            h = unit(h, m)
        return h


class ConvOut(_AtScale):
    keep: int | None = None
    out: int | None = None      # output samples kept: the chunk's new frames

    def __init__(self, cin: int, scale: int):
        super().__init__()
        self.act = SnakeBeta(cin)
        self.conv = CausalConv1d(cin, 1, 7)
        self.scale, self.factor = scale, 1

    def reach(self, need: int) -> int:
        return need + 6

    def forward(self, h, frame_mask):
        x = self.act(tail(h, self.keep)) * tail(mask_at(frame_mask, self.scale), self.keep)
        return tail(self.conv(x), self.out).clamp(-1.0, 1.0)


def crop_to_chunk(blocks: list[Block], frames: int, new: int) -> None:
    """Make the causal blocks after the transformer keep only the input samples that reach the
    last `new` frames' output: walking back from the output, each block's left reach (its kernel
    taps, dilations and transposed-conv overlap) adds to the context the blocks after it need."""
    need = 0
    for block in reversed(blocks):
        need = block.reach(need)
        keep = new * block.scale + need
        block.keep = keep if keep < frames * block.scale else None
    blocks[-1].out = new * blocks[-1].scale


class Code2Wav(BlockChain):
    def executorch_variant(self) -> nn.Module:
        """The same function in ops XNNPACK delegates (xnnpack.py): one partition after the codebook
        lookup, where the plain forms lowered the demo's fp16 chunk in 23 (each RMS / layer-norm mean,
        GQA repeat, fp16 SiLU / GELU and frame-mask repeat split the graph)."""
        return XnnpackForms(self).eval()


def build_code2wav(c: Code2WavConfig, tensors: dict, frames: int, new: int | None = None) -> BlockChain:
    """The Code2Wav chunk graph for `frames` = L + N frames, loaded from `decoder.*` tensors. With
    `new` = N the graph outputs only the last N frames' samples (cropped, exact); else all of them."""
    io = ("h", "frame_mask")
    rvq = RVQDecode(c).named(("codes",), ("h",))
    rvq.fold(tensors)
    blocks: list[tuple[str, Block, str]] = [
        ("pre_conv", PreConv(c).named(io, ("h",)), ""),
        ("pre_transformer", PreTransformer(c, frames).named(io, ("h",)), "pre_transformer."),
    ]
    scale = 1
    for j, factor in enumerate(c.upsampling_ratios):
        up = Upsample(c.latent_dim, factor, scale).named(io, ("h",))
        blocks.append((f"upsample.{j}", up, f"upsample.{j}."))
        scale *= factor
    blocks.append(("decoder.0", ConvIn(c.latent_dim, c.decoder_dim, scale).named(io, ("h",)), "decoder.0."))
    for i, rate in enumerate(c.upsample_rates):
        cin, cout = c.decoder_dim // 2 ** i, c.decoder_dim // 2 ** (i + 1)
        blk = DecoderBlock(cin, cout, rate, scale).named(io, ("h",))
        blocks.append((f"decoder.{i + 1}", blk, f"decoder.{i + 1}.block."))
        scale *= rate
    n = len(c.upsample_rates) + 1
    out = ConvOut(c.decoder_dim // 2 ** len(c.upsample_rates), scale).named(io, ("wav",))
    blocks.append(("decoder.out", out, ""))

    for name, block, prefix in blocks:
        _load_block(block, tensors, name, prefix, n)
    if new is not None and new < frames:
        crop_to_chunk([b for name, b, _ in blocks if name.startswith(("upsample.", "decoder."))], frames, new)
    chain = Code2Wav(("codes", "frame_mask"), ("wav",), [("rvq", rvq)] + [(n_, b) for n_, b, _ in blocks])
    for m in chain.modules():
        if isinstance(m, SnakeBeta):
            m.fold()
    return chain.eval()


def _load_block(block: Block, t: dict, name: str, prefix: str, n_out: int) -> None:
    """Map our parameter names onto the official ones (most are identical below a prefix)."""
    mapping = {}
    for pname, _ in block.named_parameters():
        mapping[pname] = prefix + _official_suffix(name, pname, n_out)
    missing = [v for v in mapping.values() if v not in t]
    if missing:
        raise KeyError(f"tensor 'decoder.{missing[0]}' missing for block {name}")
    block.load_state_dict({k: t[v] for k, v in mapping.items()}, strict=False)


def _official_suffix(block: str, pname: str, n_out: int) -> str:
    if block == "pre_conv":
        return pname                                   # pre_conv.conv.weight
    if block.startswith("upsample."):
        return pname.replace("up.", "0.", 1).replace("block.", "1.", 1)
    if block.startswith("decoder.") and block not in ("decoder.0", "decoder.out"):
        pname = pname.replace("act.", "0.", 1).replace("up.", "1.", 1)
        if pname.startswith("units."):
            _, u, rest = pname.split(".", 2)
            pname = f"{int(u) + 2}.{rest}"
        return pname
    if block == "decoder.out":       # act -> decoder.{n}; conv (CausalConv1d) -> decoder.{n+1}
        return pname.replace("act.", f"decoder.{n_out}.", 1).replace("conv.", f"decoder.{n_out + 1}.", 1)
    if block == "decoder.0":
        return pname.removeprefix("conv.")
    return pname


def frames_to_samples(c: Code2WavConfig, frames: int) -> int:
    return frames * c.samples_per_frame


__all__ = ["build_code2wav", "crop_to_chunk", "mask_at", "MASK_VALUE", "math"]
