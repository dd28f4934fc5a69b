import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx
from onnx import numpy_helper
tag = sys.argv[1] if len(sys.argv) > 1 else "demo"

def weights_only(src, dst, bits=8):
    m = onnx.load(src)
    for i in m.graph.initializer:
        if len(i.dims) >= 2:
            w = numpy_helper.to_array(i).astype(np.float64)   # [in, out]: per output column
            lo = np.minimum(w.min(0, keepdims=True), 0); hi = np.maximum(w.max(0, keepdims=True), 0)
            s = (hi - lo) / (2**bits - 1); z = np.round(-lo / s)
            q = (np.clip(np.round(w / s) + z, 0, 2**bits - 1) - z) * s
            i.CopyFrom(numpy_helper.from_array(q.astype(np.float32), i.name))
    onnx.save(m, dst); return dst

for comp in ("decode", "prefill"):
    d = load(tag, comp); src = d["fp32"]
    m = onnx.load(src, load_external_data=False)
    W2 = [i.name for i in m.graph.initializer if len(i.dims) >= 2]
    per = [W2[k:k+6] for k in range(0, 24, 6)]
    groups = {"all": W2, "lm_head": ["t"], "qkv": [p[0] for p in per], "g": [p[1] for p in per],
              "out": [p[2] for p in per], "mlp": [x for p in per for x in p[3:]]}
    show("weights-only int8, fp32 acts, CPU", comp, score(weights_only(src, str(W / f"{tag}-{comp}/wo8.onnx")), d, "ort-cpu"))
    for g, names in groups.items():
        q = quant(src, W / f"{tag}-{comp}/w16_{g}.qdq.onnx", d["calib"], headroom=0.0, w16=names)
        show(f"w8a16 h0, 16-bit weights: {g}", comp, score(q, d))
