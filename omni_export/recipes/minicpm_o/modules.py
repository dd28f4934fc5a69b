"""Export-friendly graphs of MiniCPM-o 4.5's TTS head (MiniCPMTTS): static shapes, KV caches as I/O.

  tts_condition  llm_hidden [1,P,Hl], text_embeds [1,P,H] -> condition [1,P,H]
                 = text_embeds + normalize(projector_semantic(llm_hidden)), the projector being
                 linear1 -> ReLU -> linear2 (upstream's MultiModalProjector, projector_type "mlp").
                 The L2 normalisation is computed on the vector scaled by its max |x| first: the
                 same value in exact arithmetic, but the sum of squares cannot overflow fp16 (768
                 squares of values ~10 already pass 65504).
  tts_prefill    inputs_embeds [1,P,H], cos/sin [1,P,hd], mask [1,1,P,C+P], past K/V [1,kv,C,hd] x L
                 -> logits [1,P,V], new K/V [1,kv,P,hd] x L
  tts_decode     the same with P = 1 (the input is the host's emb_code row of the previous code)

The backbone is HF's LlamaModel (no attention bias, RMSNorm, SwiGLU, 1-D NeoX RoPE, theta 10000);
the code head is head_code[0] with its weight norm folded into one Linear at load. Prefill and
decode graphs are `BlockChain`s of one block per layer, the final norm and the code head, so a lost dB
is attributed to one of them.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import attend
from ...blocks import Block, BlockChain
from ...modeling.norm import RMSNorm
from .checkpoint import TTSConfig


def _linear(w: torch.Tensor, b: torch.Tensor | None = None) -> nn.Linear:
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    lin.load_state_dict({"weight": w, **({"bias": b} if b is not None else {})}, assign=True)
    return lin.requires_grad_(False)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Layer(nn.Module):
    def __init__(self, c: TTSConfig, t: dict, n: int):
        super().__init__()
        p = f"tts.model.layers.{n}."
        self.h, self.kv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.ln1 = RMSNorm(t[p + "input_layernorm.weight"], c.rms_norm_eps)
        self.ln2 = RMSNorm(t[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        self.q, self.k, self.v, self.o = (_linear(t[p + f"self_attn.{x}_proj.weight"]) for x in "qkvo")
        self.gate, self.up, self.down = (_linear(t[p + f"mlp.{x}_proj.weight"]) for x in ("gate", "up", "down"))

    def forward(self, x, cos, sin, mask, past_k, past_v):
        b, p, _ = x.shape
        h = self.ln1(x)
        q = self.q(h).reshape(b, p, self.h, self.hd).transpose(1, 2)
        k = self.k(h).reshape(b, p, self.kv, self.hd).transpose(1, 2)
        v = self.v(h).reshape(b, p, self.kv, self.hd).transpose(1, 2)
        cs, sn = cos[:, None], sin[:, None]
        q, k = _rotate(q, cs, sn), _rotate(k, cs, sn)
        a = attend(q, k, v, mask, past_k, past_v).transpose(1, 2).reshape(b, p, self.h * self.hd)  # cache in place
        x = x + self.o(a)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), k, v


class LayerBlock(Block):
    """One decoder layer as an attribution block: (x, cos, sin, mask, past K, past V) -> (x, new K, new V)."""

    def __init__(self, layer: Layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, cos, sin, mask, past_k, past_v):
        return self.layer(x, cos, sin, mask, past_k, past_v)


class FinalNorm(Block):
    def __init__(self, c: TTSConfig, t: dict):
        super().__init__()
        self.norm = RMSNorm(t["tts.model.norm.weight"], c.rms_norm_eps)

    def forward(self, x):
        return self.norm(x)


class Backbone(nn.Module):
    """tts.model's layers and final norm (weights shared by the prefill and decode graphs)."""

    def __init__(self, c: TTSConfig, t: dict):
        super().__init__()
        self.layers = nn.ModuleList(LayerBlock(Layer(c, t, n)) for n in range(c.num_hidden_layers))
        self.norm = FinalNorm(c, t)


class CodeHead(Block):
    """head_code[0] with the weight norm folded (W = g v / ||v||, done in checkpoint.py)."""

    def __init__(self, t: dict):
        super().__init__()
        self.head = _linear(t["tts.head_code.0.weight"])

    def forward(self, hidden):
        return self.head(hidden)


def tts_step(c: TTSConfig, t: dict, backbone: Backbone | None = None) -> BlockChain:
    """tts_prefill / tts_decode (one graph class, two static shapes): a BlockChain of the layers, the final
    norm and the code head, so a lost dB is attributed to one of them. Pass `backbone` to share weights."""
    bb = backbone or Backbone(c, t)
    n = c.num_hidden_layers
    kv = [f"{w}_{i}" for i in range(n) for w in ("past_key", "past_value")]
    new = [f"{w}_{i}" for i in range(n) for w in ("new_key", "new_value")]
    ins = ["inputs_embeds", "cos", "sin", "attn_mask", *kv]
    chain = []
    for i, layer in enumerate(bb.layers):
        x_in = "inputs_embeds" if i == 0 else f"x{i}"
        layer = copy.copy(layer)            # a shallow copy per graph: block names differ, weights are shared
        chain.append((f"layer_{i}", layer.named([x_in, "cos", "sin", "attn_mask", f"past_key_{i}", f"past_value_{i}"],
                                                [f"x{i + 1}", f"new_key_{i}", f"new_value_{i}"])))
    chain.append(("norm", copy.copy(bb.norm).named([f"x{n}"], ["hidden"])))
    chain.append(("code_head", CodeHead(t).named(["hidden"], ["logits"])))
    return BlockChain(ins, ["logits", *new], chain)


class Condition(nn.Module):
    """tts_condition: text_embeds + normalize(projector_semantic(llm_hidden))."""

    def __init__(self, c: TTSConfig, t: dict):
        super().__init__()
        p = "tts.projector_semantic."
        self.linear1 = _linear(t[p + "linear1.weight"], t[p + "linear1.bias"])
        self.linear2 = _linear(t[p + "linear2.weight"], t[p + "linear2.bias"])
        self.normalize = c.normalize_projected_hidden

    def forward(self, llm_hidden, text_embeds):
        x = self.linear2(torch.relu(self.linear1(llm_hidden)))
        if self.normalize:
            x = safe_l2_normalize(x)
        return text_embeds + x


def safe_l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / ||x||, computed as y / ||y|| with y = x / max|x| (||y|| >= 1: no overflow, no eps needed
    unless x is all zero, where upstream's F.normalize also returns zeros)."""
    m = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-6)
    y = x / m
    return y / torch.sqrt((y * y).sum(dim=-1, keepdim=True).clamp_min(1e-6))      # no Rsqrt: see RMSNorm
