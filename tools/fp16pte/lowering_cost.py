"""Lowering cost of the split forms (docs/fp16-pte.md): the tiny talker decode step's fp16 .pte with its
products in sums of at most N terms (128: nothing split at the tiny widths), its node count, delegates
and CPU seconds to lower.

    python tools/fp16pte/lowering_cost.py 128,16,8 [scratch dir]"""
import sys, time, torch
from pathlib import Path
from omni_export import halfsums
from omni_export.recipes.qwen3_tts import talker, model as M
from omni_export.recipes import get_recipe
from omni_export.exporters.executorch import fp16_program, _fp16_safe, release_lowering_caches
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from omni_export.exporters.executorch import _level_xnnpack_partitioner, LEVEL_PARTITION_NODES
torch.set_num_threads(1)
model = M.load(None, {o.name: o.default for o in get_recipe("qwen3-tts").options}, Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/fp16pte/lc"))
g = model.graph("talker_decode")
args = tuple(torch.randn(*s.shape) if s.dtype == "float32" else torch.zeros(*s.shape, dtype=torch.int64) for s in g.inputs)
for terms in [int(t) for t in sys.argv[1].split(",")]:
    halfsums.SUM_TERMS = talker.SUM_TERMS = terms
    t0, c0 = time.time(), time.process_time()
    prog, d = fp16_program(g.module.executorch_variant())
    ep = _fp16_safe(torch.export.export(prog, args))
    n = len(ep.graph.nodes)
    t1, c1 = time.time(), time.process_time()
    part = _level_xnnpack_partitioner() if n > LEVEL_PARTITION_NODES else XnnpackPartitioner()
    low = to_edge_transform_and_lower(ep, partitioner=[part])
    dl = sum("executorch_call_delegate" in str(x.target) for x in low.exported_program().graph.nodes)
    low.to_executorch()
    t2, c2 = time.time(), time.process_time()
    print(f"terms {terms}: nodes {n}, layers split {d['layers_split']}, delegates {dl}, export cpu {c1-c0:.1f} s, lower cpu {c2-c1:.1f} s (wall {t2-t1:.0f} s)", flush=True)
    del low, ep, prog
    release_lowering_caches()
