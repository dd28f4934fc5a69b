import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx
from onnx import helper, TensorProto
rng = np.random.default_rng(0)
def build(path, shape_a, shape_b):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, shape_a)
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, shape_b)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm", [a, b], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    onnx.save(m, path)
for (sa, sb, label) in (([1, 8, 16, 32], [1, 8, 32, 112], "QK^T prefill-like"), ([1, 8, 1, 32], [1, 8, 32, 97], "QK^T decode-like")):
    p = f"/tmp/sp/exp/mm.onnx"; build(p, sa, sb)
    cal = [{"a": rng.standard_normal(sa).astype(np.float32), "b": rng.standard_normal(sb).astype(np.float32)} for _ in range(8)]
    held = [{"a": rng.standard_normal(sa).astype(np.float32), "b": rng.standard_normal(sb).astype(np.float32)} for _ in range(4)]
    import onnxruntime as ort
    s = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    ref = [{"y": s.run(None, h)[0]} for h in held]
    d = {"held": held, "ref": ref, "ins": ["a", "b"], "outs": ["y"]}
    for h in (0.0, 0.5):
        q = quant(p, f"/tmp/sp/exp/mm_h{h}.qdq.onnx", cal, headroom=h)
        for kind in ("qnn-htp", "ort-cpu"):
            spec = RunnerSpec(kind, q, ("a", "b"), ("y",), qnn_ep.provider_options("69", "79", fp16=False) if kind == "qnn-htp" else {}, None)
            outs = run_all(spec, held)
            r = np.concatenate([x["y"].ravel() for x in ref]); o = np.concatenate([x["y"].ravel() for x in outs])
            print(f"{label:20s} headroom {h} {kind:8s} SNR {snr(r, o):6.2f} dB")
