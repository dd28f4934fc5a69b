"""Graphs built as a chain of named blocks, so fidelity can be attributed block by block.

A component's nn.Module is a `BlockChain`: each block reads named tensors from an environment and
writes named tensors back. The chain is the graph that gets exported; each block can also be
exported alone and fed the fp32 activations the chain produced before it, which is how the parity
stage finds the block that loses the dB.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn


class Block(nn.Module):
    """A module with named inputs and outputs. Subclasses implement forward(*inputs) -> tensor | tuple."""
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def named(self, inputs: Sequence[str], outputs: Sequence[str]) -> "Block":
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        return self


class BlockChain(nn.Module):
    def __init__(self, input_names: Sequence[str], output_names: Sequence[str],
                 blocks: Sequence[tuple[str, Block]]):
        super().__init__()
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.block_names = tuple(name for name, _ in blocks)
        self.blocks = nn.ModuleList(b for _, b in blocks)

    def forward(self, *args):
        env = dict(zip(self.input_names, args))
        for block in self.blocks:
            _run(block, env)
        out = tuple(env[n] for n in self.output_names)
        return out if len(out) > 1 else out[0]

    @torch.no_grad()
    def record(self, inputs: dict) -> list[tuple[str, Block, dict, dict]]:
        """Run eagerly; return (name, block, its inputs, its outputs) for every block."""
        env = {n: _tensor(inputs[n]) for n in self.input_names}
        rows = []
        for name, block in zip(self.block_names, self.blocks):
            ins = {n: env[n] for n in block.inputs}
            _run(block, env)
            rows.append((name, block, ins, {n: env[n] for n in block.outputs}))
        return rows


def _tensor(x) -> torch.Tensor:
    """A tensor of `x`; read-only arrays (the memory-mapped held-out inputs) are copied, which torch
    would otherwise share and warn about on stderr."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        x = np.array(x)
    return torch.as_tensor(x)


def _run(block: Block, env: dict) -> None:
    result = block(*(env[n] for n in block.inputs))
    if not isinstance(result, tuple):
        result = (result,)
    env.update(zip(block.outputs, result))
