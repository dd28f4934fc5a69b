import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
tag = sys.argv[1] if len(sys.argv) > 1 else "demo"
for comp in ("prefill", "decode"):
    d = load(tag, comp)
    src = str(W / f"{tag}-{comp}/convT.onnx")
    for h in (0.0, 0.05, 0.2):
        q = quant(src, W / f"{tag}-{comp}/convT_h{h}.qdq.onnx", d["calib"], headroom=h)
        show(f"{tag} convT w8a16 h{h} HTP", comp, score(q, d))
