"""Raise the int4 weights that gain most to int8, one at a time (weights only, ORT CPU): SNR, top-1, 4-bit share."""
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
sizes = {i.name: int(np.prod(i.dims)) for i in src.graph.initializer if i.name in targets}
def build(bits8):
    m = onnx.ModelProto(); m.CopyFrom(src)
    for i in m.graph.initializer:
        if i.name in targets:
            w = numpy_helper.to_array(i).astype(np.float32)
            b = 8 if i.name in bits8 else 4
            i.CopyFrom(numpy_helper.from_array(fake(w, targets[i.name][1], "block" if b == 4 else "channel", 64, b).astype(np.float32), i.name))
    out = W / tag / "arms" / "mix.onnx"; onnx.save(m, str(out))
    r = score(out, meta, rows, "ort-cpu")
    return min(v for k, v in r.items() if not k.endswith("top1")), r.get("logits_top1")
# sensitivity: each weight alone at 8-bit, the rest int4 (gain)
base = build(set())
gain = {}
for n in targets:
    gain[n] = build({n})[0] - base[0]
order = sorted(targets, key=lambda n: -gain[n])
kept = set(); tot = sum(sizes.values())
print("all int4", base)
for n in order:
    kept.add(n)
    db, t1 = build(kept)
    share4 = 1 - sum(sizes[k] for k in kept) / tot
    print(f"+8bit {n:40s} gain {gain[n]:5.2f}  -> min {db:6.2f} dB top1 {t1}  4-bit share (of linear weights, in params) {share4:.2f}", flush=True)
    if share4 < 0.3:
        break
