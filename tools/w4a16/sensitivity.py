"""One weight at int4 per channel, the others fp32 (ORT CPU): each linear weight's own cost."""
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import numpy as np, onnx
from onnx import numpy_helper
from run import W, load, score
from weights_only import fake
from omni_export.exporters.onnx import _int4_weights
tag = sys.argv[1]
meta, rows = load(tag)
src = onnx.load(meta["fp32"])
targets = _int4_weights(src)
res = []
for name, (op, axis) in targets.items():
    m = onnx.ModelProto(); m.CopyFrom(src)
    for i in m.graph.initializer:
        if i.name == name:
            w = numpy_helper.to_array(i).astype(np.float32)
            i.CopyFrom(numpy_helper.from_array(fake(w, axis, "channel", 64).astype(np.float32), name))
    out = W / tag / "arms" / "sens.onnx"; onnx.save(m, str(out))
    r = score(out, meta, rows, "ort-cpu")
    res.append((min(v for k, v in r.items() if not k.endswith("top1")), name, op, w.shape))
for r in sorted(res)[:15]:
    print(r)
