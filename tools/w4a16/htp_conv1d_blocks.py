"""Blocks of int4 on a Conv1d weight (k=7) with an outlier input channel: ORT CPU vs the HTP."""

import numpy as np
from onnx import helper, numpy_helper, TensorProto as TP
from omni_export import qnn_ep
from omni_export.exporters.onnxfile import int4_tensor
import onnxruntime as ort
rng = np.random.default_rng(0)
O, I, KS, T, B = 64, 256, 7, 32, 64
W = (rng.standard_normal((O, I, KS)) * 0.05).astype(np.float32)
W[:, 3, :] *= 40
X = rng.standard_normal((1, I, T)).astype(np.float32)
def model(kind):
    if kind == "channel":
        s = (np.abs(W).reshape(O, -1).max(1) / 7).astype(np.float32); q = np.clip(np.rint(W / s[:, None, None]), -8, 7).astype(np.int8); attrs = {"axis": 0}
    else:
        wb = W.reshape(O, I // B, B, KS); s = (np.abs(wb).max(2) / 7).astype(np.float32)   # [O, I/B, KS]
        q = np.clip(np.rint(wb / s[:, :, None, :]), -8, 7).astype(np.int8).reshape(W.shape); attrs = {"axis": 1, "block_size": B}
    inits = [int4_tensor("wq", q), numpy_helper.from_array(s, "ws"), int4_tensor("wz", np.zeros(s.shape, np.int8)),
             numpy_helper.from_array(np.array(6 / 32768, np.float32), "xs"), numpy_helper.from_array(np.array(32768, np.uint16), "xz"),
             numpy_helper.from_array(np.array(60 / 32768, np.float32), "ys"), numpy_helper.from_array(np.array(32768, np.uint16), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], **attrs),
             helper.make_node("Conv", ["xd", "w"], ["y0"], kernel_shape=[KS], pads=[3, 3]),
             helper.make_node("QuantizeLinear", ["y0", "ys", "yz"], ["yq"]), helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "p", [helper.make_tensor_value_info("x", TP.FLOAT, [1, I, T])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1, O, T])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    return m.SerializeToString()
ref = ort.InferenceSession(model("channel"), providers=["CPUExecutionProvider"])
import torch
want = torch.nn.functional.conv1d(torch.from_numpy(X), torch.from_numpy(W), padding=3).numpy()
print("ref max", np.abs(want).max())
for kind in ("channel", "block"):
    m = model(kind)
    cpu = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    snr = lambda o: 10 * np.log10((want ** 2).sum() / ((want - o) ** 2).sum())
    try:
        htp = qnn_ep.session(m, qnn_ep.provider_options("69", "79", fp16=False)).run(None, {"x": X})[0]
        h = f"{snr(htp):.2f}"
    except Exception as e:
        h = "FAIL " + str(e).splitlines()[0][:150]
    print(kind, f"cpu {snr(cpu):.2f}", "htp", h, flush=True)
