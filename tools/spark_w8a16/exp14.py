"""exp13's winning s16b variant, produced by the quantizer itself instead of a post-pass: a
TensorQuantOverrides "convert" on every activation x activation MatMul's second input (uint16 for
its other consumers, int16 symmetric for the MatMul), same headroom-0.1 ranges as the exporter.
Usage: exp14.py [prefill|decode|both] [HEADROOM]
"""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
from exp_run import *          # noqa
import onnx
from onnxruntime.quantization import QuantType

tag = "demo"


def s16_second_input_overrides(src, ranges, headroom):
    """{tensor: [override]} converting each act x act MatMul's input[1] to int16 symmetric."""
    m = onnx.load(str(src))
    inits = {i.name for i in m.graph.initializer}
    recv = {}
    for n in m.graph.node:
        if n.op_type == "MatMul" and not any(i in inits for i in n.input):
            recv.setdefault(n.input[1], set()).add(n.name)
    ov = {}
    for t, nodes in recv.items():
        lo, hi = ranges[t]
        pad = headroom * (hi - lo)
        r = {"rmin": np.float32(lo - pad), "rmax": np.float32(hi + pad)}
        ov[t] = [dict(r, convert=dict(r, quant_type=QuantType.QInt16, symmetric=True, recv_nodes=nodes))]
    return ov


if __name__ == "__main__":
    comps = {"both": ("prefill", "decode")}.get(sys.argv[1] if len(sys.argv) > 1 else "both", None) or (sys.argv[1],)
    h = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
    for comp in comps:
        d = load(tag, comp)
        src = W / f"{tag}-{comp}/convT.onnx"
        ranges = activation_ranges(src, d["calib"], W / f"{tag}-{comp}")
        ov = s16_second_input_overrides(src, ranges, h)
        q = quant(src, W / f"{tag}-{comp}/convT_h{h}_s16conv.qdq.onnx", d["calib"], headroom=h, overrides=ov)
        m = onnx.load(str(q))
        print(comp, "overrides", len(ov), "int16 zero points:",
              sum(1 for i in m.graph.initializer if i.data_type == onnx.TensorProto.INT16), flush=True)
        show(f"quantizer convert->s16, h{h}, HTP", comp, score(q, d))
        show(f"quantizer convert->s16, h{h}, ORT CPU", comp, score(q, d, "ort-cpu"))
