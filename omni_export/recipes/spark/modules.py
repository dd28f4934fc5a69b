"""Export-friendly Spark-X2.5 step graph: KV caches as explicit I/O, masks and cos/sin from the host.

One module serves `prefill` (P = N tokens) and `decode` (P = 1); the two graphs share its weights.

Inputs (all float32):
  inputs_embeds [1, P, H]                 rows of model.embedding gathered on the host
  cos_full, sin_full [1, P, Rf]           RoPE of the full layers (Rf = head_dim * 0.25, theta 5e6)
  cos_swa, sin_swa   [1, P, hd]           RoPE of the sliding layers (full rotary, theta 1e4)
  mask_full [1, 1, P, C + P]              additive, over [C context slots (slot = position), new tokens]
  mask_swa  [1, 1, P, W + P]              additive, over [W ring slots, new tokens]
  swa_key_{j}, swa_value_{j}  [1, kv, W, hd]   ring buffer of sliding layer j (j-th sliding layer)
  full_key_{j}, full_value_{j} [1, kv, C, hd]  cache of full layer j
Outputs: logits [1, P, V] fp32, hidden [1, P, H] (final-norm output), then new K/V [1, kv, P, hd] in
the same order as the caches. The graph never writes a cache: keys are stored post-RoPE at their
absolute position, so attention does not care where in the ring a key sits; the host writes position
p of a sliding layer to ring slot p mod W and encodes each slot's position in mask_swa.

Numerics follow modeling_spark.py: RMSNorm (weight * x / rms), fused q|k|v projection, NeoX RoPE on
the first R features, GQA (query head i reads kv head i // (h / kv)), scale hd^-0.5, softmax,
per-head gate act(g_proj(x_norm)) on the attention output, out_proj, exact-GELU gate/up/down MLP.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import attend
from ...modeling.norm import RMSNorm
from .config import FULL, SparkConfig


def _linear(t: dict, name: str) -> nn.Linear:
    w = t[name + ".weight"]
    b = t.get(name + ".bias")
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    lin.load_state_dict({"weight": w, **({"bias": b} if b is not None else {})}, assign=True)
    lin.requires_grad_(False)
    return lin


def rope(x, cos, sin):
    """NeoX rotate-half RoPE on the first cos.shape[-1] features; the rest pass through."""
    r = cos.shape[-1]
    rot, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    half = r // 2
    rot = rot * cos + torch.cat([-rot[..., half:], rot[..., :half]], dim=-1) * sin
    return rot if rest is None else torch.cat([rot, rest], dim=-1)


class Layer(nn.Module):
    def __init__(self, c: SparkConfig, t: dict, i: int):
        super().__init__()
        p = f"model.layers.{i}."
        self.full = c.layer_types[i] == FULL
        self.h, self.kv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.input_layernorm = RMSNorm(t[p + "input_layernorm.weight"], c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(t[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        self.qkv = _linear(t, p + "self_attn.q_k_v_proj")
        self.g_proj = _linear(t, p + "self_attn.g_proj") if c.headwise_attn_output_gate else None
        self.gate_act = torch.sigmoid if c.gate_attn_act_mode == "sigmoid" else F.silu
        self.out_proj = _linear(t, p + "self_attn.out_proj")
        self.gate_proj = _linear(t, p + "mlp.gate_proj")
        self.up_proj = _linear(t, p + "mlp.up_proj")
        self.down_proj = _linear(t, p + "mlp.down_proj")

    def forward(self, x, cos, sin, mask, past_k, past_v):
        b, n, _ = x.shape
        xn = self.input_layernorm(x)
        qkv = self.qkv(xn)
        qd, kd = self.h * self.hd, self.kv * self.hd
        q = qkv[..., :qd].reshape(b, n, self.h, self.hd).transpose(1, 2)
        k = qkv[..., qd:qd + kd].reshape(b, n, self.kv, self.hd).transpose(1, 2)
        v = qkv[..., qd + kd:].reshape(b, n, self.kv, self.hd).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        out = attend(q, k, v, mask, past_k, past_v)          # the caches read in place
        if self.g_proj is not None:
            out = out * self.gate_act(self.g_proj(xn)).transpose(1, 2)[..., None]
        x = x + self.out_proj(out.transpose(1, 2).reshape(b, n, self.h * self.hd))
        hn = self.post_attention_layernorm(x)
        x = x + self.down_proj(F.gelu(self.gate_proj(hn)) * self.up_proj(hn))
        return x, k, v


class SparkStep(nn.Module):
    def __init__(self, c: SparkConfig, t: dict):
        super().__init__()
        self.layers = nn.ModuleList(Layer(c, t, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(t["model.norm.weight"], c.rms_norm_eps)
        head = t["model.embedding.weight"] if c.tie_word_embeddings else t["lm_head.weight"]
        self.lm_head = nn.Parameter(head, requires_grad=False)
        self.n_swa = sum(not layer.full for layer in self.layers)

    def forward(self, inputs_embeds, cos_full, sin_full, cos_swa, sin_swa, mask_full, mask_swa, *caches):
        swa = caches[:2 * self.n_swa]
        full = caches[2 * self.n_swa:]
        x = inputs_embeds
        new_swa, new_full = [], []
        js = jf = 0
        for layer in self.layers:
            if layer.full:
                x, k, v = layer(x, cos_full, sin_full, mask_full, full[2 * jf], full[2 * jf + 1])
                new_full += [k, v]
                jf += 1
            else:
                x, k, v = layer(x, cos_swa, sin_swa, mask_swa, swa[2 * js], swa[2 * js + 1])
                new_swa += [k, v]
                js += 1
        hidden = self.norm(x)
        logits = torch.matmul(hidden, self.lm_head.t())
        return (logits, hidden, *new_swa, *new_full)
