"""Lone activation x activation MatMul on the HTP simulator: which encoding loses precision?

Hand-built QDQ graphs (no quantizer), Q.K^T at prefill's full-attention shapes. Each tensor gets an
encoding spec: u16 (asymmetric uint16), u16s (uint16, zero point 32768), s16 (int16, zp 0), u8,
s8, f (left in float). Prints the SNR vs fp64 numpy on the HTP simulator and ORT CPU.
Usage: [SHAPE=qk|pv|qk1] [DUMP=1] mm3.py [variant ...]   (default: all)
"""
import sys, os, json, glob
sys.path.insert(0, os.path.dirname(__file__))
from exp_run import *          # noqa  (snr, RunnerSpec, run_all, qnn_ep)
import onnx
from onnx import helper, TensorProto, numpy_helper

OUT = Path("/tmp/sp/mm3"); OUT.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
SA, SB = {"qk": ([1, 8, 16, 32], [1, 8, 32, 112]), "pv": ([1, 8, 16, 112], [1, 8, 112, 32]),
          "qk1": ([1, 8, 1, 32], [1, 8, 32, 97])}[os.environ.get("SHAPE", "qk")]
DT = {"u16": (TensorProto.UINT16, 0, 65535), "s16": (TensorProto.INT16, -32768, 32767),
      "u8": (TensorProto.UINT8, 0, 255), "s8": (TensorProto.INT8, -128, 127)}


def enc(spec, lo, hi):
    """(onnx dtype, scale, zero point) for a tensor whose calibrated range is [lo, hi]."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if spec in ("u16s", "u8s"):
        t, qmin, qmax = DT[spec[:-1]]
        zp = (qmax + 1) // 2; a = max(-lo, hi); return t, a / (qmax - zp), zp
    t, qmin, qmax = DT[spec]
    if spec in ("s16", "s8"):                      # symmetric signed
        a = max(-lo, hi); return t, a / qmax, 0
    scale = (hi - lo) / (qmax - qmin)
    return t, scale, int(round(qmin - lo / scale))


def qdq(nodes, inits, name, spec, rng_):
    """Insert Q->DQ on tensor `name` (returns the new name consumers should read)."""
    if spec == "f":
        return name
    if ">" in spec:
        first, second = spec.split(">")
        n1 = qdq(nodes, inits, name, first, rng_)
        rng_[n1] = rng_[name]
        return qdq(nodes, inits, n1, second, rng_)
    t, s, zp = enc(spec, *rng_[name])
    inits += [numpy_helper.from_array(np.array(s, np.float32), f"{name}_s"),
              helper.make_tensor(f"{name}_z", t, [], [zp])]
    nodes += [helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])]
    return f"{name}_dq"


def build(path, body, specs, ranges, ins, outs_shape):
    """body(nodes, inits, x: callable name->name) builds float nodes; x(name) wraps a tensor in QDQ."""
    nodes, inits = [], []
    def x(name):
        return qdq(nodes, inits, name, specs.get(name, "f"), ranges)
    y = body(nodes, inits, x)
    y = x(y)
    nodes.append(helper.make_node("Identity", [y], ["y"]))
    g = helper.make_graph(nodes, "mm3", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in ins],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, outs_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    onnx.save(m, str(path)); return path


def mm_body(kind):
    def body(nodes, inits, x):
        a, b = x("a"), x("b")
        if kind == "ab":
            nodes.append(helper.make_node("MatMul", [a, b], ["mm"])); return "mm"
        if kind == "swap":            # (B^T A^T)^T
            nodes += [helper.make_node("Transpose", [b], ["bt"], perm=[0, 1, 3, 2]),
                      helper.make_node("Transpose", [a], ["at"], perm=[0, 1, 3, 2])]
            bt, at = x("bt"), x("at")
            nodes.append(helper.make_node("MatMul", [bt, at], ["mmt"])); mmt = x("mmt")
            nodes.append(helper.make_node("Transpose", [mmt], ["mm"], perm=[0, 1, 3, 2])); return "mm"
        if kind == "abmul":           # float MatMul followed by a float op, then quantized
            inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
            nodes += [helper.make_node("MatMul", [a, b], ["mm"]), helper.make_node("Mul", ["mm", "half"], ["mm2"])]
            return "mm2"
        raise ValueError(kind)
    return body


def data(n, scale_b=1.0):
    return [{"a": rng.standard_normal(SA).astype(np.float32),
             "b": (rng.standard_normal(SB) * scale_b).astype(np.float32)} for _ in range(n)]


def ranges_of(model_float, calib, names):
    """min/max of every named tensor over calib, from a float run with those tensors as outputs."""
    import onnxruntime as ort
    m = onnx.load(str(model_float))
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [o.name for o in s.get_outputs()]
    r = {}
    for c in calib:
        for n, v in zip(outs, s.run(None, c)):
            lo, hi = float(v.min()), float(v.max())
            a, b = r.get(n, (lo, hi)); r[n] = (min(a, lo), max(b, hi))
    return r


def run(path, held, kinds=("qnn-htp", "ort-cpu"), fp16=False, dump=None):
    res = {}
    for kind in kinds:
        opts = qnn_ep.provider_options("69", "79", fp16=fp16) if kind == "qnn-htp" else {}
        if dump and kind == "qnn-htp":
            opts.update({"dump_json_qnn_graph": "1", "json_qnn_graph_dir": str(dump)})
        try:
            spec = RunnerSpec(kind, str(path), tuple(held[0].keys()), ("y",), opts, None)
            res[kind] = run_all(spec, held)
        except Exception as e:
            res[kind] = str(e).splitlines()[0][:160]
    return res


def exact(held, fn):
    return [fn(**{k: v.astype(np.float64) for k, v in h.items()}) for h in held]


def report(label, res, ref):
    parts = []
    for kind, outs in res.items():
        if isinstance(outs, str):
            parts.append(f"{kind} FAIL {outs}")
        else:
            r = np.concatenate([x.ravel() for x in ref]); o = np.concatenate([x["y"].ravel() for x in outs])
            parts.append(f"{kind} {snr(r, o):6.2f}")
    print(f"{label:44s} " + " | ".join(parts), flush=True)


def dump_summary(d):
    """Op types and tensor dtypes of the QNN graph the EP built (from its JSON dump)."""
    for f in glob.glob(str(Path(d) / "*.json")):
        j = json.load(open(f))
        g = j.get("graph", j)
        ts = g.get("tensors", {}); ns = g.get("nodes", {})
        for nn, n in ns.items():
            ins = [(i, ts.get(i, {}).get("data_type"), ts.get(i, {}).get("quant_params", {}).get("scale_offset")) for i in n.get("input_names", [])]
            outs = [(o, ts.get(o, {}).get("data_type"), ts.get(o, {}).get("quant_params", {}).get("scale_offset")) for o in n.get("output_names", [])]
            print("   ", n.get("type"), ins, "->", outs)


if __name__ == "__main__":
    calib, held = data(8), data(4)
    f = build(OUT / "mm_f.onnx", mm_body("ab"), {}, {}, [("a", SA), ("b", SB)], None)
    fs = build(OUT / "mm_fswap.onnx", mm_body("swap"), {}, {}, [("a", SA), ("b", SB)], None)
    rg = ranges_of(f, calib, ["a", "b", "mm"]); rg.update(ranges_of(fs, calib, ["bt", "at", "mmt"]))
    rg = {k: (lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo)) for k, (lo, hi) in rg.items()}   # headroom 0.1
    ref = exact(held, lambda a, b: a @ b)
    rg["mm2"] = (rg["mm"][0] * 0.5, rg["mm"][1] * 0.5)
    V = {
        "u16 x u16 -> u16": ("ab", {"a": "u16", "b": "u16", "mm": "u16"}),
        "u16 x u16s -> u16": ("ab", {"a": "u16", "b": "u16s", "mm": "u16"}),
        "s16 x s16 -> s16": ("ab", {"a": "s16", "b": "s16", "mm": "s16"}),
        "u16s x u16s -> u16": ("ab", {"a": "u16s", "b": "u16s", "mm": "u16"}),
        "u8 x u16 -> u16": ("ab", {"a": "u8", "b": "u16", "mm": "u16"}),
        "u16 x u8 -> u16": ("ab", {"a": "u16", "b": "u8", "mm": "u16"}),
        "u8 x u8 -> u16": ("ab", {"a": "u8", "b": "u8", "mm": "u16"}),
        "u8 x u8 -> u8": ("ab", {"a": "u8", "b": "u8", "mm": "u8"}),
        "u16 x u16 -> f": ("ab", {"a": "u16", "b": "u16"}),
        "u16 x f -> u16": ("ab", {"a": "u16", "mm": "u16"}),
        "f x u16 -> u16": ("ab", {"b": "u16", "mm": "u16"}),
        "u16 x s16 -> u16": ("ab", {"a": "u16", "b": "s16", "mm": "u16"}),
        "s16 x u16 -> u16": ("ab", {"a": "s16", "b": "u16", "mm": "u16"}),
        "s16 x s16 -> u16": ("ab", {"a": "s16", "b": "s16", "mm": "u16"}),
        "u16>s16 x u16>s16 -> u16": ("ab", {"a": "u16>s16", "b": "u16>s16", "mm": "u16"}),
        "u16 x u16>s16 -> u16": ("ab", {"a": "u16", "b": "u16>s16", "mm": "u16"}),
        "u16 x u16 -> f -> Mul(0.5) -> u16": ("abmul", {"a": "u16", "b": "u16", "mm2": "u16"}),
        "swap u16 x u16 -> u16": ("swap", {"a": "u16", "b": "u16", "bt": "u16", "at": "u16", "mmt": "u16", "mm": "u16"}),
    }
    pick = sys.argv[1:] or list(V)
    for k in pick:
        kind, specs = V[k]
        p = build(OUT / f"v_{abs(hash(k))}.onnx", mm_body(kind), specs, rg, [("a", SA), ("b", SB)], None)
        r_ = ref if kind != "abmul" else [0.5 * x for x in ref]
        report(k, run(p, held, dump=OUT / "dump" if os.environ.get("DUMP") else None), r_)
        if os.environ.get("DUMP"):
            dump_summary(OUT / "dump")
        if "fp16" in os.environ.get("MM3", ""):
            report(k + " [fp16 flag]", run(p, held, kinds=("qnn-htp",), fp16=True), r_)
