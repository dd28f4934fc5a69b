"""`flow_encoder_chunk`: token2wav's flow encoder over a static window of N speech tokens -> mu [1, 80, 2N].

Follows CausalMaskedDiffWithXvec.inference up to the decoder, with Step-Audio2's
UpsampleConformerEncoderV2.forward (the non-streaming path: attention over the whole window, padded
tokens masked): input_embedding(tokens) * mask -> LinearNoSubsampling (Linear, LayerNorm, x sqrt(d),
Espnet relative positions) -> PreLookaheadLayer (the last 3 tokens are lookahead: conv over them,
zeros after the window) -> 6 conformer layers (relative-position attention with pos_bias_u/v, swish
FFN, pre-LayerNorm eps 1e-12, no conv module) -> Upsample1D x2 (nearest, left pad 4, conv 5) -> the
same embedding and 4 conformer layers at 50 Hz -> after_norm -> encoder_proj (512 -> 80 mels).

Static shapes make the relative-position table a constant and rel_shift a fixed gather. Tensor names
are flow.safetensors' ("input_embedding.", "encoder.", "encoder_proj.").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...blocks import Block, BlockChain
from ...weights import TensorDecl

MASKED = -100.0


@dataclass(frozen=True)
class EncoderConfig:
    vocab: int = 6561
    size: int = 512
    heads: int = 8
    linear_units: int = 2048
    blocks: int = 6
    up_blocks: int = 4
    lookahead: int = 3
    stride: int = 2
    mels: int = 80

    def to_json(self) -> dict:
        return dict(self.__dict__)


TINY_ENCODER = EncoderConfig(vocab=6561, size=32, heads=2, linear_units=64, blocks=2, up_blocks=1)
REAL_ENCODER = EncoderConfig()


def _layer_tensors(p: str, c: EncoderConfig) -> dict:
    d, s = c.size, 1.0 / math.sqrt(c.size)
    t = {}
    for x in ("linear_q", "linear_k", "linear_v", "linear_out"):
        t[p + f"self_attn.{x}.weight"] = TensorDecl((d, d), ("normal", s))
        t[p + f"self_attn.{x}.bias"] = TensorDecl((d,), ("normal", 0.02))
    t[p + "self_attn.linear_pos.weight"] = TensorDecl((d, d), ("normal", s))
    t[p + "self_attn.pos_bias_u"] = TensorDecl((c.heads, d // c.heads), ("normal", 0.1))
    t[p + "self_attn.pos_bias_v"] = TensorDecl((c.heads, d // c.heads), ("normal", 0.1))
    t[p + "feed_forward.w_1.weight"] = TensorDecl((c.linear_units, d), ("normal", s))
    t[p + "feed_forward.w_1.bias"] = TensorDecl((c.linear_units,), ("normal", 0.02))
    t[p + "feed_forward.w_2.weight"] = TensorDecl((d, c.linear_units), ("normal", 1 / math.sqrt(c.linear_units)))
    t[p + "feed_forward.w_2.bias"] = TensorDecl((d,), ("normal", 0.02))
    for n in ("norm_mha", "norm_ff"):
        t[p + f"{n}.weight"] = TensorDecl((d,), ("uniform", 0.8, 1.2))
        t[p + f"{n}.bias"] = TensorDecl((d,), ("normal", 0.02))
    return t


def encoder_tensors(c: EncoderConfig) -> dict[str, TensorDecl]:
    d, s = c.size, 1.0 / math.sqrt(c.size)
    t = {"input_embedding.weight": TensorDecl((c.vocab, d), ("normal", 1.0)),
         "encoder_proj.weight": TensorDecl((c.mels, d), ("normal", s)),
         "encoder_proj.bias": TensorDecl((c.mels,), ("normal", 0.02)),
         "encoder.after_norm.weight": TensorDecl((d,), ("uniform", 0.8, 1.2)),
         "encoder.after_norm.bias": TensorDecl((d,), ("normal", 0.02)),
         "encoder.pre_lookahead_layer.conv1.weight": TensorDecl((d, d, c.lookahead + 1), ("normal", s / 2)),
         "encoder.pre_lookahead_layer.conv1.bias": TensorDecl((d,), ("normal", 0.02)),
         "encoder.pre_lookahead_layer.conv2.weight": TensorDecl((d, d, 3), ("normal", s / 2)),
         "encoder.pre_lookahead_layer.conv2.bias": TensorDecl((d,), ("normal", 0.02)),
         "encoder.up_layer.conv.weight": TensorDecl((d, d, 2 * c.stride + 1), ("normal", s / 2)),
         "encoder.up_layer.conv.bias": TensorDecl((d,), ("normal", 0.02))}
    for e in ("embed", "up_embed"):
        t[f"encoder.{e}.out.0.weight"] = TensorDecl((d, d), ("normal", s))
        t[f"encoder.{e}.out.0.bias"] = TensorDecl((d,), ("normal", 0.02))
        t[f"encoder.{e}.out.1.weight"] = TensorDecl((d,), ("uniform", 0.8, 1.2))
        t[f"encoder.{e}.out.1.bias"] = TensorDecl((d,), ("normal", 0.02))
    for n in range(c.blocks):
        t.update(_layer_tensors(f"encoder.encoders.{n}.", c))
    for n in range(c.up_blocks):
        t.update(_layer_tensors(f"encoder.up_encoders.{n}.", c))
    return t


def read_encoder_config(header: dict) -> EncoderConfig | None:
    """Geometry from flow.safetensors' header; None when the flow has no encoder tensors."""
    def shape(n):
        e = header.get(n)
        return e["shape"] if isinstance(e, dict) else None
    emb, w1 = shape("input_embedding.weight"), shape("encoder.encoders.0.feed_forward.w_1.weight")
    bu, proj = shape("encoder.encoders.0.self_attn.pos_bias_u"), shape("encoder_proj.weight")
    la, up = shape("encoder.pre_lookahead_layer.conv1.weight"), shape("encoder.up_layer.conv.weight")
    if None in (emb, w1, bu, proj, la, up):
        return None
    count = lambda pre: sum(1 for k in header if k.startswith(pre) and k.endswith(".norm_mha.weight"))  # noqa: E731
    return EncoderConfig(vocab=emb[0], size=emb[1], heads=bu[0], linear_units=w1[0], blocks=count("encoder.encoders."),
                         up_blocks=count("encoder.up_encoders."), lookahead=la[2] - 1, stride=(up[2] - 1) // 2,
                         mels=proj[0])


def rel_pos_table(size: int, d: int) -> torch.Tensor:
    """EspnetRelPositionalEncoding's pos_emb for `size` frames: relative positions size-1 .. -(size-1)."""
    pos = torch.arange(0, size, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * -(math.log(10000.0) / d))
    pe_pos, pe_neg = torch.zeros(size, d), torch.zeros(size, d)
    pe_pos[:, 0::2], pe_pos[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    pe_neg[:, 0::2], pe_neg[:, 1::2] = torch.sin(-1 * pos * div), torch.cos(-1 * pos * div)
    return torch.cat([torch.flip(pe_pos, [0]), pe_neg[1:]])[None]          # [1, 2 size - 1, d]


def _lin(t, n, bias=True):
    w = t[n + ".weight"]
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    lin.load_state_dict({"weight": w, **({"bias": t[n + ".bias"]} if bias else {})}, assign=True)
    return lin.requires_grad_(False)


def _conv(t, n):
    w = t[n + ".weight"]
    with torch.device("meta"):
        conv = nn.Conv1d(w.shape[1], w.shape[0], w.shape[2])
    conv.load_state_dict({"weight": w, "bias": t[n + ".bias"]}, assign=True)
    return conv.requires_grad_(False)


def _ln(t, n, eps):
    return lambda x: F.layer_norm(x, (x.shape[-1],), t[n + ".weight"], t[n + ".bias"], eps)


class ConformerLayer(nn.Module):
    def __init__(self, c: EncoderConfig, t: dict, p: str, frames: int):
        super().__init__()
        self.h, self.dk = c.heads, c.size // c.heads
        a = p + "self_attn."
        self.q, self.k, self.v, self.out = (_lin(t, a + x) for x in ("linear_q", "linear_k", "linear_v", "linear_out"))
        self.pos = _lin(t, a + "linear_pos", bias=False)
        for n in ("pos_bias_u", "pos_bias_v", "norm_mha.weight", "norm_mha.bias", "norm_ff.weight", "norm_ff.bias"):
            self.register_buffer(n.replace(".", "_"), t[(a if n.startswith("pos") else p) + n])
        self.w1, self.w2 = _lin(t, p + "feed_forward.w_1"), _lin(t, p + "feed_forward.w_2")
        # rel_shift for a static length: scores_bd[i, j] = full[i, (T - 1) - i + j]
        i, j = np.meshgrid(np.arange(frames), np.arange(frames), indexing="ij")
        self.register_buffer("shift", torch.from_numpy((frames - 1 - i + j).astype(np.int64)))

    def forward(self, x, bias, pos_emb):
        b, n, d = x.shape
        h = F.layer_norm(x, (d,), self.norm_mha_weight, self.norm_mha_bias, 1e-12)
        heads = lambda y: y.reshape(b, -1, self.h, self.dk)                       # noqa: E731
        q, k, v = heads(self.q(h)), heads(self.k(h)).transpose(1, 2), heads(self.v(h)).transpose(1, 2)
        p = heads(self.pos(pos_emb)).transpose(1, 2)                               # [1, h, 2n-1, dk]
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(2, 3))
        bd_full = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(2, 3))   # [b, h, n, 2n-1]
        bd = torch.gather(bd_full, 3, self.shift.expand(b, self.h, n, n))
        att = torch.softmax((ac + bd) / math.sqrt(self.dk) + bias, dim=-1)
        x = x + self.out(torch.matmul(att, v).transpose(1, 2).reshape(b, n, d))
        h = F.layer_norm(x, (d,), self.norm_ff_weight, self.norm_ff_bias, 1e-12)
        return x + self.w2(F.silu(self.w1(h)))


class Embed(nn.Module):
    """LinearNoSubsampling + EspnetRelPositionalEncoding: (Linear, LayerNorm) x sqrt(d); pos_emb constant."""

    def __init__(self, c: EncoderConfig, t: dict, name: str, frames: int):
        super().__init__()
        self.lin = _lin(t, f"encoder.{name}.out.0")
        self.register_buffer("ln_w", t[f"encoder.{name}.out.1.weight"])
        self.register_buffer("ln_b", t[f"encoder.{name}.out.1.bias"])
        self.register_buffer("pos_emb", rel_pos_table(frames, c.size))
        self.scale = math.sqrt(c.size)

    def forward(self, x):
        return F.layer_norm(self.lin(x), (x.shape[-1],), self.ln_w, self.ln_b, 1e-5) * self.scale


class TokenStage(Block):
    """Embedding, pre-lookahead and the token-rate conformer layers (25 Hz)."""

    def __init__(self, c: EncoderConfig, t: dict, n: int):
        super().__init__()
        self.table = nn.Parameter(t["input_embedding.weight"], requires_grad=False)
        self.embed = Embed(c, t, "embed", n)
        self.la1, self.la2 = _conv(t, "encoder.pre_lookahead_layer.conv1"), _conv(t, "encoder.pre_lookahead_layer.conv2")
        self.lookahead = c.lookahead
        self.layers = nn.ModuleList(ConformerLayer(c, t, f"encoder.encoders.{i}.", n) for i in range(c.blocks))

    def forward(self, tokens, token_mask):
        x = F.embedding(tokens.long().clamp_min(0), self.table) * token_mask[..., None]
        x = self.embed(x) * token_mask[..., None]      # padding reads as the zeros upstream pads an utterance with
        y = F.leaky_relu(self.la1(F.pad(x.transpose(1, 2), (0, self.lookahead))))
        x = x + self.la2(F.pad(y, (2, 0))).transpose(1, 2)
        bias = ((1.0 - token_mask) * MASKED)[:, None, None]
        for layer in self.layers:
            x = layer(x, bias, self.embed.pos_emb)
        return x


class MelStage(Block):
    """Upsample x2, the mel-rate embedding and conformer layers (50 Hz), after_norm, encoder_proj."""

    def __init__(self, c: EncoderConfig, t: dict, n: int):
        super().__init__()
        self.stride = c.stride
        self.up = _conv(t, "encoder.up_layer.conv")
        self.embed = Embed(c, t, "up_embed", n * c.stride)
        self.layers = nn.ModuleList(ConformerLayer(c, t, f"encoder.up_encoders.{i}.", n * c.stride) for i in range(c.up_blocks))
        self.register_buffer("an_w", t["encoder.after_norm.weight"])
        self.register_buffer("an_b", t["encoder.after_norm.bias"])
        self.proj = _lin(t, "encoder_proj")

    def forward(self, x, token_mask):
        y = x.transpose(1, 2).repeat_interleave(self.stride, dim=2)              # nearest x stride
        x = self.up(F.pad(y, (2 * self.stride, 0))).transpose(1, 2)
        mel_mask = token_mask.repeat_interleave(self.stride, dim=1)
        x = self.embed(x)
        bias = ((1.0 - mel_mask) * MASKED)[:, None, None]
        for layer in self.layers:
            x = layer(x, bias, self.embed.pos_emb)
        x = F.layer_norm(x, (x.shape[-1],), self.an_w, self.an_b, 1e-5)
        return self.proj(x).transpose(1, 2)                                       # [1, 80, 2N]


def flow_encoder(c: EncoderConfig, t: dict, tokens: int) -> BlockChain:
    ins = ["tokens", "token_mask"]
    return BlockChain(ins, ["mu"], [
        ("token_stage", TokenStage(c, t, tokens).named(ins, ["h25"])),
        ("mel_stage", MelStage(c, t, tokens).named(["h25", "token_mask"], ["mu"])),
    ])
