import sys; sys.path.insert(0, "/tmp/sp")
from exp_run import *
for tag in ("demo", "scaled"):
    for comp in ("decode", "prefill"):
        d = load(tag, comp)
        for h in (0.1, 0.25):
            q = quant(d["fp32"], W / f"{tag}-{comp}/h{h}.qdq.onnx", d["calib"], headroom=h)
            show(f"{tag} w8a16 headroom {h} HTP", comp, score(q, d))
