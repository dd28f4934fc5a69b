"""Spark demo w8a16: the attention (activation x activation) MatMuls reformulated for the HTP.

Post-passes on the exporter's QDQ file (convT, headroom 0.1 = the accepted configuration):
  s16b   : insert Q(int16, symmetric)->DQ in front of every act x act MatMul's second input, so the
           QNN EP sees uint16 x int16 and does not insert its own Convert of input[1] to uint8
           (mm3.py: lone MatMul 38.4 -> 73.1 dB on the HTP).
  s16ab  : both inputs int16 symmetric (and the output too: s16 x s16 -> s16).
  island : drop the Q->DQ pair on each such MatMul's output, so the EP cannot fuse DQ->MatMul->Q:
           the MatMul (and its first consumer) run as float ops on the HTP (mm3.py: 68.8 dB).
Usage: [TAG=demo] [BASE=convT_h0.1] exp13.py VARIANT[,VARIANT] [prefill|decode|both] [cpu]
"""
import sys, os
sys.path.insert(0, os.path.dirname(__file__))
from exp_run import *          # noqa
import onnx
from onnx import helper, numpy_helper, TensorProto

tag = os.environ.get("TAG", "demo")
BASE = os.environ.get("BASE", "convT_h0.1")   # QDQ file the variants start from


def act_matmuls(m):
    prod = {o: n for n in m.graph.node for o in n.output}
    init = {i.name for i in m.graph.initializer}
    out = []
    for n in m.graph.node:
        if n.op_type != "MatMul":
            continue
        ps = [prod.get(i) for i in n.input]
        if all(p is not None and p.op_type == "DequantizeLinear" and p.input[0] not in init for p in ps):
            out.append(n)
    return out


def _qparams(m, dq):
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return float(init[dq.input[1]]), int(init[dq.input[2]]), init[dq.input[2]].dtype


def to_s16(m, node, j, k):
    """Re-encode MatMul input j (a uint16 DQ output) as int16 symmetric, for this MatMul only."""
    prod = {o: n for n in m.graph.node for o in n.output}
    dq = prod[node.input[j]]
    s, zp, dt = _qparams(m, dq)
    assert dt == np.uint16, dt
    lo, hi = (0 - zp) * s, (65535 - zp) * s
    s2 = max(-lo, hi) / 32767
    x = node.input[j]
    m.graph.initializer.extend([numpy_helper.from_array(np.array(s2, np.float32), f"s16_{k}_s"),
                            numpy_helper.from_array(np.array(0, np.int16), f"s16_{k}_z")])
    q = helper.make_node("QuantizeLinear", [x, f"s16_{k}_s", f"s16_{k}_z"], [f"s16_{k}_q"], name=f"s16_{k}_Q")
    d = helper.make_node("DequantizeLinear", [f"s16_{k}_q", f"s16_{k}_s", f"s16_{k}_z"], [f"s16_{k}_dq"], name=f"s16_{k}_DQ")
    node.input[j] = f"s16_{k}_dq"
    PENDING.setdefault(node.name, []).extend([q, d])


PENDING = {}


def flush(m):
    """Insert the pending nodes right before the node they feed (keeps topological order)."""
    nodes = []
    for n in m.graph.node:
        nodes += [helper.make_node(p.op_type, list(p.input), list(p.output), name=p.name) for p in PENDING.get(n.name, [])]
        c = onnx.NodeProto(); c.CopyFrom(n); nodes.append(c)
    PENDING.clear()
    del m.graph.node[:]; m.graph.node.extend(nodes)


def out_to_s16(m, node, k):
    """The MatMul's output Q->DQ re-encoded as int16 symmetric (same range)."""
    cons = [n for n in m.graph.node if node.output[0] in n.input]
    assert len(cons) == 1 and cons[0].op_type == "QuantizeLinear", [c.op_type for c in cons]
    q = cons[0]
    s, zp, dt = _qparams(m, q)
    lo, hi = (0 - zp) * s, (65535 - zp) * s
    s2 = max(-lo, hi) / 32767
    m.graph.initializer.extend([numpy_helper.from_array(np.array(s2, np.float32), f"s16o_{k}_s"),
                            numpy_helper.from_array(np.array(0, np.int16), f"s16o_{k}_z")])
    dqs = [n for n in m.graph.node if q.output[0] in n.input]
    q.input[1], q.input[2] = f"s16o_{k}_s", f"s16o_{k}_z"
    for d in dqs:
        d.input[1], d.input[2] = f"s16o_{k}_s", f"s16o_{k}_z"
    # downstream consumers of these DQs are unchanged (they read float)


def island(m, node):
    """Remove the Q->DQ pair on the MatMul's output: consumers read the float MatMul output."""
    cons = [n for n in m.graph.node if node.output[0] in n.input]
    assert len(cons) == 1 and cons[0].op_type == "QuantizeLinear", [c.op_type for c in cons]
    q = cons[0]
    dqs = [n for n in m.graph.node if q.output[0] in n.input]
    assert all(d.op_type == "DequantizeLinear" for d in dqs)
    for d in dqs:
        for n in m.graph.node:
            for t, i in enumerate(n.input):
                if i == d.output[0]:
                    n.input[t] = node.output[0]
        for o in m.graph.output:
            assert o.name != d.output[0]
    for r in [q] + dqs:
        m.graph.node.remove(r)


def variant(src, dst, v):
    m = onnx.load(str(src))
    mms = act_matmuls(m)
    for k, n in enumerate(mms):
        if v in ("s16b", "s16ab"):
            to_s16(m, n, 1, f"{k}b")
        if v == "s16ab":
            to_s16(m, n, 0, f"{k}a")
            out_to_s16(m, n, k)
        if v == "island":
            island(m, n)
    flush(m)
    onnx.checker.check_model(m)
    onnx.save(m, str(dst))
    return dst, len(mms)


if __name__ == "__main__":
    vs = sys.argv[1].split(",")
    comps = {"both": ("prefill", "decode")}.get(sys.argv[2] if len(sys.argv) > 2 else "both", None) or (sys.argv[2],)
    cpu = "cpu" in sys.argv[3:]
    fp16 = "fp16" in sys.argv[3:]
    for comp in comps:
        d = load(tag, comp)
        src = W / f"{tag}-{comp}/{BASE}.qdq.onnx"
        for v in vs:
            if v == "base":
                p, n = src, 0
            else:
                p, n = variant(src, W / f"{tag}-{comp}/{BASE}_{v}.qdq.onnx", v)
            t0 = time.time()
            try:
                show(f"{v} ({n} MatMuls) HTP{' fp16' if fp16 else ''}", comp, score(p, d, fp16=fp16))
            except Exception as e:
                print("FAILED", v, comp, str(e)[:300], flush=True)
            print(f"   ({time.time() - t0:.0f} s)", flush=True)
            if cpu:
                show(f"{v} ({n} MatMuls) ORT CPU", comp, score(p, d, "ort-cpu"))
