"""Trace a component of a demo checkpoint and write its fp32 ONNX (target rewrites applied) and the
captured calibration / held-out inputs and fp32 references as .npz, for the w4a16 probes (run.py).

    PYTHONPATH=. .venv/bin/python tools/w4a16/setup.py qwen3-tts code2wav   # --left-context 2 --chunk-frames 2
    PYTHONPATH=. .venv/bin/python tools/w4a16/setup.py spark prefill         # --prefill-tokens 16 --context-length 96
"""
import json
import sys
from pathlib import Path

import numpy as np

from omni_export.exporters.lower import Lowering
from omni_export.targets import get_target
from omni_export.trace import trace

W = Path("/tmp/w4/exp")
OPTIONS = {"qwen3-tts": {"left-context": 2, "chunk-frames": 2}, "spark": {"prefill-tokens": 16, "context-length": 96}}


def main(recipe: str, comp: str) -> None:
    if recipe == "spark":
        from omni_export.recipes.spark import model as rm
    else:
        from omni_export.recipes.qwen3_tts import model as rm
    m = rm.load(None, OPTIONS[recipe], W / f"scratch-{recipe}")
    tgt = get_target("s25-htp")
    g = m.graph(comp)
    t = trace(g, m.samples(comp, "calibration"), m.samples(comp, "heldout"))
    low = Lowering(t, tgt, W / f"{recipe}-{comp}", rewrites=tgt.rewrites)
    p = low.onnx(__import__("omni_export.core", fromlist=["Precision"]).Precision.FP32)
    d = W / f"{recipe}-{comp}"
    for kind, rows in (("calib", t.calibration), ("held", t.heldout), ("ref", t.reference)):
        for i, row in enumerate(rows):
            np.savez(d / f"{kind}{i}.npz", **{k: np.asarray(v) for k, v in row.items()})
    (d / "meta.json").write_text(json.dumps({"fp32": str(p), "ins": list(t.input_names), "outs": list(t.output_names),
                                             "calib": len(t.calibration), "held": len(t.heldout),
                                             "logits": list(t.logits)}))
    print(comp, p, len(t.calibration), len(t.heldout))


if __name__ == "__main__":
    main(*sys.argv[1:3])
