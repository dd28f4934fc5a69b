"""GPTQ weight rounding for QDQ builds: choose each quantized weight's integers so the *layer's output*
on the calibration activations is closest to fp32, instead of rounding every weight to its nearest
grid point independently (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers").

It runs after ONNX Runtime's quantizer and keeps its grid: every weight's scale, zero point, axis and
integer type stay exactly as the quantizer chose them (MinMax per channel or per tensor); only the
integers change. So every consumer of the QDQ ONNX (ORT CPU, the QNN EP's DLC and context binaries,
AI Hub) runs the rounded weights with no other difference.

For a linear y = W x (W [rows, cols], one quantization scale per row or one for all), the output error
over the calibration inputs is tr(E H E^T) with E = W - W_q and H = sum x x^T (the inputs' second
moment). GPTQ quantizes W one input column at a time (largest diag(H) first, "act order") and spreads
each column's rounding error over the columns not yet quantized through the inverse Hessian, so later
columns compensate for it. H comes from the fp32 model on the same calibration inputs as the
activation ranges (never the held-out inputs parity scores on).

Every weight is checked before GPTQ is used on it: GPTQ fitted to half the calibration calls must give
a better output SNR (10 log10 tr(W H W^T) / tr(E H E^T)) than nearest rounding on the other half
(Moments); otherwise the nearest integers stay. Few calibration rows make the Hessian low-rank and
GPTQ overfit them: the check catches that without looking at the held-out inputs.
What was done is written next to the QDQ ONNX as `<name>.rounding.json` and recorded in the build's
details.

Handled: MatMul by a 2-D constant weight, 1x1 Conv (group 1), weights with one consumer. Others keep
their nearest integers (counted in the report as skipped).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

DAMP = 0.01                  # fraction of mean(diag H) added to the diagonal (the paper's default)
BLOCK = 128                  # columns per lazy batch update
HESSIAN_BYTES = 1 << 30      # float64 Hessians accumulated per calibration pass


class Moments:
    """A linear's input second moment from the calibration set, kept as two halves (even / odd
    calibration calls; the first / second half of the rows when there is one call). GPTQ fits its
    integers to one half and must beat nearest rounding on the other half before it is used: with
    few calibration rows the Hessian is low-rank and GPTQ pushes the error into directions the
    calibration never exercised (MiniCPM-o's tts_condition w8a16: per-linear +7 dB on the calibration
    inputs, the graph 31.1 -> 28.0 dB on held-out inputs)."""

    def __init__(self, cols: int):
        self.h = [np.zeros((cols, cols)), np.zeros((cols, cols))]
        self.n = [0, 0]

    def add(self, x: np.ndarray, call: int, calls: int) -> None:
        x = x.astype(np.float64)
        parts = [(call % 2, x)] if calls > 1 else [(0, x[: len(x) // 2]), (1, x[len(x) // 2:])]
        for half, rows in parts:
            self.h[half] += rows.T @ rows
            self.n[half] += len(rows)

    def fit(self):
        return self.h[0] / max(self.n[0], 1)

    def check(self):
        return self.h[1] / max(self.n[1], 1)

    def full(self):
        return (self.h[0] + self.h[1]) / max(self.n[0] + self.n[1], 1)

    @property
    def rows(self) -> int:
        return self.n[0] + self.n[1]


METHODS = ("nearest", "gptq")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"weight_rounding must be one of {', '.join(METHODS)}; got {method!r}")
    return method


def sidecar(qdq: Path) -> Path:
    return qdq.with_name(qdq.name + ".rounding.json")


def round_weights(fp32: Path, qdq: Path, calibration: Sequence[dict]) -> dict:
    """Rewrite the integer weights of `qdq` (quantized from `fp32`) by GPTQ. Returns the report (also
    written to sidecar(qdq))."""
    import onnx
    from onnx import numpy_helper

    from .onnxfile import save

    model = onnx.load(str(qdq))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    src = onnx.load(str(fp32), load_external_data=False)
    by_output = {n.output[0]: n for n in src.graph.node if n.output}
    by_name = {n.name: n for n in src.graph.node if n.name}
    src_inits = {i.name for i in src.graph.initializer}

    targets, skipped = [], []
    for n in g.node:
        if n.op_type not in ("MatMul", "Conv") or len(n.input) < 2:
            continue
        dq = producer.get(n.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        w_init = inits[dq.input[0]]
        # the quantizer keeps node names; an unnamed node keeps its output name unless it is a graph output
        ref = by_name.get(n.name) if n.name else by_output.get(n.output[0])
        if ref is not None and ref.op_type != n.op_type:
            ref = None
        why = _unsupported(n, w_init, ref, consumers, dq, src_inits)
        if why:
            skipped.append({"node": n.name or n.output[0], "why": why})
            continue
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        targets.append({"node": n.name or n.output[0], "op": n.op_type, "x": ref.input[0], "dq": dq,
                        "weight": w_init.name, "fp32_weight": ref.input[1], "axis": axis})

    report = {"method": "gptq", "damp": DAMP, "act_order": True, "calibration_calls": len(calibration),
              "weights": [], "skipped": skipped}
    if targets:
        fp32_weights = _float_weights(fp32, {t["fp32_weight"] for t in targets})
        dims = {t["x"]: _cols(t, fp32_weights[t["fp32_weight"]]) for t in targets}
        hessians = _hessians(fp32, calibration, dims)
        for t in targets:
            w = fp32_weights[t["fp32_weight"]]
            rec, q = _round_one(t, w, hessians[t["x"]], inits)
            report["weights"].append(rec)
            if q is not None:
                new = q if isinstance(q, onnx.TensorProto) else numpy_helper.from_array(q, t["weight"])
                inits[t["weight"]].CopyFrom(new)
        del hessians, fp32_weights
    report["summary"] = summary(report["weights"], len(skipped))
    save(model, qdq)
    sidecar(qdq).write_text(json.dumps(report, indent=1))
    return report


def _unsupported(n, w_init, ref, consumers, dq, src_inits) -> str:
    if ref is None or len(ref.input) < 2:
        return "no matching node in the fp32 graph"
    if ref.input[1] not in src_inits:
        return "weight is not a constant of the fp32 graph"
    if consumers.get(dq.output[0], 0) != 1 or consumers.get(dq.input[0], 0) != 1:
        return "weight shared by several nodes"
    dims = list(w_init.dims)
    if n.op_type == "MatMul":
        return "" if len(dims) == 2 else f"weight rank {len(dims)}"
    attrs = {a.name: a for a in n.attribute}
    if len(dims) != 4 or dims[2:] != [1, 1]:
        return "Conv kernel is not 1x1"
    if "group" in attrs and attrs["group"].i != 1:
        return "grouped Conv"
    return ""


def _cols(t, w: np.ndarray) -> int:
    return w.shape[0] if t["op"] == "MatMul" else w.shape[1]


def _float_weights(fp32: Path, names: set) -> dict:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(fp32))
    return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer if i.name in names}


def _hessians(fp32: Path, calibration: Sequence[dict], dims: dict) -> dict:
    """{activation: Moments over the calibration rows} from the fp32 graph (ONNX Runtime, the
    activations added as graph outputs; passes over the calibration set as needed to keep the float64
    accumulators under HESSIAN_BYTES)."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(fp32), load_external_data=False)
    have = {o.name for o in m.graph.output}
    for name in dims:
        if name not in have:
            m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    aug = fp32.with_name(f".gptq-{fp32.name}")         # beside fp32: its external data path resolves
    onnx.save(m, str(aug))
    del m
    out = {}
    try:
        sess = ort.InferenceSession(str(aug), providers=["CPUExecutionProvider"])
        for chunk in _passes(dims):
            acc = {n: Moments(dims[n]) for n in chunk}
            for i, feed in enumerate(calibration):
                for n, x in zip(chunk, sess.run(chunk, feed)):
                    acc[n].add(_rows(x, dims[n]), i, len(calibration))
            out.update(acc)
        del sess
    finally:
        aug.unlink(missing_ok=True)
    return out


def _passes(dims: dict) -> list[list[str]]:
    """Group inputs {name: width} into calibration passes whose Moments (two float64 [w, w] halves)
    fit in HESSIAN_BYTES together (one input per pass when it alone is larger)."""
    chunks, cur, size = [], [], 0
    for n, w in dims.items():
        b = w * w * 16
        if cur and size + b > HESSIAN_BYTES:
            chunks.append(cur)
            cur, size = [], 0
        cur.append(n)
        size += b
    if cur:
        chunks.append(cur)
    return chunks


def _rows(x: np.ndarray, cols: int) -> np.ndarray:
    """Activation -> [rows, cols]: the last axis for a MatMul input, axis 1 for a Conv input (NCHW)."""
    x = np.asarray(x, np.float32)
    if x.shape[-1] == cols and (x.ndim != 4 or x.shape[1] != cols):
        return x.reshape(-1, cols)
    return np.moveaxis(x, 1, -1).reshape(-1, cols)


def _grid(t, inits, rows: int, cols: int):
    """Scale, zero point (per row [rows], or per row and input column [rows, cols] for block-quantized
    weights; float64) and the integer bounds the quantizer's integers use."""
    from onnx import numpy_helper

    dq = t["dq"]
    q0 = numpy_helper.to_array(inits[dq.input[0]])
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    zp = (numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64)
          if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale))
    ints = q0.astype(np.int64)
    lo, hi = int(ints.min()), int(ints.max())
    block = next((a.i for a in dq.attribute if a.name == "block_size"), 0)
    if block:                            # blocks of input columns: [K/b, N] (MatMul) or [N, K/b, 1, 1] (Conv)
        per = scale.T if t["op"] == "MatMul" else scale.reshape(rows, -1)
        zper = zp.T if t["op"] == "MatMul" else zp.reshape(rows, -1)
        return np.repeat(per, block, axis=1), np.repeat(zper, block, axis=1), lo, hi, q0.dtype
    scale, zp = scale.reshape(-1), zp.reshape(-1)
    if scale.size not in (1, rows) or (scale.size == rows > 1 and t["axis"] != t["row_axis"]):
        return None                      # not one scale per output channel, nor one for all
    scale = np.broadcast_to(scale, (rows,)).copy()
    zp = np.broadcast_to(zp, (rows,)).copy()
    return scale, zp, lo, hi, q0.dtype


def _round_one(t, w: np.ndarray, H: Moments, inits):
    """GPTQ on one weight; returns (record, new integer array in the initializer's layout or None)."""
    W = (w.T if t["op"] == "MatMul" else w.reshape(w.shape[0], w.shape[1])).astype(np.float64)   # [rows, cols]
    rows, cols = W.shape
    t["row_axis"] = 1 if t["op"] == "MatMul" else 0          # the initializer's output-channel axis
    grid = _grid(t, inits, rows, cols)
    rec = {"node": t["node"], "shape": [rows, cols]}
    if grid is None:
        rec.update(kept="nearest", why="quantization scales are not per output channel nor per tensor")
        return rec, None
    scale, zp, lo, hi, dtype = grid
    ints, r = round_rows(W, H, scale, lo, hi, zp)
    rec.update(r)
    if rec["kept"] != "gptq":
        return rec, None
    q = ints.T if t["op"] == "MatMul" else ints.reshape(inits[t["weight"]].dims)
    if "int4" in str(dtype):
        from .onnxfile import int4_tensor

        return rec, int4_tensor(t["weight"], np.ascontiguousarray(q).astype(np.int8))
    return rec, np.ascontiguousarray(q).astype(dtype)


def _energy(E: np.ndarray, H: np.ndarray) -> float:
    return float(np.einsum("ij,jk,ik->", E, H, E))


def _gptq(W, H, scale, zp, lo, hi) -> np.ndarray | None:
    """Integer codes [rows, cols] for W by GPTQ with fixed per-row scale / zero point."""
    rows, cols = W.shape
    H = H.copy()
    dead = np.diag(H) <= 0
    H[dead, dead] = 1.0
    perm = np.argsort(-np.diag(H), kind="stable")
    W = W[:, perm].copy()
    H = H[perm][:, perm]
    damp = DAMP * float(np.mean(np.diag(H)))
    for attempt in range(4):
        try:
            L = np.linalg.cholesky(H + damp * np.eye(cols))
            Linv = np.linalg.inv(L)
            Hinv = np.linalg.cholesky(Linv.T @ Linv).T          # upper Cholesky factor of H^-1
            break
        except np.linalg.LinAlgError:
            damp *= 10
    else:
        return None
    s, z = _per_column(scale, W.shape)[:, perm], _per_column(zp, W.shape)[:, perm]
    Q = np.empty_like(W)
    for i1 in range(0, cols, BLOCK):
        i2 = min(i1 + BLOCK, cols)
        W1 = W[:, i1:i2].copy()
        Err = np.empty_like(W1)
        Hb = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            w = W1[:, i:i + 1]
            c = slice(i1 + i, i1 + i + 1)
            qi = np.clip(np.round(w / s[:, c] + z[:, c]), lo, hi)
            Q[:, c] = qi
            err = (w - (qi - z[:, c]) * s[:, c]) / Hb[i, i]
            W1[:, i:] -= err @ Hb[i:i + 1, i:]
            Err[:, i:i + 1] = err
        W[:, i2:] -= Err @ Hinv[i1:i2, i2:]
    out = np.empty_like(Q)
    out[:, perm] = Q
    return out


# ---- the same rounding for torch modules (the .pte's int8 weight-only layers, exporters/executorch.py)

def linear_hessians(module, calibration: Sequence[Sequence], names: Sequence[str]) -> dict:
    """{qualified Linear name: Moments of its input} over `calibration` (positional args of
    module), passes over the calibration set as needed to keep the float64 accumulators under
    HESSIAN_BYTES."""
    import torch

    layers = dict(module.named_modules())
    out = {}
    for chunk in _passes({n: layers[n].in_features for n in names}):
        acc = {n: Moments(layers[n].in_features) for n in chunk}
        call = [0]

        def hook(mod, args, _out, n):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double().numpy()
            acc[n].add(x, call[0], len(calibration))

        handles = [layers[n].register_forward_hook(lambda m, a, o, n=n: hook(m, a, o, n)) for n in chunk]
        try:
            with torch.no_grad():
                for i, args in enumerate(calibration):
                    call[0] = i
                    module(*args)
        finally:
            for h in handles:
                h.remove()
        out.update(acc)
    return out


def round_rows(W: np.ndarray, H: Moments, scale: np.ndarray, lo: int, hi: int,
               zp: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Integers for W [rows, cols] on the grid (`scale`, zero point `zp` per row [rows] or per element
    [rows, cols] for block scales; bounds lo..hi).

    GPTQ fitted to one half of the calibration rows must beat nearest rounding on the other half
    (the layer's output error there); then the integers are GPTQ's on all rows, else nearest.
    Returns (integers, record: output SNRs on the check half and on all rows, which was kept)."""
    zp = np.zeros_like(scale) if zp is None else zp
    s, z = _per_column(scale, W.shape), _per_column(zp, W.shape)
    nearest = np.clip(np.round(W / s + z), lo, hi)

    def db(ints, h):
        return float(10 * np.log10(_energy(W, h) / max(_energy(W - (ints - z) * s, h), 1e-300)))

    full = H.full()
    rec = {"shape": list(W.shape), "calibration_rows": H.rows, "nearest_db": round(db(nearest, full), 2)}
    trial = _gptq(W, H.fit(), scale, zp, lo, hi)
    if trial is None:
        return nearest, {**rec, "kept": "nearest", "why": "Hessian not positive definite"}
    check = H.check()
    rec["check_nearest_db"], rec["check_gptq_db"] = round(db(nearest, check), 2), round(db(trial, check), 2)
    if not rec["check_gptq_db"] > rec["check_nearest_db"]:
        return nearest, {**rec, "kept": "nearest", "why": "GPTQ fitted to half the calibration rows lost on the other half"}
    ints = _gptq(W, full, scale, zp, lo, hi)
    if ints is None:
        return nearest, {**rec, "kept": "nearest", "why": "Hessian not positive definite"}
    rec["gptq_db"] = round(db(ints, full), 2)
    return ints, {**rec, "kept": "gptq"}


def _per_column(a: np.ndarray, shape) -> np.ndarray:
    """A per-row [rows] or per-element [rows, cols] scale / zero point as [rows, cols]."""
    return np.broadcast_to(a[:, None] if a.ndim == 1 else a, shape)


def summary(records: Sequence[dict], skipped: int = 0) -> dict:
    kept = [r for r in records if r["kept"] == "gptq"]
    return {"weights_rounded": len(kept), "weights_seen": len(records), "skipped": skipped,
            "median_gain_db": round(float(np.median([r["gptq_db"] - r["nearest_db"] for r in kept])), 2) if kept else 0.0,
            "median_check_gain_db": round(float(np.median([r["check_gptq_db"] - r["check_nearest_db"]
                                                           for r in kept])), 2) if kept else 0.0,
            "min_gptq_db": round(min(r["gptq_db"] for r in kept), 2) if kept else None}
