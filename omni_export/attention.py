"""Grouped-query attention over an explicit KV cache, read in place.

The recipes' decoder graphs take their past keys and values as inputs and return only the new ones.
The textbook form -- `cat([past, new])`, `repeat_interleave` of the result to every query head,
then `softmax(q K^T / sqrt(hd) + mask) V` -- writes a copy of the whole cache on every call, and a
second, `h / kv` times larger, when the heads are grouped: a 0.6B Qwen3-TTS talker step
concatenated and repeated 0.7 GB of K/V over its 28 layers, more than a third of the bytes its
weights take. `attend` computes the same values without either copy:

- the query heads that share a K/V head are folded into rows (query head i reads kv head i // g,
  g = h / kv, as `repeat_interleave` does), so one product per kv head serves the g query heads;
- the past and the new keys are scored apart and their scores joined (a few KB), and the
  probabilities are split the same way to weight the past and the new values.
"""
from __future__ import annotations

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           past_k: torch.Tensor | None = None, past_v: torch.Tensor | None = None, *,
           bmm: bool = False) -> torch.Tensor:
    """softmax(q [b, h, p, hd] . [past_k; k]^T * hd^-0.5 + mask) . [past_v; v] -> [b, h, p, hd].

    k, v [b, kv, p, hd]; past_k, past_v [b, kv, slots, hd] or None (no cache); mask broadcasts to
    [b, h, p, slots + p]. `bmm` writes the products as 3-D batched matmuls over b * kv rows (XNNPACK
    delegates bmm; a 4-D matmul lowers to expand_copy); otherwise they are 4-D matmuls."""
    b, h, p, hd = q.shape
    kv = k.shape[1]
    g = h // kv
    rows = (b * kv,) if bmm else (b, kv)
    mm = torch.bmm if bmm else torch.matmul

    def fold(t):                                            # [b, kv, n, hd] -> [*rows, n, hd]
        return t.reshape(*rows, t.shape[2], hd)

    qg = q.reshape(*rows, g * p, hd)
    scores = [mm(qg, fold(t).transpose(-1, -2)) for t in ((k,) if past_k is None else (past_k, k))]
    s = scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1)          # [*rows, g*p, n]
    n = s.shape[-1]
    probs = torch.softmax(s.reshape(b, h, p, n) * (hd ** -0.5) + mask, dim=-1).reshape(*rows, g * p, n)
    if past_v is None:
        out = mm(probs, fold(v))
    else:
        slots = past_v.shape[2]
        out = mm(probs[..., :slots], fold(past_v)) + mm(probs[..., slots:], fold(v))
    return out.reshape(b, h, p, hd)
