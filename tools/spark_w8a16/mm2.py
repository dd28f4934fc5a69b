import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx
from onnx import helper, TensorProto
rng = np.random.default_rng(0)
sa, sb = [1, 8, 16, 32], [1, 8, 32, 112]
a = helper.make_tensor_value_info("a", TensorProto.FLOAT, sa); b = helper.make_tensor_value_info("b", TensorProto.FLOAT, sb)
y = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
g = helper.make_graph([helper.make_node("Mul", ["a", "a"], ["a2"]), helper.make_node("MatMul", ["a2", "b"], ["y"], name="mm"), helper.make_node("Add", ["y", "y"], ["z"])], "mm", [a, b], [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
p = "/tmp/sp/exp/mm2.onnx"; onnx.save(m, p)
cal = [{"a": rng.standard_normal(sa).astype(np.float32), "b": rng.standard_normal(sb).astype(np.float32)} for _ in range(8)]
held = [{"a": rng.standard_normal(sa).astype(np.float32) * 0.9, "b": rng.standard_normal(sb).astype(np.float32) * 0.9} for _ in range(4)]
import onnxruntime as ort
s = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
ref = [{"z": s.run(None, h)[0]} for h in held]
for excl in ((), ("mm",)):
    q = quant(p, f"/tmp/sp/exp/mm2_{len(excl)}.qdq.onnx", cal, headroom=0.0, exclude=excl)
    for kind, fp16 in (("qnn-htp", False), ("qnn-htp", True), ("ort-cpu", False)):
        try:
            spec = RunnerSpec(kind, q, ("a", "b"), ("z",), qnn_ep.provider_options("69", "79", fp16=fp16) if kind == "qnn-htp" else {}, None)
            outs = run_all(spec, held)
            r = np.concatenate([x["z"].ravel() for x in ref]); o = np.concatenate([x["z"].ravel() for x in outs])
            print(f"exclude {excl} {kind} fp16={fp16} SNR {snr(r, o):6.2f}")
        except Exception as e:
            print(f"exclude {excl} {kind} fp16={fp16} FAILED {str(e)[:200]}")
