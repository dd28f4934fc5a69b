import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
import onnx
tag = sys.argv[1] if len(sys.argv) > 1 else "demo"
for comp in ("prefill", "decode"):
    d = load(tag, comp)
    src = str(W / f"{tag}-{comp}/convT.onnx")
    m = onnx.load(src)
    att = [n.name for n in m.graph.node if n.op_type == "MatMul"]        # remaining MatMuls: act x act
    print(comp, "act x act MatMuls:", len(att))
    q = quant(src, W / f"{tag}-{comp}/convT_fp16att.qdq.onnx", d["calib"], headroom=0.1, exclude=att)
    try:
        show(f"{tag} convT h0.1, attention MatMuls fp16, HTP", comp, score(q, d, fp16=True))
    except Exception as e:
        print("FAILED", str(e)[:300])
    try:
        show(f"{tag} convT h0.1, attention MatMuls fp32, CPU", comp, score(q, d, "ort-cpu"))
    except Exception as e:
        print("FAILED", str(e)[:300])
