"""RoPE cos/sin tables as the upstream models compute them in fp32 (inv_freq from int64 steps, the
angles concatenated with themselves: NeoX rotate-half layout). Shared by every recipe."""
from __future__ import annotations


def rope_table(positions, dim: int, theta: float):
    """(cos, sin) torch tensors [n, dim]: `positions` an int n (positions 0..n-1) or an array of
    positions (a host loop's window)."""
    import numpy as np
    import torch

    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if np.ndim(positions) == 0:
        pos = torch.arange(int(positions)).float()
    else:
        pos = torch.from_numpy(np.asarray(positions, np.float32))
    ang = pos[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()
