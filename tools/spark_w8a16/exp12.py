import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx
from onnx import helper, numpy_helper
tag = "demo"
def float_matmuls(src, dst, names):
    m = onnx.load(str(src)); g = m.graph
    prod = {o: n for n in g.node for o in n.output}
    new, k = [], 0
    for n in g.node:
        if n.op_type == "MatMul" and n.name in names:
            for j, i in enumerate(list(n.input)):
                k += 1
                sh = f"fm_shape{k}"
                # a float no-op between the DequantizeLinear and the MatMul: QNN sees a float MatMul
                g.initializer.append(numpy_helper.from_array(np.array([0], np.float32), f"fm_zero{k}"))
                new.append(helper.make_node("Add", [i, f"fm_zero{k}"], [f"{i}_fm{k}"]))
                n.input[j] = f"{i}_fm{k}"
        new.append(n)
    del g.node[:]; g.node.extend(new); onnx.save(m, str(dst)); return dst
for comp in ("prefill", "decode"):
    d = load(tag, comp)
    src = W / f"{tag}-{comp}/convT.onnx"
    names = {n.name for n in onnx.load(str(src)).graph.node if n.op_type == "MatMul"}
    q = W / f"{tag}-{comp}/convT_h0.1.qdq.onnx"
    f = float_matmuls(q, W / f"{tag}-{comp}/convT_h0.1_fmm.qdq.onnx", names)
    for fp16 in (True,):
        try:
            show(f"convT h0.1 + attention MatMuls float (fp16 on HTP)", comp, score(f, d, fp16=fp16))
        except Exception as e:
            print("FAILED", comp, str(e)[:300])
