import sys, time, json, pickle
from pathlib import Path
import numpy as np
from omni_export.recipes.spark import model as sm
from omni_export.trace import trace
from omni_export.exporters.lower import Lowering
from omni_export.targets import get_target
from omni_export.core import Precision
W = Path("/tmp/sp/exp"); W.mkdir(parents=True, exist_ok=True)
ck = sys.argv[1] if len(sys.argv) > 1 else None
tag = sys.argv[2] if len(sys.argv) > 2 else "demo"
m = sm.load(Path(ck) if ck else None, {"prefill-tokens": 16, "context-length": 96}, W / f"scratch-{tag}")
tgt = get_target("s25-htp")
for comp in ("prefill", "decode"):
    g = m.graph(comp)
    t = trace(g, m.samples(comp, "calibration"), m.samples(comp, "heldout"))
    low = Lowering(t, tgt, W / f"{tag}-{comp}", rewrites=("pow_mul", "act_barrier"))
    p = low.onnx(Precision.FP32)
    with open(W / f"{tag}-{comp}.pkl", "wb") as f:
        pickle.dump({"calib": t.calibration, "held": t.heldout, "ref": t.reference, "fp32": str(p),
                     "outs": t.output_names, "ins": t.input_names}, f)
    print(comp, p, len(t.calibration), len(t.heldout))
