"""The 12 Hz speech tokenizer's encoder: reference audio -> codes, for in-context (ICL) voice cloning.

Upstream (qwen-tts 0.1.1, `Qwen3TTSTokenizerV2Model.encode`) runs transformers' `MimiModel` encoder
with its decoder half removed, on `speech_tokenizer/model.safetensors` `encoder.*`:

  wav [1, S] at 24 kHz
  -> SEANet conv encoder: causal conv, then per ratio of reversed(upsampling_ratios) residual
     units (ELU, conv k dilated, ELU, conv 1, + skip) and ELU + strided conv (k = 2 * ratio) that
     doubles the channels; ELU + conv to hidden_size                       [1, H, ceil(S / 960)]
  -> transformer at 25 Hz: pre-LayerNorm, causal MHA/GQA with RoPE, GELU MLP, LayerScale
  -> downsample: causal conv k 4 stride 2, replicate padding, no bias      [1, H, ceil(S / 1920)]
     (`latent`, the quantizer's input)
  -> split RVQ: semantic RVQ (num_semantic_quantizers layers) and acoustic RVQ each project the
     *same* latent (1x1 conv) and quantize it residually; codes = semantic then acoustic,
     the first `encoder_valid_num_quantizers` (16) of them                   [frames, 16]

Every pad is causal: constant zeros on the left (kernel - stride), and on the right only what
completes the last stride (replicate for the downsample); so frames = ceil(S / 1920), which is the
count upstream keeps. All padding amounts are Python integers of the static sample count: a fixed
S exports as a static graph with no data-dependent control flow. For a graph that takes references
of any length, `forward(window, length)` runs a zero-padded static window and the valid length as a
tensor: only the strided convs' right pads and the downsample's replicate pad can reach past the
reference's end, so their inputs are masked / clamped there and the first ceil(length / 1920)
frames are upstream's codes of the reference alone (tested through torch.export; a dynamo ONNX
export of it run in onnxruntime gave the same codes).

Two things worth knowing for export and fidelity:
- The nearest-codeword search (the argmin over `_distances`) mirrors torch.cdist's matmul path, which is
  what upstream runs (2048 codewords > 25): d = [-2x, |x|^2, 1] . [e, 1, |e|^2], clamp at 0, sqrt,
  argmin over the codebook. It is the only discrete step; each residual level depends on the codeword
  gathered at the previous one, so the acoustic levels are sequential.
- Upstream's transformer mask is plain causal: transformers 4.57.3's Mimi builds it with
  `create_causal_mask`, so the config's `sliding_window` (250 frames at 25 Hz, 10 s) is not applied.
  We do the same (references longer than 10 s would differ from Kyutai's original Mimi, not from
  upstream).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...core import UsageError
from ...weights import TensorDecl, load_tensors, read_header, refuse_pickles
from .modules import MASK_VALUE, LayerScale
from .checkpoint import TOKENIZER_MODEL_TYPE, _require_type, conv, linear, read_json, speech_tokenizer_dir

PREFIX = "encoder."
CODEBOOK_EPS = 1e-5      # upstream's clamp on cluster_usage


@dataclass(frozen=True)
class SpeechEncoderConfig:
    """`speech_tokenizer/config.json` -> encoder_config (a MimiConfig); defaults are MimiConfig's."""
    sampling_rate: int = 24000
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512        # the decode side's upsample conv (absent here); recorded
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 0                 # 0: hidden_size // num_attention_heads (MimiConfig's fallback)
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    sliding_window: int = 250         # recorded, not applied (upstream does not apply it either)
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    frame_rate: float = 12.5
    valid_num_quantizers: int = 16    # top-level encoder_valid_num_quantizers

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def hop(self) -> int:
        """Samples per 25 Hz transformer frame (the SEANet stride)."""
        return math.prod(self.upsampling_ratios)

    @property
    def downsample_stride(self) -> int:
        return 2

    @property
    def downsample_kernel(self) -> int:
        encodec_rate = math.ceil(self.sampling_rate / self.hop)
        return 2 * int(encodec_rate / self.frame_rate)

    @property
    def samples_per_frame(self) -> int:
        return self.hop * self.downsample_stride

    @property
    def num_acoustic_quantizers(self) -> int:
        return self.num_quantizers - self.num_semantic_quantizers

    @property
    def used_acoustic(self) -> int:
        return self.valid_num_quantizers - self.num_semantic_quantizers

    def frames(self, samples: int) -> int:
        return -(-samples // self.samples_per_frame)

    @classmethod
    def from_json(cls, enc: dict, valid: int, where: str) -> "SpeechEncoderConfig":
        kw = {}
        for f in fields(cls):
            key = f.name
            if key == "valid_num_quantizers":
                v = valid
            elif key == "frame_rate":
                v = enc.get("frame_rate", enc.get("_frame_rate"))
                if v is None:
                    continue
            elif key in enc:
                v = enc[key]
            else:
                continue
            if key == "head_dim" and v is None:
                v = 0
            default = getattr(cls, key)
            if isinstance(default, bool):
                ok = type(v) is bool
            elif isinstance(default, int):
                ok = type(v) is int
            elif isinstance(default, float):
                ok = type(v) in (int, float) and math.isfinite(v)
                v = float(v) if ok else v
            elif isinstance(default, str):
                ok = isinstance(v, str)
            else:
                ok = isinstance(v, list) and all(type(r) is int for r in v)
                v = tuple(v) if ok else v
            if not ok:
                raise UsageError(f"{where}: encoder_config.{key} has the wrong type: {json.dumps(v)[:60]}")
            kw[key] = v
        c = cls(**kw)
        c.validate(where)
        return c

    def validate(self, where: str) -> None:
        def bad(msg: str):
            raise UsageError(f"{where}: encoder_config: {msg}")

        for f in fields(self):
            v = getattr(self, f.name)
            if type(v) is int and f.name != "head_dim" and not 0 < v <= 1 << 16:
                bad(f"{f.name} = {v} must be a positive integer (at most 65536)")
        if not 0 <= self.head_dim <= 1 << 16:
            bad(f"head_dim = {self.head_dim} out of range")
        if not (self.use_causal_conv and self.audio_channels == 1 and not self.use_conv_shortcut
                and self.pad_mode == "constant" and self.hidden_act == "gelu"):
            bad("only the 12 Hz tokenizer's Mimi encoder is supported (causal convs, mono, no conv shortcut, "
                "constant padding, gelu)")
        if not (0 < len(self.upsampling_ratios) <= 8 and all(0 < r <= 64 for r in self.upsampling_ratios)):
            bad("upsampling_ratios: 1 to 8 integers in [1, 64]")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            bad("hidden_size must divide by num_attention_heads, and heads by num_key_value_heads")
        if self.attn_head_dim % 2:
            bad("head_dim must be even (RoPE)")
        if self.hidden_size % self.upsample_groups:
            bad("hidden_size must divide by upsample_groups")
        if self.codebook_dim != self.vector_quantization_hidden_dimension:
            bad("codebook_dim must equal vector_quantization_hidden_dimension")
        if self.num_filters % self.compress:
            bad("num_filters must divide by compress")
        if not 0 < self.num_semantic_quantizers < self.valid_num_quantizers <= self.num_quantizers:
            bad(f"need 0 < num_semantic_quantizers ({self.num_semantic_quantizers}) < "
                f"encoder_valid_num_quantizers ({self.valid_num_quantizers}) <= num_quantizers "
                f"({self.num_quantizers})")
        if not (math.isfinite(self.frame_rate) and self.frame_rate > 0
                and self.downsample_kernel == 2 * self.downsample_stride):
            bad(f"frame_rate {self.frame_rate} must be half the conv frame rate "
                f"{math.ceil(self.sampling_rate / self.hop)} (a stride-2 downsample)")
        if not (self.norm_eps > 0 and self.rope_theta > 0):
            bad("norm_eps and rope_theta must be positive")

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "valid_num_quantizers"}
        d["upsampling_ratios"] = list(self.upsampling_ratios)
        if not self.head_dim:
            d["head_dim"] = None
        d["model_type"] = "mimi"
        return d


# MimiConfig's defaults: the released 12 Hz tokenizer's encoder is a Mimi at these (hidden 512, 64
# filters, 8 layers of 8 heads, 32 quantizers of 2048 x 256; verify against its config.json).
MIMI_SPEECH_ENCODER = SpeechEncoderConfig()
# Small widths, real structure (SEANet ratios, 25 -> 12.5 Hz, 32 quantizers of 2048, 16 kept).
TINY_SPEECH_ENCODER = SpeechEncoderConfig(
    hidden_size=32, num_filters=4, codebook_dim=16, vector_quantization_hidden_dimension=16, upsample_groups=32,
    num_hidden_layers=2, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
)


def speech_encoder_tensors(c: SpeechEncoderConfig) -> dict[str, TensorDecl]:
    """The official `encoder.*` tensor names (without the prefix), shapes and seeded init."""
    t: dict[str, TensorDecl] = {}
    conv(t, "encoder.layers.0.conv", c.num_filters, c.audio_channels, c.kernel_size)
    i, dim = 1, c.num_filters
    for ratio in reversed(c.upsampling_ratios):
        for _ in range(c.num_residual_layers):
            conv(t, f"encoder.layers.{i}.block.1.conv", dim // c.compress, dim, c.residual_kernel_size)
            conv(t, f"encoder.layers.{i}.block.3.conv", dim, dim // c.compress, 1, gain=0.5)
            i += 1
        conv(t, f"encoder.layers.{i + 1}.conv", 2 * dim, dim, 2 * ratio)
        i, dim = i + 2, 2 * dim
    conv(t, f"encoder.layers.{i + 1}.conv", c.hidden_size, dim, c.last_kernel_size)

    h, hd = c.hidden_size, c.attn_head_dim
    for n in range(c.num_hidden_layers):
        p = f"encoder_transformer.layers.{n}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[p + norm + ".weight"] = TensorDecl((h,), ("uniform", 0.8, 1.2))
            t[p + norm + ".bias"] = TensorDecl((h,), ("normal", 0.02))
        linear(t, p + "self_attn.q_proj", c.num_attention_heads * hd, h, bias=c.attention_bias)
        linear(t, p + "self_attn.k_proj", c.num_key_value_heads * hd, h, bias=c.attention_bias)
        linear(t, p + "self_attn.v_proj", c.num_key_value_heads * hd, h, bias=c.attention_bias)
        linear(t, p + "self_attn.o_proj", h, c.num_attention_heads * hd, bias=c.attention_bias)
        linear(t, p + "mlp.fc1", c.intermediate_size, h)
        linear(t, p + "mlp.fc2", h, c.intermediate_size)
        for s in ("self_attn_layer_scale", "mlp_layer_scale"):
            t[p + s + ".scale"] = TensorDecl((h,), ("uniform", 0.1, 0.5))
    t["downsample.conv.weight"] = TensorDecl((h, h, c.downsample_kernel), ("normal", (h * c.downsample_kernel) ** -0.5))

    d = c.vector_quantization_hidden_dimension
    for name, n, used in (("semantic", c.num_semantic_quantizers, c.num_semantic_quantizers),
                          ("acoustic", c.num_acoustic_quantizers, c.used_acoustic)):
        p = f"quantizer.{name}_residual_vector_quantizer."
        if d != h:
            t[p + "input_proj.weight"] = TensorDecl((d, h, 1), ("normal", h ** -0.5))
            # decode side: present in the checkpoint, unused by encode
            t[p + "output_proj.weight"] = TensorDecl((h, d, 1), ("normal", d ** -0.5), False)
        for k in range(n):
            q = f"{p}layers.{k}.codebook."
            t[q + "initialized"] = TensorDecl((1,), ("ones",), False)
            t[q + "cluster_usage"] = TensorDecl((c.codebook_size,), ("uniform", 0.5, 2.0), k < used)
            t[q + "embed_sum"] = TensorDecl((c.codebook_size, c.codebook_dim), ("normal", 0.6), k < used)
    return t


# ---------------------------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------------------------

class PaddedConv(nn.Module):
    """Causal Conv1d as Mimi pads it: left kernel - stride (dilated), right what completes the
    last stride; output length ceil(L / stride)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1, bias: bool = True,
                 mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, stride=stride, dilation=dilation, bias=bias)
        self.left = (k - 1) * dilation + 1 - stride
        self.stride, self.mode = stride, mode

    def forward(self, x):
        right = -x.shape[-1] % self.stride
        if self.left or right:
            x = F.pad(x, (self.left, right), mode=self.mode)
        return self.conv(x)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, hidden: int, k: int, dilation: int):
        super().__init__()
        self.block = nn.ModuleList([nn.ELU(), PaddedConv(dim, hidden, k, dilation=dilation),
                                    nn.ELU(), PaddedConv(hidden, dim, 1)])

    def forward(self, x):
        y = x
        for layer in self.block:
            y = layer(y)
        return x + y


class SEANet(nn.Module):
    def __init__(self, c: SpeechEncoderConfig):
        super().__init__()
        layers: list[nn.Module] = [PaddedConv(c.audio_channels, c.num_filters, c.kernel_size)]
        dim = c.num_filters
        for ratio in reversed(c.upsampling_ratios):
            for j in range(c.num_residual_layers):
                layers.append(ResidualUnit(dim, dim // c.compress, c.residual_kernel_size, c.dilation_growth_rate ** j))
            layers += [nn.ELU(), PaddedConv(dim, 2 * dim, 2 * ratio, stride=ratio)]
            dim *= 2
        layers += [nn.ELU(), PaddedConv(dim, c.hidden_size, c.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x, length=None):
        """`length` (int64 [1], optional): valid samples of a zero-padded window. Only the strided
        convs read past the valid end (upstream pads there with zeros); their inputs are zeroed from
        the valid length of their resolution on. Returns (x, valid length at the output)."""
        for layer in self.layers:
            if length is not None and isinstance(layer, PaddedConv) and layer.stride > 1:
                x = x * (torch.arange(x.shape[-1]) < length).to(x.dtype)
                # a truncating division (lengths are >= 0): floor division exports as a sign
                # correction (Mod, Less, Equal on bools) that the HTP cannot compile
                length = torch.div(length + layer.stride - 1, layer.stride, rounding_mode="trunc")
            x = layer(x)
        return x, length


class Attention(nn.Module):
    def __init__(self, c: SpeechEncoderConfig):
        super().__init__()
        hd, h = c.attn_head_dim, c.hidden_size
        self.heads, self.kv_heads, self.hd = c.num_attention_heads, c.num_key_value_heads, hd
        self.q_proj = nn.Linear(h, self.heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=c.attention_bias)

    def forward(self, x, cos, sin, mask):
        t = x.shape[1]
        q = self.q_proj(x).view(1, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(1, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(1, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.hd ** -0.5 + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.o_proj(out.transpose(1, 2).reshape(1, t, self.heads * self.hd))


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    def __init__(self, c: SpeechEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    def __init__(self, c: SpeechEncoderConfig):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.self_attn_layer_scale = LayerScale(c.hidden_size)
        self.mlp_layer_scale = LayerScale(c.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    def __init__(self, c: SpeechEncoderConfig):
        super().__init__()
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        hd = c.attn_head_dim
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x):
        t = x.shape[1]
        freqs = torch.outer(torch.arange(t, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        # plain causal (see the module docstring: upstream does not apply sliding_window). Upstream
        # masks with float32's lowest value; a constant that large is left unquantized by the QDQ
        # quantizer (a float Add the HTP cannot run in a w8a16 graph): MASK_VALUE (-100) gives the
        # masked keys weights below 4e-44, which change no code
        mask = torch.full((t, t), MASK_VALUE).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return x


def augment(table: torch.Tensor) -> torch.Tensor:
    """[K, D] codewords -> [K, D + 2] rows [e, 1, |e|^2]: the right operand of torch.cdist's matmul
    path, folded once per codebook (a constant of the graph, not rebuilt in it)."""
    return torch.cat([table, torch.ones_like(table[:, :1]), table.pow(2).sum(-1, keepdim=True)], dim=-1)


def _distances(x: torch.Tensor, aug: torch.Tensor) -> torch.Tensor:
    """Distances [T, K] of each row of x [T, D] to each codeword (aug = augment(table)), as
    torch.cdist's matmul path computes them (upstream's numerics, ties included)."""
    xs = x.pow(2).sum(-1, keepdim=True)
    a = torch.cat([x * -2, xs, torch.ones_like(xs)], dim=-1)
    return torch.matmul(a, aug.mT).clamp_min(0).sqrt()


def _margin(d: torch.Tensor) -> torch.Tensor:
    """The gap between the two nearest codewords' distances [T] (the decision's margin)."""
    two = torch.topk(d, 2, dim=-1, largest=False).values
    return two[:, 1] - two[:, 0]


class RVQ(nn.Module):
    """Projection + residual quantization over `n` stacked codebooks [n, K, D] (constants)."""

    def __init__(self, c: SpeechEncoderConfig, n: int):
        super().__init__()
        d = c.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(c.hidden_size, d, 1, bias=False) if d != c.hidden_size else None
        self.register_buffer("codebooks", torch.zeros(n, c.codebook_size, c.codebook_dim))
        self.fold()

    def fold(self) -> None:
        """Per-level constants the forward reads (not saved): each table and its augment(), so the
        graph gathers no level out of the stacked codebooks."""
        for i, table in enumerate(self.codebooks):
            self.register_buffer(f"table{i}", table.clone(), persistent=False)
            self.register_buffer(f"aug{i}", augment(table), persistent=False)

    def forward(self, latent, margins: bool = False):     # [1, H, T] -> codes [T, n] (, margins [T, n])
        x = self.input_proj(latent) if self.input_proj is not None else latent
        residual = x[0].transpose(0, 1)        # [T, D]
        codes, gaps = [], []
        for i in range(self.codebooks.shape[0]):
            d = _distances(residual, getattr(self, f"aug{i}"))
            idx = d.argmin(dim=-1)
            residual = residual - getattr(self, f"table{i}")[idx]
            codes.append(idx)
            if margins:
                gaps.append(_margin(d))
        if margins:
            return torch.stack(codes, dim=-1), torch.stack(gaps, dim=-1)
        return torch.stack(codes, dim=-1)


class SpeechEncoder(nn.Module):
    """wav [1, S] (24 kHz, float32) -> codes [ceil(S / 1920), valid_num_quantizers] (int64).

    With `length` (int64 [1]): wav is a static window whose first `length` samples are the reference
    and the rest zeros; codes [ceil(S / 1920), Q] of which the first ceil(length / 1920) are
    upstream's codes of the reference alone, the last partial frame included (the rest is padding
    for the host to drop). Everything is causal, so only the right padding of each strided conv
    and the downsample's replicate pad can see past the valid end; those are masked / clamped."""

    def __init__(self, c: SpeechEncoderConfig):
        super().__init__()
        self.config = c
        self.encoder = SEANet(c)
        self.encoder_transformer = Transformer(c)
        self.downsample = PaddedConv(c.hidden_size, c.hidden_size, c.downsample_kernel,
                                     stride=c.downsample_stride, bias=False, mode="replicate")
        self.semantic = RVQ(c, c.num_semantic_quantizers)
        self.acoustic = RVQ(c, c.used_acoustic)

    def latent(self, wav: torch.Tensor, length: torch.Tensor | None = None) -> torch.Tensor:
        """The quantizer's input [1, H, frames]."""
        x, n = self.encoder(wav[:, None, :], length)
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        if n is not None:
            # upstream's downsample replicates its last valid frame into the right pad
            idx = torch.minimum(torch.arange(x.shape[-1]), n - 1)
            x = x.index_select(-1, idx)
        return self.downsample(x)

    def forward(self, wav: torch.Tensor, length: torch.Tensor | None = None) -> torch.Tensor:
        z = self.latent(wav, length)
        return torch.cat([self.semantic(z), self.acoustic(z)], dim=-1)


class SpeechEncoderGraph(nn.Module):
    """The `speech_encoder` component: wav [1, R] (a reference zero-padded to the window) and its
    valid samples [1] (int32) -> codes [1, R / 1920, Q] (int32) and margins [1, R / 1920, Q]: at
    each residual level, the gap between the two nearest codewords' distances (the codes are gated
    on agreement with fp32, a flip at a near tie excused; parity/metrics.py). Frames from
    ceil(length / 1920) on are padding: the host drops them."""

    def __init__(self, encoder: SpeechEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, wav, length):
        z = self.encoder.latent(wav, length.to(torch.int64))
        (sc, sm), (ac, am) = self.encoder.semantic(z, margins=True), self.encoder.acoustic(z, margins=True)
        return torch.cat([sc, ac], dim=-1).to(torch.int32)[None], torch.cat([sm, am], dim=-1)[None]


def window(wav, samples: int) -> dict:
    """The graph's inputs for a reference [S] (S <= samples): zero-padded to `samples`, and S."""
    import numpy as np

    x = np.zeros((1, samples), np.float32)
    x[0, :len(wav)] = wav
    return {"wav": x, "length": np.array([len(wav)], np.int32)}


def check_reference(samples: int, most_frames: int, samples_per_frame: int, sr: int = 24000,
                    what: str = "the reference audio", hint: str = "") -> int:
    """The reference's codec frames, or a one-line UsageError past the window (never cropped)."""
    n = -(-samples // samples_per_frame)
    if n > most_frames:
        raise UsageError(f"{what} is {samples / sr:.2f} s ({n} codec frames); the speech encoder (in-context "
                         f"cloning) takes at most {most_frames} frames ({most_frames * samples_per_frame / sr:.2f} s, "
                         f"--encoder-frames): trim it{', or ' + hint if hint else ''}")
    if n < 1:
        raise UsageError(f"{what} is empty")
    return n


# ---------------------------------------------------------------------------------------------
# Loading from speech_tokenizer/
# ---------------------------------------------------------------------------------------------

def read_speech_encoder_config(checkpoint: Path) -> SpeechEncoderConfig:
    d = speech_tokenizer_dir(checkpoint)
    path = d / "config.json"
    raw = read_json(path, "speech tokenizer config")
    _require_type(raw, path, TOKENIZER_MODEL_TYPE)
    enc = raw.get("encoder_config")
    if not isinstance(enc, dict):
        raise UsageError(f"{path}: missing encoder_config (the speech tokenizer's encoder, needed to encode "
                         f"reference audio for in-context cloning)")
    valid = raw.get("encoder_valid_num_quantizers", 16)
    if type(valid) is not int:
        raise UsageError(f"{path}: encoder_valid_num_quantizers must be an integer, got {json.dumps(valid)[:40]}")
    c = SpeechEncoderConfig.from_json(enc, valid, str(path))
    rate = raw.get("input_sample_rate", 24000)
    if rate != c.sampling_rate:
        raise UsageError(f"{path}: input_sample_rate {json.dumps(rate)[:20]} differs from encoder_config."
                         f"sampling_rate {c.sampling_rate}")
    hop = raw.get("encode_downsample_rate", c.samples_per_frame)
    if hop != c.samples_per_frame:
        raise UsageError(f"{path}: encode_downsample_rate {json.dumps(hop)[:20]} does not match the encoder's "
                         f"{c.samples_per_frame} samples per frame")
    return c


def load_speech_encoder(checkpoint: Path) -> SpeechEncoder:
    """The encoder with `speech_tokenizer/model.safetensors` `encoder.*` loaded strictly: every
    tensor the config implies must be there at its shape, and no other `encoder.*` tensor may be."""
    c = read_speech_encoder_config(checkpoint)
    d = checkpoint / "speech_tokenizer"
    refuse_pickles(d)
    path = d / "model.safetensors"
    table = speech_encoder_tensors(c)
    unknown = sorted(k for k in read_header(path) if k.startswith(PREFIX) and k[len(PREFIX):] not in table)
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise UsageError(f"{path}: tensor '{unknown[0]}'{more} is not part of the encoder this config describes; "
                         f"encoder_config does not match the weights")
    return build_speech_encoder(c, load_tensors(path, table, prefix=PREFIX))


def build_speech_encoder(c: SpeechEncoderConfig, tensors) -> SpeechEncoder:
    """The module from `encoder.*` tensors (names without the prefix; torch or numpy), codebooks
    folded to constant tables (embed_sum / clamp(cluster_usage, 1e-5), as upstream computes them)."""
    def get(name):
        return torch.as_tensor(tensors[name], dtype=torch.float32)

    m = SpeechEncoder(c)
    state = {name: get(name) for name in m.state_dict() if not name.startswith(("semantic.", "acoustic."))}
    for part, rvq in (("semantic", m.semantic), ("acoustic", m.acoustic)):
        p = f"quantizer.{part}_residual_vector_quantizer."
        if rvq.input_proj is not None:
            state[f"{part}.input_proj.weight"] = get(p + "input_proj.weight")
        books = []
        for k in range(rvq.codebooks.shape[0]):
            q = f"{p}layers.{k}.codebook."
            books.append(get(q + "embed_sum") / get(q + "cluster_usage").clamp(min=CODEBOOK_EPS)[:, None])
        books = torch.stack(books)
        state[f"{part}.codebooks"] = books
    m.load_state_dict(state, strict=True)
    m.semantic.fold()
    m.acoustic.fold()
    return m.eval()


def encode(model: SpeechEncoder, wav) -> "torch.Tensor":
    """Convenience: a numpy / torch waveform [S] or [1, S] at 24 kHz -> codes [frames, Q] int64."""
    w = torch.as_tensor(wav, dtype=torch.float32).reshape(1, -1)
    with torch.no_grad():
        return model(w)
