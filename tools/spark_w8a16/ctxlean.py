"""Lean HTP context-size probe: an fp16 ONNX chain of decode-shaped linears (2048 -> 6656 -> 2048, GELU
between, residual add) with N blocks, compiled to an HTP context binary (soc 69 / v79). One JSON line."""
import json, resource, sys, time
from pathlib import Path
import numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
from omni_export import qnn_ep
N = int(sys.argv[1]); work = Path(sys.argv[2]); work.mkdir(parents=True, exist_ok=True)
H, F = 2048, 6656
rng = np.random.default_rng(0)
nodes, inits, x = [], [], "x"
for i in range(N):
    a = rng.standard_normal((H, F), dtype=np.float32).astype(np.float16) * np.float16(0.02)
    b = rng.standard_normal((F, H), dtype=np.float32).astype(np.float16) * np.float16(0.02)
    inits += [numpy_helper.from_array(a, f"w{i}a"), numpy_helper.from_array(b, f"w{i}b")]
    del a, b
    nodes += [helper.make_node("MatMul", [x, f"w{i}a"], [f"h{i}"]), helper.make_node("Gelu", [f"h{i}"], [f"g{i}"]),
              helper.make_node("MatMul", [f"g{i}", f"w{i}b"], [f"o{i}"]), helper.make_node("Add", [x, f"o{i}"], [f"x{i}"])]
    x = f"x{i}"
g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 1, H])],
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT16, [1, 1, H])], initializer=inits)
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
src = work / "chain.onnx"
onnx.save(m, str(src), save_as_external_data=True, location="chain.onnx.data")
del m, g, inits
wb = N * 2 * H * F * 2
out = {"blocks": N, "weight_mb": round(wb / 2**20, 1)}
t0 = time.time()
try:
    ctx, binary = qnn_ep.compile_context(src, work / "ctx.onnx", qnn_ep.provider_options("69", "79", fp16=True))
    out.update({"ok": True, "bin_mb": round(binary.stat().st_size / 2**20, 1)})
except Exception as e:
    out.update({"ok": False, "error": str(e)[:500]})
out.update({"compile_s": round(time.time() - t0, 1), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)})
print(json.dumps(out))
