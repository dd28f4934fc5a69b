import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
tag = sys.argv[1] if len(sys.argv) > 1 else "demo"
for comp in ("decode", "prefill"):
    d = load(tag, comp); src = d["fp32"]
    q = quant(src, W / f"{tag}-{comp}/h05.qdq.onnx", d["calib"], headroom=0.5)
    show("w8a16 headroom 0.5 HTP", comp, score(q, d))
    show("w8a16 headroom 0.5 ORT-CPU", comp, score(q, d, "ort-cpu"))
    q0 = quant(src, W / f"{tag}-{comp}/h0.qdq.onnx", d["calib"], headroom=0.0)
    show("w8a16 headroom 0 HTP", comp, score(q0, d))
    show("fp16 HTP", comp, score(src, d, fp16=True))
