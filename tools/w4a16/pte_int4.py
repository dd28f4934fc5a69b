"""Can ExecuTorch 1.5.1's XNNPACK lower int4 weights? torchao 0.18's configs on a small MLP, exported,
lowered with the XNNPACK partitioner, run on the ExecuTorch runtime, scored against fp32.

    PYTHONPATH=. .venv/bin/python tools/w4a16/pte_int4.py
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
K, H, T = 256, 512, 8


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(K, H, bias=False), nn.Linear(H, K, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def lower(m, x, path):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(m, (x,))
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    ops = [str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"]
    prog = edge.to_executorch()
    path.write_bytes(prog.buffer)
    return ops, path.stat().st_size


def run(path, x):
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(path)).load_method("forward")
    return method.execute([x])[0].numpy()


def snr(r, o):
    return 10 * np.log10((r ** 2).sum() / ((r - o) ** 2).sum())


def main():
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig

    x = torch.randn(1, T, K)
    ref = MLP().eval()
    want = ref(x).detach().numpy()
    d = Path(tempfile.mkdtemp())
    arms = {
        "fp32": None,
        "int8 dyn act + int4 w, group 32 (8da4w)": Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
        "int8 dyn act + int4 w, per channel": Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerAxis(0)),
        "int4 weight-only, group 32": IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)),
    }
    for name, cfg in arms.items():
        m = MLP().eval()
        m.load_state_dict(ref.state_dict())
        try:
            if cfg is not None:
                quantize_(m, cfg)
            eager = m(x).detach().numpy()
            ops, size = lower(m, x, d / "m.pte")
            out = run(d / "m.pte", x)
            left = sorted({o for o in ops if "executorch_call_delegate" not in o and "getitem" not in o})
            print(f"{name:42s} .pte {snr(want, out):7.2f} dB (eager {snr(want, eager):6.2f})  {size / 1e3:7.1f} kB  "
                  f"outside XNNPACK: {left}", flush=True)
        except Exception as e:
            print(f"{name:42s} FAIL {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
