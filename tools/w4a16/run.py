"""w4a16 arms on a traced component (tools/w4a16/setup.py): quantize with exporters/onnx.quantize_qdq's
int4 layouts (and GPTQ), score on the HTP simulator (and ORT CPU), compile a context binary.

    PYTHONPATH=. .venv/bin/python tools/w4a16/run.py qwen3-tts-code2wav tensor channel block block+gptq [cpu] [ctx]
Env BLOCK sets INT4_BLOCK; PER_CHANNEL_LINEARS=1 lowers linears as 1x1 Conv; BASE=DIR imports omni_export
from DIR (e.g. an export of another commit) with arm "head" = that commit's quantize_qdq at w4a16.
"""
import json
import os
import sys
import time
from pathlib import Path

if os.environ.get("BASE"):
    sys.path.insert(0, os.environ["BASE"])
import numpy as np  # noqa: E402

from omni_export import qnn_ep  # noqa: E402
from omni_export.core import Precision  # noqa: E402
from omni_export.exporters import onnx as ox  # noqa: E402
from omni_export.runtime.runners import RunnerSpec, run_all  # noqa: E402

W = Path("/tmp/w4/exp")


def load(tag):
    d = W / tag
    meta = json.loads((d / "meta.json").read_text())
    rows = {k: [dict(np.load(d / f"{k}{i}.npz")) for i in range(meta[k if k != "ref" else "held"])]
            for k in ("calib", "held", "ref")}
    return meta, rows


def snr(r, o):
    r = np.asarray(r, np.float64)
    o = np.asarray(o, np.float64)
    return 10 * np.log10((r ** 2).sum() / max(((r - o) ** 2).sum(), 1e-30))


def score(path, meta, rows, kind):
    opts = qnn_ep.provider_options("69", "79", fp16=False, finalize="1") if kind == "qnn-htp" else {}
    outs = run_all(RunnerSpec(kind, str(path), tuple(meta["ins"]), tuple(meta["outs"]), opts, None), rows["held"])
    res = {}
    for n in meta["outs"]:
        res[n] = round(snr(np.concatenate([x[n].ravel() for x in rows["ref"]]),
                           np.concatenate([x[n].ravel() for x in outs])), 2)
    for n in meta.get("logits") or ():
        a = np.concatenate([x[n].reshape(-1, x[n].shape[-1]) for x in rows["ref"]]).argmax(-1)
        b = np.concatenate([x[n].reshape(-1, x[n].shape[-1]) for x in outs]).argmax(-1)
        res[f"{n}_top1"] = round(float((a == b).mean()), 3)
    return res


def bits(path):
    """{bits: share of weight bytes} over the DequantizeLinear'd initializers of >= 2 dims."""
    import onnx
    m = onnx.load(str(path), load_external_data=True)
    inits = {i.name: i for i in m.graph.initializer}
    size = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4, onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8,
            onnx.TensorProto.UINT16: 16, onnx.TensorProto.INT16: 16, onnx.TensorProto.INT32: 32}
    tot = {}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits and len(inits[n.input[0]].dims) >= 2:
            t = inits[n.input[0]]
            b = size.get(t.data_type, 32)
            tot[b] = tot.get(b, 0) + int(np.prod(t.dims)) * b / 8
    s = sum(tot.values())
    return {k: round(v / s, 3) for k, v in sorted(tot.items())}


def main(tag, *arms):
    meta, rows = load(tag)
    cpu, ctx = "cpu" in arms, "ctx" in arms
    if os.environ.get("BLOCK"):
        ox.INT4_BLOCK = int(os.environ["BLOCK"])
    pcl = os.environ.get("PER_CHANNEL_LINEARS") == "1"
    for arm in [a for a in arms if a not in ("cpu", "ctx")]:
        block = getattr(ox, "INT4_BLOCK", 0)
        out = W / tag / "arms" / f"{arm}-b{block}-pcl{int(pcl)}" / "q.onnx"
        layout, _, rounding = arm.partition("+")
        t0 = time.time()
        kw = {} if layout == "head" else {"int4_weights": layout}
        ox.quantize_qdq(Path(meta["fp32"]), out, rows["calib"], Precision.W4A16, per_channel_linears=pcl,
                        weight_rounding=rounding or "nearest", **kw)
        tq = time.time() - t0
        line = {"arm": arm, "block": block, "pcl": pcl, "quantize_s": round(tq, 1), "bits": bits(out)}
        try:
            line["htp"] = score(out, meta, rows, "qnn-htp")
        except Exception as e:
            line["htp"] = "FAIL " + str(e).splitlines()[0][:160]
        if cpu:
            line["cpu"] = score(out, meta, rows, "ort-cpu")
        if ctx:
            try:
                c, b = qnn_ep.compile_context(out, out.with_name("q.ctx.onnx"), qnn_ep.provider_options("69", "79", fp16=False, finalize="1"))
                line["ctx_bytes"] = b.stat().st_size
            except Exception as e:
                line["ctx_bytes"] = "FAIL " + str(e).splitlines()[0][:160]
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
