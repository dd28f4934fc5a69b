"""A plain Spark-X2.5 forward for tests: the whole sequence at once, no caches, no ring buffer,
masks built from positions with -inf (the way modeling_spark.py's sliding/causal masks define them:
a sliding layer's query q sees keys k with q - W < k <= q). Written from the released modeling file's
semantics, independently of the export graphs (modules.py) and the host (host.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, rotary, theta):
    inv = 1.0 / (theta ** (torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary))
    f = torch.outer(pos.float(), inv)
    emb = torch.cat([f, f], -1)
    c, s = emb.cos(), emb.sin()
    xr, xp = x[..., :rotary], x[..., rotary:]
    x1, x2 = xr[..., : rotary // 2], xr[..., rotary // 2:]
    return torch.cat([xr * c + torch.cat([-x2, x1], -1) * s, xp], -1)


@torch.no_grad()
def forward(cfg, t: dict, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] in fp64 (fp64 keeps the reference free of accumulation-order noise)."""
    T = {k: v.double() for k, v in t.items()}
    n = len(ids)
    pos = torch.arange(n)
    x = T["model.embedding.weight"][torch.tensor(ids)]
    h, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q_idx, k_idx = pos[:, None], pos[None, :]
    for i, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{i}."
        allowed = k_idx <= q_idx
        if kind == "sliding_attention":
            allowed = allowed & (k_idx > q_idx - cfg.sliding_window)
        rotary = int(hd * cfg.rope_parameters.get(kind, {}).get("partial_rotary_factor", 1.0))
        theta = float(cfg.rope_parameters.get(kind, {}).get("rope_theta", 10000.0))
        xn = _rms(x, T[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        qkv = xn @ T[p + "self_attn.q_k_v_proj.weight"].T
        q = qkv[:, :h * hd].reshape(n, h, hd).transpose(0, 1)
        k = qkv[:, h * hd:(h + kv) * hd].reshape(n, kv, hd).transpose(0, 1)
        v = qkv[:, (h + kv) * hd:].reshape(n, kv, hd).transpose(0, 1)
        q, k = _rope(q, pos, rotary, theta), _rope(k, pos, rotary, theta)
        heads = []
        for j in range(h):
            g = j // (h // kv)
            s = (q[j] @ k[g].T) / math.sqrt(hd)
            s = s.masked_fill(~allowed, float("-inf"))
            heads.append(torch.softmax(s, -1) @ v[g])
        o = torch.stack(heads)                                   # [h, n, hd]
        gate = torch.sigmoid(xn @ T[p + "self_attn.g_proj.weight"].T)   # [n, h]
        o = o * gate.T[:, :, None]
        x = x + o.transpose(0, 1).reshape(n, h * hd) @ T[p + "self_attn.out_proj.weight"].T
        hn = _rms(x, T[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x = x + (F.gelu(hn @ T[p + "mlp.gate_proj.weight"].T) * (hn @ T[p + "mlp.up_proj.weight"].T)) \
            @ T[p + "mlp.down_proj.weight"].T
    x = _rms(x, T["model.norm.weight"], cfg.rms_norm_eps)
    return x @ T["model.embedding.weight"].T


def greedy(cfg, t: dict, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(forward(cfg, t, seq)[-1].argmax()))
    return seq[len(ids):]
