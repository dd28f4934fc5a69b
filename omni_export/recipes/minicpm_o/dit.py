"""`dit_step`: one call of token2wav's DiT flow-matching estimator on the CFG pair, static M mel frames.

  inputs  x [1,80,M] (the current sample), mu [1,80,M] (flow encoder output), spks [1,80] (projected
          speaker embedding), cond [1,80,M] (prompt mel, zeros after it), mask [1,1,M] (1 = frame),
          t_freq [1,256] (the timestep's sinusoidal features, from the host)
  output  velocity [2,80,M]: row 0 conditional, row 1 unconditional (mu, spks, cond zeroed in-graph)

The estimator follows Step-Audio2's DiT (cosyvoice2/flow/decoder_dit.py): in_proj over
[x | mu | spks | cond]; per block adaLN-Zero with 9 modulations from the time embedding: attention
(q/k LayerNorm per head, bias), a causal conv block (conv3, LayerNorm, Mish, conv3), a tanh-GELU MLP;
a final adaLN layer. The attention mask is additive from `mask` (keys of padded frames excluded).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...blocks import Block, BlockChain
from .token2wav import DiTConfig

MASKED = -100.0


def _lin(t: dict, name: str) -> nn.Linear:
    w = t[name + ".weight"]
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0])
    lin.load_state_dict({"weight": w, "bias": t[name + ".bias"]}, assign=True)
    return lin.requires_grad_(False)


def _conv(t: dict, name: str) -> nn.Conv1d:
    w = t[name + ".weight"]
    with torch.device("meta"):
        conv = nn.Conv1d(w.shape[1], w.shape[0], w.shape[2])
    conv.load_state_dict({"weight": w, "bias": t[name + ".bias"]}, assign=True)
    return conv.requires_grad_(False)


def _ln(x, weight=None, bias=None, eps=1e-6):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


class DiTBlock(nn.Module):
    def __init__(self, c: DiTConfig, t: dict, n: int):
        super().__init__()
        p = f"blocks.{n}."
        self.heads, self.hd = c.num_heads, c.head_dim
        self.q, self.k, self.v, self.proj = (_lin(t, p + f"attn.{x}") for x in ("to_q", "to_k", "to_v", "proj"))
        for nm in ("q_norm", "k_norm", "conv.block.3"):
            self.register_buffer(nm.replace(".", "_") + "_w", t[p + f"attn.{nm}.weight" if "norm" in nm else p + nm + ".weight"])
            self.register_buffer(nm.replace(".", "_") + "_b", t[p + f"attn.{nm}.bias" if "norm" in nm else p + nm + ".bias"])
        self.conv1, self.conv2 = _conv(t, p + "conv.block.1"), _conv(t, p + "conv.block.6")
        self.fc1, self.fc2 = _lin(t, p + "mlp.fc1"), _lin(t, p + "mlp.fc2")
        self.ada = _lin(t, p + "adaLN_modulation.1")

    def attention(self, x, bias):
        b, m, _ = x.shape
        heads = lambda y: y.reshape(b, m, self.heads, self.hd).transpose(1, 2)     # noqa: E731
        q = _ln(heads(self.q(x)), self.q_norm_w, self.q_norm_b, 1e-5)
        k = _ln(heads(self.k(x)), self.k_norm_w, self.k_norm_b, 1e-5)
        s = torch.matmul(q, k.transpose(2, 3)) * (self.hd ** -0.5) + bias
        a = torch.matmul(torch.softmax(s, dim=-1), heads(self.v(x)))
        return self.proj(a.transpose(1, 2).reshape(b, m, self.heads * self.hd))

    def conv(self, x):
        y = self.conv1(F.pad(x.transpose(1, 2), (2, 0))).transpose(1, 2)
        y = _ln(y, self.conv_block_3_w, self.conv_block_3_b, 1e-5)
        y = y * torch.tanh(F.softplus(y))                                             # Mish
        return self.conv2(F.pad(y.transpose(1, 2), (2, 0))).transpose(1, 2)

    def forward(self, x, c, bias):
        sa, ca, ga, sm, cm, gm, sc, cc, gc = self.ada(F.silu(c)).chunk(9, dim=-1)
        x = x + ga * self.attention(_ln(x) * (1 + ca) + sa, bias)
        x = x + gc * self.conv(_ln(x) * (1 + cc) + sc)
        return x + gm * self.fc2(F.gelu(self.fc1(_ln(x) * (1 + cm) + sm), approximate="tanh"))


class Inputs(Block):
    """The CFG pair and the estimator's input projection, time embedding and attention bias."""

    def __init__(self, c: DiTConfig, t: dict):
        super().__init__()
        self.in_proj = _lin(t, "in_proj")
        self.t1, self.t2 = _lin(t, "t_embedder.mlp.0"), _lin(t, "t_embedder.mlp.2")

    def forward(self, x, mu, spks, cond, mask, t_freq):
        m = x.shape[-1]
        zeros = torch.zeros_like(mu)
        cond_pair = torch.cat([torch.cat([x, mu, spks[..., None].expand(-1, -1, m), cond], dim=1),
                               torch.cat([x, zeros, zeros, zeros], dim=1)], dim=0)       # [2, 320, M]
        h = self.in_proj(cond_pair.transpose(1, 2))                                        # [2, M, H]
        temb = self.t2(F.silu(self.t1(t_freq)))[:, None].expand(2, -1, -1)               # [2, 1, H]
        return h, temb


class Blocks(Block):
    def __init__(self, blocks: list[DiTBlock], first: int):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.first = first

    def forward(self, h, temb, mask):
        bias = ((1.0 - mask) * MASKED)[:, None]                                            # [1, 1, 1, M]
        for b in self.blocks:
            h = b(h, temb, bias)
        return h


class Final(Block):
    def __init__(self, t: dict):
        super().__init__()
        self.ada, self.linear = _lin(t, "final_layer.adaLN_modulation.1"), _lin(t, "final_layer.linear")

    def forward(self, h, temb):
        shift, scale = self.ada(F.silu(temb)).chunk(2, dim=-1)
        return self.linear(_ln(h) * (1 + scale) + shift).transpose(1, 2)                 # [2, 80, M]


def dit_step(c: DiTConfig, t: dict, group: int = 4) -> BlockChain:
    """A BlockChain: inputs, the blocks in groups of `group` (attribution per group), final layer."""
    ins = ["x", "mu", "spks", "cond", "mask", "t_freq"]
    chain = [("inputs", Inputs(c, t).named(ins, ["h0", "temb"]))]
    blocks = [DiTBlock(c, t, n) for n in range(c.depth)]
    for g in range(0, c.depth, group):
        name = f"blocks_{g}_{min(g + group, c.depth) - 1}"
        out = f"h{g + group}" if g + group < c.depth else "h_last"
        chain.append((name, Blocks(blocks[g:g + group], g).named([f"h{g}", "temb", "mask"], [out])))
    chain.append(("final_layer", Final(t).named(["h_last", "temb"], ["velocity"])))
    return BlockChain(ins, ["velocity"], chain)
