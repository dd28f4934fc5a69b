import sys, time, json, pickle, logging
from pathlib import Path
import numpy as np
from omni_export.exporters import onnx as ox
from omni_export.exporters.onnx import _Reader, activation_ranges
from omni_export.parity.runners import run_all, RunnerSpec
from omni_export import qnn_ep
from omni_export.core import Precision
W = Path("/tmp/sp/exp")

def snr(r, o):
    r = np.asarray(r, np.float64); o = np.asarray(o, np.float64)
    return 10*np.log10((r**2).sum()/max(((r-o)**2).sum(), 1e-30))

def quant(src, dst, calib, headroom=0.5, overrides=None, exclude=(), act_bits=16, w16=(), cache={}):
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    logging.getLogger().setLevel(logging.ERROR)
    act = QuantType.QUInt16 if act_bits == 16 else QuantType.QUInt8
    init_ov = {}
    for n in w16:
        init_ov[n] = [{"quant_type": QuantType.QUInt16}]
    cfg = get_qnn_qdq_config(Path(src), _Reader(calib), activation_type=act, weight_type=QuantType.QUInt8,
                             per_channel=True, nodes_to_exclude=list(exclude) or None,
                             init_overrides=init_ov or None)
    ov = dict(cfg.extra_options.get("TensorQuantOverrides") or {})
    if headroom:
        key = (str(src), len(calib))
        if key not in cache:
            cache[key] = activation_ranges(Path(src), calib, Path(dst).parent)
        for name, (lo, hi) in cache[key].items():
            if name not in ov:
                pad = headroom * (hi - lo)
                ov[name] = [{"rmin": np.float32(lo - pad), "rmax": np.float32(hi + pad)}]
    for k, v in (overrides or {}).items():
        ov[k] = v
    cfg.extra_options["TensorQuantOverrides"] = ov
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    quantize(str(src), str(dst), cfg)
    return dst

def score(path, d, kind="qnn-htp", fp16=False):
    opts = qnn_ep.provider_options("69", "79", fp16=fp16) if kind == "qnn-htp" else {}
    spec = RunnerSpec(kind, str(path), tuple(d["ins"]), tuple(d["outs"]), opts, None)
    outs = run_all(spec, d["held"])
    res = {}
    for n in d["outs"]:
        r = np.concatenate([x[n].ravel() for x in d["ref"]]); o = np.concatenate([x[n].ravel() for x in outs])
        res[n] = round(snr(r, o), 2)
    lr = np.concatenate([x["logits"].reshape(-1, x["logits"].shape[-1]) for x in d["ref"]])
    lo = np.concatenate([x["logits"].reshape(-1, x["logits"].shape[-1]) for x in outs])
    res["top1"] = round(float((lr.argmax(-1) == lo.argmax(-1)).mean()), 3)
    return res

def load(tag, comp):
    return pickle.load(open(W / f"{tag}-{comp}.pkl", "rb"))

def show(label, comp, res):
    kv = {k: v for k, v in res.items() if k.startswith("new_")}
    print(f"{label:40s} {comp:8s} logits {res['logits']:6.2f} hidden {res['hidden']:6.2f} top1 {res['top1']:.3f} | " +
          " ".join(f"{k[4:].replace('_value','V').replace('_key','K')}:{v:.1f}" for k, v in kv.items()), flush=True)
