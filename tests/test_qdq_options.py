"""QDQ options a component can set: linears lowered as 1x1 Conv (per-channel weights on the QNN EP)
and its own 16-bit activation headroom. Small synthetic graphs on ORT CPU; no simulator."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from omni_export.core import Precision
from omni_export.exporters import onnx as ox


def _mlp(path, rng):
    """x [1, 5, 8] -> MatMul(W1 [8, 12]) -> Gelu -> MatMul(W2 [12, 8]) + x; one act x act MatMul too."""
    w1 = numpy_helper.from_array((rng.standard_normal((8, 12)) * np.linspace(0.05, 2, 12)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((12, 8)).astype(np.float32) * 0.3, "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Gelu", ["h"], ["g"]),
             helper.make_node("MatMul", ["g", "w2"], ["o"]), helper.make_node("Add", ["o", "x"], ["y"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["s"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 8]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 5, 5])], initializer=[w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


def _run(path, feeds):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [s.run(None, f) for f in feeds]


def _weight_scales(path) -> dict[str, int]:
    """{weight initializer: number of scales} of the DequantizeLinear nodes fed by an initializer."""
    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    return {n.input[0]: int(np.prod(inits[n.input[1]].dims) or 1) for n in m.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits and len(inits[n.input[0]].dims) >= 2}


@pytest.fixture
def mlp(tmp_path):
    rng = np.random.default_rng(0)
    src = _mlp(tmp_path / "mlp.onnx", rng)
    calib = [{"x": rng.standard_normal((1, 5, 8)).astype(np.float32)} for _ in range(16)]
    held = [{"x": rng.standard_normal((1, 5, 8)).astype(np.float32)} for _ in range(4)]
    return src, calib, held


def test_linears_as_conv_compute_the_same_and_only_touch_constant_weights(mlp, tmp_path):
    src, _, held = mlp
    conv = ox.linears_as_conv(src, tmp_path / "conv.onnx")
    ops = [n.op_type for n in onnx.load(str(conv)).graph.node]
    assert ops.count("Conv") == 2 and ops.count("MatMul") == 1          # x @ x^T stays a MatMul
    for a, b in zip(_run(src, held), _run(conv, held)):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_per_channel_linears_quantize_weights_per_output_channel_and_score_higher(mlp, tmp_path):
    src, calib, held = mlp
    plain = ox.quantize_qdq(src, tmp_path / "plain" / "q.onnx", calib, Precision.W8A16)
    pc = ox.quantize_qdq(src, tmp_path / "pc" / "q.onnx", calib, Precision.W8A16, per_channel_linears=True)
    assert sorted(_weight_scales(plain).values()) == [1, 1]              # QNN EP: MatMul weights per tensor
    assert sorted(_weight_scales(pc).values()) == [8, 12]                # Conv: one scale per output channel
    ref = [r[0] for r in _run(src, held)]

    def snr(path):
        out = [r[0] for r in _run(path, held)]
        e = sum(float(((a - b) ** 2).sum()) for a, b in zip(ref, out))
        return 10 * np.log10(sum(float((a ** 2).sum()) for a in ref) / e)

    assert snr(pc) > snr(plain) + 3        # W1's columns span 40x in scale: per tensor wastes its codes


def test_a_component_headroom_changes_the_activation_ranges(mlp, tmp_path):
    src, calib, _ = mlp

    def scale_of(path, tensor):
        m = onnx.load(str(path))
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
        return float(inits[q.input[1]])

    wide = ox.quantize_qdq(src, tmp_path / "wide" / "q.onnx", calib, Precision.W8A16)            # default 0.5
    tight = ox.quantize_qdq(src, tmp_path / "tight" / "q.onnx", calib, Precision.W8A16, headroom=0.0)
    assert scale_of(wide, "h") == pytest.approx(2 * scale_of(tight, "h"), rel=1e-3)
