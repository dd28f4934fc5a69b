"""Trace: a recipe's Graph + real inputs -> fp32 references, the exported program, block records.

Once per component, shared by every format and precision. Blocks of a BlockChain are traced too,
each as its own small graph fed the fp32 activations captured in front of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .blocks import BlockChain
from .core import Graph, Samples, TensorSpec, UsageError

MIN_CALIBRATION = 2


@dataclass
class Traced:
    name: str
    module: torch.nn.Module
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    calibration: list[dict]
    heldout: list[dict]
    reference: list[dict]
    calibration_source: str = ""
    heldout_source: str = ""
    logits: tuple[str, ...] = ()
    _program: object = field(default=None, repr=False)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    def args(self, sample: dict) -> tuple[torch.Tensor, ...]:
        # a memory-mapped input (a job worker's, jobs/work.py) is read-only: torch gets a copy
        return tuple(torch.from_numpy(np.require(sample[n], requirements=("C", "W"))) for n in self.input_names)

    @property
    def example(self) -> tuple[torch.Tensor, ...]:
        return self.args(self.heldout[0])

    def program(self):
        if self._program is None:
            with torch.no_grad():
                self._program = torch.export.export(self.module, self.example, strict=False)
        return self._program

    def run_eager(self, sample: dict, module=None) -> dict:
        with torch.no_grad():
            out = (module or self.module)(*self.args(sample))
        out = out if isinstance(out, tuple) else (out,)
        return {n: (o.detach().float() if o.is_floating_point() else o.detach()).numpy()
                for n, o in zip(self.output_names, out)}


def check_inputs(specs: tuple[TensorSpec, ...], samples: list[dict], what: str) -> None:
    for i, s in enumerate(samples):
        for spec in specs:
            if spec.name not in s:
                raise UsageError(f"{what} sample {i}: input '{spec.name}' is missing")
            a = np.asarray(s[spec.name])
            if tuple(a.shape) != tuple(spec.shape):
                raise UsageError(f"{what} sample {i}: input '{spec.name}' has shape {list(a.shape)}, "
                                 f"the graph takes {list(spec.shape)}")
            if a.dtype.name != spec.dtype:
                raise UsageError(f"{what} sample {i}: input '{spec.name}' is {a.dtype.name}, "
                                 f"the graph takes {spec.dtype}")


def trace(graph: Graph, calibration: Samples | None, heldout: Samples) -> Traced:
    if not heldout.inputs:
        raise UsageError(f"{graph.name}: no held-out inputs to score against")
    check_inputs(graph.inputs, heldout.inputs, f"{graph.name} held-out")
    calib = calibration.inputs if calibration else []
    if calibration is not None:
        check_inputs(graph.inputs, calib, f"{graph.name} calibration")
        _check_disjoint(graph.name, calib, heldout.inputs)
    t = Traced(graph.name, graph.module.eval(), graph.inputs, graph.outputs, calib, heldout.inputs, [],
               calibration.source if calibration else "", heldout.source, graph.logits)
    t.reference = [t.run_eager(s) for s in t.heldout]
    return t


def _check_disjoint(name: str, calib: list[dict], heldout: list[dict]) -> None:
    from .artifacts.manifest import hash_arrays

    seen = {hash_arrays([s]) for s in calib}
    if any(hash_arrays([s]) in seen for s in heldout):
        raise UsageError(f"{name}: a held-out input is also in the calibration set; parity must run on "
                         f"inputs the quantizer never saw")


def trace_blocks(traced: Traced, heldout_limit: int | None = None) -> list[Traced]:
    """One Traced per block of a BlockChain (empty for other modules)."""
    chain = traced.module
    if not isinstance(chain, BlockChain):
        return []
    # The last held-out samples: for streaming graphs the later ones carry full context.
    held = [chain.record(s) for s in traced.heldout[-(heldout_limit or len(traced.heldout)):]]
    calib = [chain.record(s) for s in traced.calibration]
    blocks = []
    for i, name in enumerate(chain.block_names):
        block = chain.blocks[i]
        ins = held[0][i][2]
        outs = held[0][i][3]
        in_specs = tuple(_spec(n, t) for n, t in ins.items())
        out_names = [n if n not in ins else f"{n}_out" for n in outs]
        out_specs = tuple(_spec(n, t) for n, t in zip(out_names, outs.values()))
        blocks.append(Traced(
            f"{traced.name}:{name}", block, in_specs, out_specs,
            calibration=[_np(rows[i][2]) for rows in calib],
            heldout=[_np(rows[i][2]) for rows in held],
            reference=[dict(zip(out_names, _np(rows[i][3]).values())) for rows in held],
            calibration_source=f"fp32 activations in front of block {name} (captured from "
                               f"{traced.calibration_source or 'calibration inputs'})",
            heldout_source=f"fp32 activations in front of block {name} on held-out inputs",
        ))
    return blocks


def _np(d: dict) -> dict:
    return {k: v.detach().numpy() for k, v in d.items()}


def _spec(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."))
