"""GPTQ weight rounding (exporters/gptq.py) on a small two-layer graph with correlated inputs, on ORT
CPU: the QDQ grid (scales, zero points, integer type) is the quantizer's, only the integers change,
and held-out outputs get closer to fp32 than with nearest rounding."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from omni_export.core import Precision
from omni_export.exporters import gptq
from omni_export.exporters import onnx as ox

IN, HID, OUT, T = 48, 64, 32, 24


def _model(path, rng):
    w1 = (rng.standard_normal((IN, HID)) * IN ** -0.5).astype(np.float32)
    w2 = (rng.standard_normal((HID, OUT)) * HID ** -0.5).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Tanh", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, IN])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, OUT])],
                          initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


def _inputs(rng, mix, n):
    """Inputs whose features are strongly correlated (a few directions carry most of the energy),
    as hidden states are: the case where rounding each weight on its own is far from best."""
    return [{"x": (rng.standard_normal((1, T, IN)) @ mix).astype(np.float32)} for _ in range(n)]


def _snr(ref, out):
    ref, out = np.concatenate([r.ravel() for r in ref]), np.concatenate([o.ravel() for o in out])
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((out - ref) ** 2))


def _run(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [s.run(None, f)[0] for f in feeds]


def _weights(path):
    """{DequantizeLinear weight input: (integers, scale, zero point)}."""
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    return {n.input[0]: tuple(inits[i] for i in n.input) for n in m.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].ndim >= 2}


@pytest.mark.parametrize("precision,per_channel,min_gain,block", [(Precision.W8A16, True, 3.0, None),
                                                                  (Precision.W8A16, False, 3.0, None),
                                                                  (Precision.W4A16, True, 3.0, None),
                                                                  (Precision.W4A16, False, 3.0, 16)])
def test_gptq_keeps_the_grid_and_beats_nearest_on_heldout(tmp_path, monkeypatch, precision, per_channel, min_gain,
                                                          block):
    """block: w4a16's int4 scales per block of `block` input rows (exporters/onnx.int4_blocks): GPTQ keeps
    each block's scale."""
    if block:
        monkeypatch.setattr(ox, "INT4_BLOCK", block)
    rng = np.random.default_rng(0)
    src = _model(tmp_path / "m.onnx", rng)
    mix = rng.standard_normal((IN, IN)) * np.geomspace(3, 0.03, IN)[:, None]
    calib, held = _inputs(rng, mix, 16), _inputs(rng, mix, 8)
    ref = _run(src, held)
    near = ox.quantize_qdq(src, tmp_path / "near.qdq.onnx", calib, precision, per_channel_linears=per_channel)
    ours = ox.quantize_qdq(src, tmp_path / "gptq.qdq.onnx", calib, precision, per_channel_linears=per_channel,
                           weight_rounding="gptq")
    db_near, db_ours = _snr(ref, _run(near, held)), _snr(ref, _run(ours, held))
    assert db_ours > db_near + min_gain, (db_near, db_ours)

    wn, wo = _weights(near), _weights(ours)
    assert wn.keys() == wo.keys() and len(wn) == 2
    for name in wn:
        qn, sn, zn = wn[name]
        qo, so, zo = wo[name]
        assert qo.dtype == qn.dtype and qo.shape == qn.shape
        np.testing.assert_array_equal(sn, so)                 # the quantizer's grid, untouched
        np.testing.assert_array_equal(zn, zo)
        assert int(qo.astype(np.int64).min()) >= int(qn.astype(np.int64).min())
        assert int(qo.astype(np.int64).max()) <= int(qn.astype(np.int64).max())
        assert (qo.astype(np.int64) != qn.astype(np.int64)).mean() > 0.05     # integers did change
    if per_channel:
        assert all(np.asarray(wo[n][1]).size > 1 for n in wo)
    if block:
        assert sorted(np.shape(wo[n][1]) for n in wo) == [(IN // block, HID), (HID // block, OUT)]

    report = json.loads(gptq.sidecar(ours).read_text())
    assert report["summary"]["weights_rounded"] == 2 and report["summary"]["skipped"] == 0
    for w in report["weights"]:
        assert w["gptq_db"] > w["nearest_db"]


def test_unknown_weight_rounding_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    src = _model(tmp_path / "m.onnx", rng)
    with pytest.raises(ValueError, match="weight_rounding"):
        ox.quantize_qdq(src, tmp_path / "q.onnx", _inputs(rng, np.eye(IN), 2), Precision.W8A16,
                        weight_rounding="adaround")


def test_gptq_int8_weight_only_layers_for_the_pte(tmp_path):
    """The .pte's int8 weight-only Linears (exporters/executorch.py) with GPTQ: same per-row scales,
    integers within [-127, 127], held-out outputs closer to fp32 than nearest rounding."""
    import copy

    import torch

    from omni_export.exporters import executorch as et

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT)).eval()
    rng = np.random.default_rng(2)
    mix = rng.standard_normal((IN, IN)) * np.geomspace(3, 0.03, IN)[:, None]
    calib = [(torch.from_numpy(f["x"]),) for f in _inputs(rng, mix, 16)]
    held = [torch.from_numpy(f["x"]) for f in _inputs(rng, mix, 8)]
    with torch.no_grad():
        ref = [mlp(x).numpy() for x in held]
    near, ours = copy.deepcopy(mlp), copy.deepcopy(mlp)
    assert et._int8_weights(near) == 2
    hess = gptq.linear_hessians(ours, calib, ["0", "2"])
    assert et._int8_weights(ours, hess) == 2
    with torch.no_grad():
        db_near = _snr(ref, [near(x).numpy() for x in held])
        db_ours = _snr(ref, [ours(x).numpy() for x in held])
    assert db_ours > db_near + 3.0, (db_near, db_ours)
    for a, b in ((near[0], ours[0]), (near[2], ours[2])):
        assert torch.equal(a.scale, b.scale) and b.wq.dtype == torch.int8
        assert int(b.wq.abs().max()) <= 127 and b.rounding["kept"] == "gptq"
        assert (a.wq != b.wq).float().mean() > 0.05


def test_gptq_that_loses_on_the_check_half_keeps_nearest(tmp_path):
    """Two calibration calls of 24 rows for a 48-wide input: GPTQ fitted to one call's rank-24 Hessian
    pushes the error into directions that call never saw; the other call shows it, so the nearest
    integers stay (the QDQ weight is then exactly the quantizer's)."""
    rng = np.random.default_rng(3)
    src = _model(tmp_path / "m.onnx", rng)
    calib = _inputs(rng, np.eye(IN), 2)
    near = ox.quantize_qdq(src, tmp_path / "near.qdq.onnx", calib, Precision.W8A16, per_channel_linears=True)
    ours = ox.quantize_qdq(src, tmp_path / "gptq.qdq.onnx", calib, Precision.W8A16, per_channel_linears=True,
                           weight_rounding="gptq")
    rec = {w["node"]: w for w in json.loads(gptq.sidecar(ours).read_text())["weights"]}["fc1.conv"]
    assert rec["calibration_rows"] == 2 * T
    assert rec["kept"] == "nearest" and "other half" in rec["why"], rec
    assert rec["check_gptq_db"] <= rec["check_nearest_db"]
    wn, wo = _weights(near), _weights(ours)
    fc1 = next(k for k in wn if np.asarray(wn[k][0]).shape[:2] == (HID, IN))
    np.testing.assert_array_equal(wn[fc1][0], wo[fc1][0])


def test_hessians_in_several_passes_give_the_same_weights(tmp_path, monkeypatch):
    """A memory cap on the Hessians splits the calibration passes; the integers do not change."""
    rng = np.random.default_rng(4)
    src = _model(tmp_path / "m.onnx", rng)
    calib = _inputs(rng, rng.standard_normal((IN, IN)) * np.geomspace(3, 0.03, IN)[:, None], 8)
    one = ox.quantize_qdq(src, tmp_path / "one.qdq.onnx", calib, Precision.W8A16, weight_rounding="gptq")
    monkeypatch.setattr(gptq, "HESSIAN_BYTES", IN * IN * 16)          # one input per pass
    assert gptq._passes({"a": IN, "b": HID, "c": IN}) == [["a"], ["b"], ["c"]]
    split = ox.quantize_qdq(src, tmp_path / "split.qdq.onnx", calib, Precision.W8A16, weight_rounding="gptq")
    a, b = _weights(one), _weights(split)
    assert a.keys() == b.keys() and len(a) == 2
    for k in a:
        np.testing.assert_array_equal(a[k][0], b[k][0])
