"""The XNNPACK partitioner's graph-signature lookups: an fp16 .pte lowered with and without
`exporters.patches.fx_passes.memoised_signatures`, in one run, alternating A and B.

    .venv/bin/python benchmarks/pte_partition.py [--layers 28] [--width 64] [--pairs 2]

The graph: `--layers` decoder layers of the Qwen3 shape (RMSNorm, q/k/v/o and gate/up/down
projections, SiLU, a residual per half), narrow (`--width`) so a lowering takes seconds: the
partitioner's cost in those lookups grows with nodes x parameters, which depend on the layer count,
not the width (28 layers: the 0.6B talker's depth). Prints one JSON line: per arm the CPU seconds
of each lowering (this process, every thread), the bytes of the two .pte files (equal, or the
patch changed the program), and the provenance. docs/fp16-pte.md keeps the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _net(layers: int, width: int):
    import torch
    from torch import nn

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = Norm(), Norm()
            self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
            self.gate, self.up = nn.Linear(width, 3 * width, bias=False), nn.Linear(width, 3 * width, bias=False)
            self.down = nn.Linear(3 * width, width, bias=False)

        def forward(self, x):
            h = self.n1(x)
            a = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) / width ** 0.5, -1) @ self.v(h)
            x = x + self.o(a)
            h = self.n2(x)
            return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 16, width),)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=2, help="A/B pairs, alternating which arm goes first")
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    from benchmarks import provenance
    from omni_export.core import Precision
    from omni_export.exporters import executorch as et
    from omni_export.exporters.patches import fx_passes

    module, example = _net(args.layers, args.width)
    memo = fx_passes.memoised_signatures
    arms = {"memoised": memo, "torch": contextlib.nullcontext}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        et.export_pte(module, example, Path(tmp) / "warmup.pte", Precision.FP16)      # imports, caches: untimed
        for i in range(args.pairs):
            for arm in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
                fx_passes.memoised_signatures = arms[arm]
                try:
                    t0 = time.process_time()
                    et.export_pte(module, example, Path(tmp) / f"{arm}.pte", Precision.FP16)
                    cpu[arm].append(round(time.process_time() - t0, 3))
                finally:
                    fx_passes.memoised_signatures = memo
                sizes[arm] = (Path(tmp) / f"{arm}.pte").stat().st_size
        same = (Path(tmp) / "memoised.pte").read_bytes() == (Path(tmp) / "torch.pte").read_bytes()
    nodes = len(__import__("torch").export.export(module, example).graph.nodes)
    out = {"benchmark": "pte_partition", "layers": args.layers, "width": args.width, "graph_nodes": nodes,
           "cpu_s": cpu, "pte_bytes": sizes, "byte_identical": same,
           "provenance": provenance.collect(sys.argv[1:] if argv is None else argv, vars(args))}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
