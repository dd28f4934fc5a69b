"""omni_export.attention.attend: the cache read in place gives the textbook attention's values."""
from __future__ import annotations

import pytest
import torch

from omni_export.attention import attend


def textbook(q, k, v, mask, past_k, past_v):
    keys = k if past_k is None else torch.cat([past_k, k], dim=2)
    vals = v if past_v is None else torch.cat([past_v, v], dim=2)
    g = q.shape[1] // k.shape[1]
    keys, vals = keys.repeat_interleave(g, dim=1), vals.repeat_interleave(g, dim=1)
    scores = torch.matmul(q, keys.transpose(2, 3)) * q.shape[-1] ** -0.5 + mask
    return torch.matmul(torch.softmax(scores, dim=-1), vals)


@pytest.mark.parametrize("bmm", [False, True])
@pytest.mark.parametrize("h,kv,p,slots", [(16, 8, 1, 12), (16, 8, 5, 12), (4, 1, 3, 7), (6, 6, 4, 9), (8, 2, 6, 0)])
def test_attend_equals_concat_repeat_softmax(h, kv, p, slots, bmm):
    torch.manual_seed(h * 100 + kv * 10 + p)
    b, hd = 1, 16
    q = torch.randn(b, h, p, hd)
    k, v = torch.randn(b, kv, p, hd), torch.randn(b, kv, p, hd)
    past = (torch.randn(b, kv, slots, hd), torch.randn(b, kv, slots, hd)) if slots else (None, None)
    mask = torch.zeros(1, 1, p, slots + p)
    mask[..., : slots // 3] = -1e9                                   # empty cache slots
    mask[..., slots:] = torch.triu(torch.full((p, p), -1e9), 1)      # causal over the new tokens
    got = attend(q, k, v, mask, *past, bmm=bmm)
    want = textbook(q, k, v, mask, *past)
    assert got.shape == want.shape == (b, h, p, hd)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5), (got - want).abs().max()
    # query head i reads kv head i // (h / kv): changing kv head 0 moves only the first group
    k2 = k.clone()
    k2[:, 0] += 1
    moved = (attend(q, k2, v, mask, *past, bmm=bmm) - got).abs().amax(dim=(0, 2, 3)) > 0
    assert moved.tolist() == [i < h // kv for i in range(h)]
