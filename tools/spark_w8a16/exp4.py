import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx, onnxruntime as ort
tag, comp, qname = sys.argv[1], sys.argv[2], sys.argv[3]
pat = sys.argv[4] if len(sys.argv) > 4 else None
d = load(tag, comp); src = d["fp32"]
fm = onnx.load(src)
names = [o for n in fm.graph.node for o in n.output]
ops = {o: n.op_type for n in fm.graph.node for o in n.output}
sel = [x for x in names if ops[x] in ("MatMul", "Softmax", "Gelu", "Sigmoid", "Div", "Add") or x in ("mul_9","mul_24","mul_39","mul_54","mul_14","mul_59")]
so = ort.SessionOptions(); so.log_severity_level = 3
ref = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
m0 = onnx.load(src); del m0.graph.output[:]
for x in sel: m0.graph.output.append(onnx.helper.make_empty_tensor_value_info(x))
s0 = ort.InferenceSession(m0.SerializeToString(), so, providers=["CPUExecutionProvider"])
R = [dict(zip(sel, s0.run(sel, x))) for x in d["held"]]
qm = onnx.load(str(W / f"{tag}-{comp}/{qname}.qdq.onnx"))
have = {o for n in qm.graph.node for o in n.output}
qsel = [(x, x + "_DequantizeLinear_Output") for x in sel if x + "_DequantizeLinear_Output" in have]
orig_outs = [o.name for o in qm.graph.output]
for x, dq in qsel:
    if dq not in orig_outs:
        qm.graph.output.append(onnx.helper.make_tensor_value_info(dq, onnx.TensorProto.FLOAT, None))
p = W / f"{tag}-{comp}/{qname}.probe.onnx"; onnx.save(qm, str(p))
s = qnn_ep.session(str(p), qnn_ep.provider_options("69", "79", fp16=False))
outn = [o.name for o in s.get_outputs()]
feeds = [{i.name: x[i.name] for i in s.get_inputs()} for x in d["held"]]
Q = [dict(zip(outn, s.run(None, f))) for f in feeds]
for x, dq in qsel:
    r = np.concatenate([a[x].ravel() for a in R]); o = np.concatenate([a[dq].ravel() for a in Q])
    print(f"{ops[x]:8s} {x:16s} HTP snr {snr(r, o):7.2f}")
