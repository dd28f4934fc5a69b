"""HTP context-binary size probe: a Spark decode graph at the real width (H 2048, 8x256 q / 2 kv,
MLP 6656, window 512, context C) with L layers and a small vocab, lowered fp32 ONNX -> fp16 context
binary on the HTP simulator path (onnxruntime-qnn 2.7.0 / QNN 2.51). Prints one JSON line."""
import json, os, resource, sys, time
from pathlib import Path
import numpy as np, torch
from omni_export.recipes.spark.config import SparkConfig
from omni_export.recipes.spark import checkpoint as ck
from omni_export.recipes.spark.modules import SparkStep
from omni_export.recipes.spark.config import FULL
from omni_export import qnn_ep
from omni_export.exporters import onnx as ox

L, vocab, C = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
work = Path(sys.argv[4]); work.mkdir(parents=True, exist_ok=True)
c = SparkConfig(vocab_size=vocab, hidden_size=2048, intermediate_size=6656, num_hidden_layers=L,
                num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                layer_types=tuple(FULL if i % 4 == 3 else "sliding_attention" for i in range(L)),
                sliding_window=512, rope_parameters=ck.ROPE, max_position_embeddings=4096)
g = torch.Generator().manual_seed(0)
t = {}
for name, d in ck.tensor_table(c).items():
    t[name] = (torch.randn(d.shape, generator=g) * 0.02) if d.init[0] == "normal" else torch.ones(d.shape)
m = SparkStep(c, t).eval()
H, KV, HD, W = 2048, 2, 256, 512
Rf = c.rotary_dim(FULL)
ls = sum(1 for x in c.layer_types if x != FULL); lf = L - ls
args = [torch.randn(1, 1, H), torch.ones(1, 1, Rf), torch.zeros(1, 1, Rf), torch.ones(1, 1, HD), torch.zeros(1, 1, HD),
        torch.zeros(1, 1, 1, C + 1), torch.zeros(1, 1, 1, W + 1)]
args += [torch.zeros(1, KV, W, HD) for _ in range(2 * ls)] + [torch.zeros(1, KV, C, HD) for _ in range(2 * lf)]
names_in = ["inputs_embeds", "cos_full", "sin_full", "cos_swa", "sin_swa", "mask_full", "mask_swa"] + \
    [f"swa_{k}_{j}" for j in range(ls) for k in ("key", "value")] + [f"full_{k}_{j}" for j in range(lf) for k in ("key", "value")]
names_out = ["logits", "hidden"] + [f"new_swa_{k}_{j}" for j in range(ls) for k in ("key", "value")] + \
    [f"new_full_{k}_{j}" for j in range(lf) for k in ("key", "value")]
params = sum(p.numel() for p in m.parameters())
t0 = time.time()
with torch.no_grad():
    prog = torch.export.export(m, tuple(args), strict=False)
src = ox.export(prog, work / "fp32.onnx", names_in, names_out)
del prog, m, t
t_export = time.time() - t0
out = {"layers": L, "vocab": vocab, "context": C, "params": params, "fp16_weight_mb": round(params * 2 / 2**20, 1)}
t0 = time.time()
try:
    ctx, binary = qnn_ep.compile_context(src, work / "ctx.onnx", qnn_ep.provider_options("69", "79", fp16=True))
    out.update({"ok": True, "bin_mb": round(binary.stat().st_size / 2**20, 1)})
except Exception as e:
    out.update({"ok": False, "error": str(e)[:400]})
out.update({"export_s": round(t_export, 1), "compile_s": round(time.time() - t0, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
print(json.dumps(out))
