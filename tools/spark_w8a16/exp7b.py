import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx
from onnx import helper, numpy_helper, TensorProto
tag = sys.argv[1] if len(sys.argv) > 1 else "demo"

def to_conv(src, dst):
    m = onnx.load(src)
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    new_nodes, k = [], 0
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if w is None or len(w.dims) != 2:
            new_nodes.append(n); continue
        k += 1
        W = numpy_helper.to_array(w)                      # [in, out]
        cw = numpy_helper.from_array(np.ascontiguousarray(W.T[:, :, None, None]), f"{w.name}_conv{k}")
        g.initializer.append(cw)
        inn, out = W.shape
        s1 = numpy_helper.from_array(np.array([-1, inn], np.int64), f"lc_shape_in{k}")
        s2 = numpy_helper.from_array(np.array([1, inn, 1, -1], np.int64), f"lc_shape_4{k}")
        s3 = numpy_helper.from_array(np.array([out, -1], np.int64), f"lc_shape_o{k}")
        g.initializer.extend([s1, s2, s3])
        x2, xt, x4, y4, y2, yt = (f"lc_{t}{k}" for t in ("x2", "xt", "x4", "y4", "y2", "yt"))
        new_nodes.append(helper.make_node("Reshape", [n.input[0], s1.name], [x2]))
        new_nodes.append(helper.make_node("Transpose", [x2], [xt], perm=[1, 0]))
        new_nodes.append(helper.make_node("Reshape", [xt, s2.name], [x4]))
        new_nodes.append(helper.make_node("Conv", [x4, cw.name], [y4], name=f"lc_c{k}", kernel_shape=[1, 1]))
        new_nodes.append(helper.make_node("Reshape", [y4, s3.name], [y2]))
        new_nodes.append(helper.make_node("Transpose", [y2], [yt], perm=[1, 0]))
        y4 = yt
        # back to the MatMul's output shape: same leading dims as the input, last = out
        shp = f"lc_xs{k}"; lead = f"lc_lead{k}"; full = f"lc_full{k}"
        st = numpy_helper.from_array(np.array([0], np.int64), f"lc_st{k}"); en = numpy_helper.from_array(np.array([-1], np.int64), f"lc_en{k}")
        o = numpy_helper.from_array(np.array([out], np.int64), f"lc_o{k}")
        g.initializer.extend([st, en, o])
        new_nodes.append(helper.make_node("Shape", [n.input[0]], [shp]))
        new_nodes.append(helper.make_node("Slice", [shp, st.name, en.name], [lead]))
        new_nodes.append(helper.make_node("Concat", [lead, o.name], [full], axis=0))
        new_nodes.append(helper.make_node("Reshape", [y4, full], [n.output[0]], name=f"lc_rb{k}"))
    del g.node[:]; g.node.extend(new_nodes)
    onnx.save(m, dst)
    return dst, k

for comp in ("decode", "prefill"):
    d = load(tag, comp)
    src, k = to_conv(d["fp32"], str(W / f"{tag}-{comp}/convT.onnx"))
    sh = score(src, d, "ort-cpu"); show(f"conv fp32 CPU ({k} linears)", comp, sh)
    for h in (0.1, 0.5):
        from onnxruntime.quantization import QuantType
        q = quant(src, W / f"{tag}-{comp}/convT_h{h}.qdq.onnx", d["calib"], headroom=h)
        show(f"{tag} convT-linears w8a16 h{h} HTP", comp, score(q, d))
