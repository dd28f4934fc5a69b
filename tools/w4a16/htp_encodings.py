"""Which int4 weight encodings the QNN EP (onnxruntime-qnn 2.7 / QNN 2.51) compiles for the HTP."""

import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as TP
from omni_export import qnn_ep

rng = np.random.default_rng(0)
K, N, T = 256, 96, 8
W = (rng.standard_normal((K, N)) * np.linspace(0.05, 2, N)).astype(np.float32)
X = rng.standard_normal((1, T, K)).astype(np.float32)
ACT = 1 / 3000.0

def q16(name, x, scale):
    return ([helper.make_node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
             helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])],
            [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_s"),
             numpy_helper.from_array(np.array(0 if False else 32768, np.uint16), f"{name}_z")])

def int4(a):
    return np.clip(np.round(a), -8, 7).astype(np.int8)

def weight_dq(kind, w, block=64):
    """(nodes, inits, name of float weight) for w [K, N] (MatMul layout)."""
    if kind == "tensor":
        s = np.abs(w).max() / 7
        q = int4(w / s)
        inits = [numpy_helper.from_array(np.array(s, np.float32), "ws")]
        attrs = {}
    elif kind == "channel":
        s = (np.abs(w).max(0) / 7).astype(np.float32)
        q = int4(w / s)
        inits = [numpy_helper.from_array(s, "ws")]
        attrs = {"axis": 1}
    elif kind == "block":
        wb = w.reshape(K // block, block, N)
        s = (np.abs(wb).max(1) / 7).astype(np.float32)           # [K/b, N]
        q = int4(wb / s[:, None, :]).reshape(K, N)
        inits = [numpy_helper.from_array(s, "ws")]
        attrs = {"axis": 0, "block_size": block}
    qt = helper.make_tensor("wq", TP.INT4, list(w.shape), q.flatten().tolist())
    zp_shape = inits[0].dims
    zp = helper.make_tensor("wz", TP.INT4, list(zp_shape), [0] * int(np.prod(zp_shape) if len(zp_shape) else 1))
    return [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], **attrs)], [qt, zp, *inits]

def model(op, kind, block=64):
    xs = float(np.abs(X).max() * 1.5 / 32768)
    nodes, inits = q16("x", "x", xs)
    wn, wi = weight_dq(kind, W, block) if op == "matmul" else conv_weight(kind, block)
    nodes += wn; inits += wi
    if op == "matmul":
        nodes.append(helper.make_node("MatMul", ["x_dq", "w"], ["y0"]))
        oshape = [1, T, N]
        inp = helper.make_tensor_value_info("x", TP.FLOAT, [1, T, K])
    else:
        nodes.append(helper.make_node("Conv", ["x_dq", "w"], ["y0"], kernel_shape=[1, 1]))
        oshape = [1, N, 1, T]
        inp = helper.make_tensor_value_info("x", TP.FLOAT, [1, K, 1, T])
    ref = X @ W
    ys = float(np.abs(ref).max() * 1.5 / 32768)
    n2, i2 = q16("y", "y0", ys)
    nodes += n2; inits += i2
    nodes.append(helper.make_node("Identity", ["y_dq"], ["y"]))
    g = helper.make_graph(nodes, "p", [inp], [helper.make_tensor_value_info("y", TP.FLOAT, oshape)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    onnx.checker.check_model(m)
    return m

def conv_weight(kind, block):
    w = np.ascontiguousarray(W.T[:, :, None, None])     # [N, K, 1, 1]
    if kind == "tensor":
        s = np.abs(w).max() / 7; q = int4(w / s); inits = [numpy_helper.from_array(np.array(s, np.float32), "ws")]; attrs = {}
    elif kind == "channel":
        s = (np.abs(w).reshape(N, -1).max(1) / 7).astype(np.float32); q = int4(w / s[:, None, None, None])
        inits = [numpy_helper.from_array(s, "ws")]; attrs = {"axis": 0}
    elif kind == "block":
        wb = w.reshape(N, K // block, block)
        s = (np.abs(wb).max(2) / 7).astype(np.float32)      # [N, K/b]
        q = int4(wb / s[:, :, None]).reshape(w.shape)
        inits = [numpy_helper.from_array(s[:, :, None, None], "ws")]; attrs = {"axis": 1, "block_size": block}
    qt = helper.make_tensor("wq", TP.INT4, list(w.shape), q.flatten().tolist())
    zs = list(inits[0].dims)
    zp = helper.make_tensor("wz", TP.INT4, zs, [0] * int(np.prod(zs) if zs else 1))
    return [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], **attrs)], [qt, zp, *inits]

def snr(ref, out):
    return 10 * np.log10((ref ** 2).sum() / ((ref - out) ** 2).sum())

import onnxruntime as ort
opts = qnn_ep.provider_options("69", "79", fp16=False)
for op in ("matmul", "conv"):
    for kind, block in (("tensor", 0), ("channel", 0), ("block", 32), ("block", 64), ("block", 128)):
        for bq in ("0", "1"):
            if kind != "block" and bq == "1":
                continue
            m = model(op, kind, block or 64)
            feed = {"x": X if op == "matmul" else np.ascontiguousarray(X[0].T[None, :, None, :])}
            cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
            ref = X @ W if op == "matmul" else np.ascontiguousarray((X @ W)[0].T[None, :, None, :])
            try:
                o = dict(opts, enable_block_quant_weight_optimization=bq) if kind == "block" else opts
                s = qnn_ep.session(m.SerializeToString(), o)
                htp = s.run(None, feed)[0]
                res = f"HTP {snr(ref, htp):6.2f} dB"
            except Exception as e:
                res = "FAIL " + str(e).splitlines()[0][:200]
            print(f"{op:7s} {kind:8s} b{block:<4d} bqopt={bq}  cpu {snr(ref, cpu):6.2f} dB  {res}", flush=True)
