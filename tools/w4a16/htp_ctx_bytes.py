"""Context-binary bytes per int4 encoding (do the weights stay 4-bit in the binary?)."""
import sys, tempfile, pathlib
import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as TP
from omni_export import qnn_ep
rng = np.random.default_rng(0)
K = N = 1024; T = 8
W = rng.standard_normal((K, N)).astype(np.float32) * 0.05
X = rng.standard_normal((1, T, K)).astype(np.float32)

def build(kind, bits=4, block=64):
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    dt = TP.INT4 if bits == 4 else TP.INT8
    if kind == "tensor":
        s = np.array(np.abs(W).max() / hi, np.float32); q = np.clip(np.round(W / s), lo, hi); attrs = {}
    elif kind == "channel":
        s = (np.abs(W).max(0) / hi).astype(np.float32); q = np.clip(np.round(W / s), lo, hi); attrs = {"axis": 1}
    else:
        wb = W.reshape(K // block, block, N); s = (np.abs(wb).max(1) / hi).astype(np.float32)
        q = np.clip(np.round(wb / s[:, None]), lo, hi).reshape(K, N); attrs = {"axis": 0, "block_size": block}
    inits = [helper.make_tensor("wq", dt, [K, N], q.astype(np.int8).flatten().tolist()), numpy_helper.from_array(s, "ws"),
             helper.make_tensor("wz", dt, list(s.shape), [0] * s.size),
             numpy_helper.from_array(np.array(4 / 32768, np.float32), "xs"), numpy_helper.from_array(np.array(32768, np.uint16), "xz"),
             numpy_helper.from_array(np.array(4 / 32768, np.float32), "ys"), numpy_helper.from_array(np.array(32768, np.uint16), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], **attrs), helper.make_node("MatMul", ["xd", "w"], ["y0"]),
             helper.make_node("QuantizeLinear", ["y0", "ys", "yz"], ["yq"]), helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, "p", [helper.make_tensor_value_info("x", TP.FLOAT, [1, T, K])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [1, T, N])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    return m

d = pathlib.Path(tempfile.mkdtemp())
CONFIGS = [("tensor", 8, 0, "0"), ("channel", 8, 0, "0"), ("tensor", 4, 0, "0"), ("channel", 4, 0, "0"),
           ("block", 4, 32, "0"), ("block", 4, 64, "0"), ("block", 4, 128, "0"), ("block", 4, 256, "0"),
           ("block", 4, 32, "1"), ("block", 4, 64, "1"), ("block", 4, 128, "1"), ("block", 8, 64, "0")]
# run one configuration per process (argv[1] = its index): ("block", 4, 128, "1") crashed the compile
for kind, bits, block, bq in ([CONFIGS[int(sys.argv[1])]] if len(sys.argv) > 1 else CONFIGS):

    m = build(kind, bits, block)
    p = d / f"{kind}{bits}_{block}_{bq}.onnx"; onnx.save(m, str(p))
    opts = dict(qnn_ep.provider_options("69", "79", fp16=False), enable_block_quant_weight_optimization=bq)
    try:
        ctx, binf = qnn_ep.compile_context(p, d / f"{p.stem}.ctx.onnx", opts)
        s = qnn_ep.session(ctx, opts); y = s.run(None, {"x": X})[0]
        ref = X @ W
        print(f"{kind:8s} int{bits} block {block:3d} bqopt {bq}: ctx bin {binf.stat().st_size/1e6:6.3f} MB  HTP {10*np.log10((ref**2).sum()/((ref-y)**2).sum()):6.2f} dB", flush=True)
    except Exception as e:
        print(kind, bits, block, bq, "FAIL", str(e).splitlines()[0][:200], flush=True)
