import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx, onnxruntime as ort
tag = sys.argv[1] if len(sys.argv) > 1 else "demo"
comp = sys.argv[2] if len(sys.argv) > 2 else "decode"
qname = sys.argv[3] if len(sys.argv) > 3 else "w16_all"
d = load(tag, comp); src = d["fp32"]
fm = onnx.load(src)
names = [o for n in fm.graph.node for o in n.output]
ops = {o: n.op_type for n in fm.graph.node for o in n.output}
def run_with(path, names):
    m = onnx.load(str(path))
    have = {o for n in m.graph.node for o in n.output}
    keep = [x for x in names if x in have]
    del m.graph.output[:]
    for x in keep:
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(x))
    so = ort.SessionOptions(); so.log_severity_level = 3
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    res = [dict(zip(keep, s.run(keep, {k: v for k, v in x.items()}))) for x in d["held"]]
    return res
ref = run_with(src, names)
q = W / f"{tag}-{comp}/{qname}.qdq.onnx"
out = run_with(q, names)
prev = None
for x in names:
    if x not in out[0] or x not in ref[0]: continue
    r = np.concatenate([a[x].ravel() for a in ref]).astype(np.float64); o = np.concatenate([a[x].ravel() for a in out]).astype(np.float64)
    if r.dtype.kind != 'f' or r.size < 2 or np.all(r == r[0]): continue
    s = snr(r, o)
    rng = (r.min(), r.max())
    flag = " <<<" if prev is not None and s < prev - 3 else ""
    print(f"{ops[x]:10s} {x:22s} snr {s:7.2f}  range [{rng[0]:9.3f},{rng[1]:9.3f}] std {r.std():8.4f}{flag}")
    prev = s
