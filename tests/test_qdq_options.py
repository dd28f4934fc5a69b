"""QDQ options a component can set: linears lowered as 1x1 Conv (per-channel weights on the QNN EP)
and its own 16-bit activation headroom; the int16 second operand of activation x activation MatMuls.
Small synthetic graphs on ORT CPU, one on the HTP simulator."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from omni_export.core import Precision
from omni_export.exporters import onnx as ox
from omni_export.exporters.patches import ort_quantizer as oq


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


def test_linears_as_conv_streams_external_weights_to_its_own_data_file(mlp, tmp_path):
    """A source with external weights (every graph past 256 MB): dst gets the same graph, its weights
    in DST.data of its own (so it outlives nothing of src's), and quantizing per channel leaves no
    intermediate form behind."""
    src, calib, held = mlp
    ext = tmp_path / "ext" / "mlp.onnx"
    ext.parent.mkdir()
    onnx.save(onnx.load(str(src)), str(ext), save_as_external_data=True, location=ext.name + ".data",
              size_threshold=0)
    inline = ox.linears_as_conv(src, tmp_path / "inline.onnx")
    streamed = ox.linears_as_conv(ext, tmp_path / "out" / "conv.onnx")
    assert ox.data_file(streamed).exists()
    graph = onnx.load(str(streamed), load_external_data=False)
    assert {e.value for i in graph.graph.initializer for e in i.external_data if e.key == "location"} \
        == {"conv.onnx.data"}
    a, b = onnx.load(str(inline)), onnx.load(str(streamed))
    assert [(n.op_type, list(n.input), list(n.output)) for n in a.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in b.graph.node]
    arrays = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    assert sorted(arrays) == sorted(i.name for i in b.graph.initializer)
    for i in b.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(i), arrays[i.name])
    for x, y in zip(_run(src, held), _run(streamed, held)):
        np.testing.assert_allclose(x[0], y[0], rtol=1e-5, atol=1e-5)
    q = ox.quantize_qdq(ext, tmp_path / "q" / "q.onnx", calib, Precision.W8A16, per_channel_linears=True)
    assert sorted(p.name for p in q.parent.iterdir()) == ["q.onnx"]
    assert sorted(_weight_scales(q).values()) == [8, 12]


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


@pytest.mark.parametrize("precision", [Precision.W8A16, Precision.W4A16])
def test_calibrating_once_gives_the_same_qdq_model(mlp, tmp_path, precision, monkeypatch):
    """Our MinMax pass sets every activation's range and is handed to the quantizer as its calibration
    cache, so it never calibrates (a second fp32 model and session in memory): the QDQ model is the
    one it makes calibrating on all the calls itself (every initializer, every node)."""
    import importlib

    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")   # the module, not the function
    src, calib, _ = mlp
    models = {}
    plain = ort_quantize.create_calibrator
    for once in (True, False):
        def refuse(*a, **k):
            raise AssertionError("the quantizer calibrated again")
        monkeypatch.setattr(ort_quantize, "create_calibrator", refuse if once else plain)
        q = ox.quantize_qdq(src, tmp_path / str(once) / "q.onnx", calib, precision, calibrate_once=once)
        assert not list(q.parent.glob("*.ranges.json"))          # the cache is ours, not left behind
        m = onnx.load(str(q))
        models[once] = ({i.name: numpy_helper.to_array(i).tobytes() for i in m.graph.initializer},
                        [(n.op_type, list(n.input), list(n.output)) for n in m.graph.node])
    assert models[True] == models[False]
    # and the single call alone would not give these ranges: calibrating on it changes the scales
    alone = ox.quantize_qdq(src, tmp_path / "alone" / "q.onnx", calib[:1], precision)
    assert {i.name: numpy_helper.to_array(i).tobytes() for i in onnx.load(str(alone)).graph.initializer} != models[True][0]


def test_one_graph_on_one_calibration_set_is_run_for_its_ranges_once_per_process(mlp, tmp_path, monkeypatch):
    """Precision repair quantizes one fp32 graph on one calibration set per sensitivity block and step:
    the ranges pass runs once (the same QDQ model again, keep_float and all); a graph whose bytes differ,
    or another calibration set, runs it again."""
    src, calib, _ = mlp
    runs = []
    collect = ox._collect_ranges
    monkeypatch.setattr(ox, "_collect_ranges", lambda *a: runs.append(a[0]) or collect(*a))
    monkeypatch.setattr(ox, "_RANGES", [])
    first = ox.quantize_qdq(src, tmp_path / "a" / "q.onnx", calib, Precision.W8A16)
    again = ox.quantize_qdq(src, tmp_path / "b" / "q.onnx", calib, Precision.W8A16)
    assert len(runs) == 1 and first.read_bytes() == again.read_bytes()
    ox.quantize_qdq(src, tmp_path / "c" / "q.onnx", calib, Precision.W8A16, keep_float=("node_x",))
    assert len(runs) == 1
    ox.quantize_qdq(src, tmp_path / "d" / "q.onnx", list(calib), Precision.W8A16)       # another set (a copy)
    other = _mlp(tmp_path / "other.onnx", np.random.default_rng(1))
    ox.quantize_qdq(other, tmp_path / "e" / "q.onnx", calib, Precision.W8A16)
    assert len(runs) == 3


def _attention_scores(path):
    """q [1, 2, 16, 32], k [1, 2, 112, 32] -> q @ k^T: attention's activation x activation MatMul."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk")]
    g = helper.make_graph(nodes, "qk", [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 2, 16, 32]),
                                        helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, 112, 32])],
                          [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2, 16, 112])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


def test_activation_matmuls_take_their_second_operand_as_int16_and_stay_accurate_on_the_htp(tmp_path):
    """The QNN EP turns a uint16 x uint16 MatMul's second input into uint8 (the HTP then multiplies 16 x 8
    bits: ~38 dB on this product); as int16 symmetric it runs 16 x 16 (~73 dB)."""
    from omni_export import qnn_ep
    from omni_export.parity.metrics import snr
    from omni_export.runtime.runners import RunnerSpec, open_runner

    rng = np.random.default_rng(0)
    src = _attention_scores(tmp_path / "qk.onnx")
    feed = lambda: {"q": rng.standard_normal((1, 2, 16, 32)).astype(np.float32),           # noqa: E731
                    "k": rng.standard_normal((1, 2, 112, 32)).astype(np.float32)}
    calib, held = [feed() for _ in range(8)], [feed() for _ in range(3)]
    assert ox.activation_matmul_operands(src) == {"kt": ["qk"]}
    q = ox.quantize_qdq(src, tmp_path / "q" / "qk.onnx", calib, Precision.W8A16)
    m = onnx.load(str(q))
    inits = {i.name: i for i in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    dq = producer[next(n for n in m.graph.node if n.name == "qk").input[1]]
    assert dq.op_type == "DequantizeLinear" and inits[dq.input[2]].data_type == TensorProto.INT16
    assert not numpy_helper.to_array(inits[dq.input[2]]).any()                          # symmetric
    dq0 = producer[next(n for n in m.graph.node if n.name == "qk").input[0]]
    assert inits[dq0.input[2]].data_type == TensorProto.UINT16                          # the other stays uint16
    ref = np.concatenate([r[0].ravel() for r in _run(src, held)])
    runner = open_runner(RunnerSpec("qnn-htp", str(q), ("q", "k"), ("s",), qnn_ep.provider_options("69", "79", fp16=False)))
    try:
        out = np.concatenate([runner.run(h)["s"].ravel() for h in held])
    finally:
        runner.close()
    assert snr(ref, out) > 60


def test_an_unnamed_activation_matmul_converts_its_only_operand_for_every_consumer(mlp, tmp_path):
    src, calib, held = mlp
    assert ox.activation_matmul_operands(src) == {"xt": []}                  # x @ x^T, no node name
    q = ox.quantize_qdq(src, tmp_path / "q" / "q.onnx", calib, Precision.W8A16)
    m = onnx.load(str(q))
    assert any(i.data_type == TensorProto.INT16 for i in m.graph.initializer)
    assert not any(i.data_type == TensorProto.INT16 for i in
                   onnx.load(str(ox.quantize_qdq(src, tmp_path / "q8" / "q.onnx", calib, Precision.W8A8))).graph.initializer)


def test_headroom_keeps_a_relu_output_range_at_zero(tmp_path):
    """ONNX Runtime's quantizer removes a ReLU and lets the next quantizer clamp at the range's 0; the 16-bit
    headroom once padded that range below 0, so negatives went through (MiniCPM-o tts_condition: 4 dB)."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32) * 0.2, "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])], initializer=[w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    src = tmp_path / "relu.onnx"
    onnx.save(m, str(src))
    calib = [{"x": rng.standard_normal((1, 6, 16)).astype(np.float32)} for _ in range(16)]
    held = [{"x": rng.standard_normal((1, 6, 16)).astype(np.float32)} for _ in range(4)]
    q = ox.quantize_qdq(src, tmp_path / "q" / "q.onnx", calib, Precision.W8A16)        # default headroom 0.5
    ref = np.concatenate([r[0].ravel() for r in _run(src, held)])
    out = np.concatenate([r[0].ravel() for r in _run(q, held)])
    e = float(((ref - out) ** 2).sum())
    assert 10 * np.log10(float((ref ** 2).sum()) / e) > 30


def _attention_stack(path, rng, layers=4):
    """x [1, 6, 16] through `layers` attention blocks that share their projection weights, with an
    intermediate graph output that other nodes also read, a tensor read twice by one node (Mul(x, x))
    and activation x activation MatMuls (converted to int16 for those MatMuls only)."""
    w = {n: numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) * 0.3, n)
         for n in ("wq", "wk", "wv", "wo")}
    nodes, h, outputs = [], "x", []
    for i in range(layers):
        p = f"l{i}_"
        nodes += [helper.make_node("Mul", [h, h], [p + "sq"]),
                  helper.make_node("Add", [h, p + "sq"], [p + "n"]),
                  *[helper.make_node("MatMul", [p + "n", k], [p + k]) for k in ("wq", "wk", "wv")],
                  helper.make_node("Transpose", [p + "wk"], [p + "kt"], perm=[0, 2, 1]),
                  helper.make_node("MatMul", [p + "wq", p + "kt"], [p + "s"], name=p + "qk"),
                  helper.make_node("Softmax", [p + "s"], [p + "a"], axis=-1),
                  helper.make_node("MatMul", [p + "a", p + "wv"], [p + "o"], name=p + "av"),
                  helper.make_node("MatMul", [p + "o", "wo"], [p + "y"]),
                  helper.make_node("Add", [h, p + "y"], [p + "h"])]
        h = p + "h"
    outputs.append(helper.make_tensor_value_info("l1_h", TensorProto.FLOAT, [1, 6, 16]))   # read by layer 2 too
    outputs.append(helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 6, 16]))
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 16])],
                          outputs, initializer=list(w.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


@pytest.mark.parametrize("precision", [Precision.W8A16, Precision.W8A8])
def test_the_indexed_quantizer_makes_the_same_qdq_model(tmp_path, monkeypatch, precision):
    """quantize_qdq runs ONNX Runtime's quantizer with a consumer index in place of its node scans, a
    name index for its initializer lookups and a one-pass calibration graph (all quadratic: over 20
    minutes on the 0.6B fused frame); the QDQ model is the one the plain quantizer makes, node for node
    (w8a8: from ORT's own calibration ranges), and the quantizer's methods are restored afterwards."""
    import contextlib

    from onnxruntime.quantization import qdq_quantizer, quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    rng = np.random.default_rng(0)
    src = _attention_stack(tmp_path / "stack.onnx", rng)
    find = quant_utils.find_by_name
    calib = [{"x": rng.standard_normal((1, 6, 16)).astype(np.float32)} for _ in range(8)]
    original = dict(ONNXModel.__dict__)
    calls = []
    real = ox.linear_quantizer

    @contextlib.contextmanager
    def counted():
        with real():
            assert isinstance(qdq_quantizer.find_by_name, oq._NameIndex)
            from onnxruntime.quantization.calibrate import MinMaxCalibrater
            assert MinMaxCalibrater.augment_graph is oq._augment_graph_linear
            plain = ONNXModel.replace_input_of_all_nodes
            ONNXModel.replace_input_of_all_nodes = lambda self, a, b: (calls.append(a), plain(self, a, b))
            yield

    monkeypatch.setattr(ox, "linear_quantizer", counted)
    augments = []
    one_pass = oq._augment_graph_linear
    monkeypatch.setattr(oq, "_augment_graph_linear", lambda self: (augments.append(1), one_pass(self))[1])
    models, built = {}, {}
    for indexed in (True, False):
        if not indexed:
            monkeypatch.setattr(ox, "linear_quantizer", contextlib.nullcontext)
            monkeypatch.setattr(ox, "linear_calibrator", contextlib.nullcontext)
        q = ox.quantize_qdq(src, tmp_path / str(indexed) / "q.onnx", calib, precision)
        built[indexed] = len(augments)
        m = onnx.load(str(q))
        models[indexed] = ({i.name: numpy_helper.to_array(i).tobytes() for i in m.graph.initializer},
                           [(n.op_type, n.name, list(n.input), list(n.output)) for n in m.graph.node])
    assert len(calls) > 20                      # the index served the quantizer's rewiring
    # the one calibration graph (w8a16: our range pass, whose ranges the quantizer reads as its cache;
    # w8a8: the quantizer's own calibration) was built in one pass...
    assert built[True] == 1
    assert built[False] == built[True]          # ...and ORT's own augment_graph made the plain arm's
    assert models[True] == models[False]
    assert {k: ONNXModel.__dict__[k] for k in original} == original
    assert quant_utils.find_by_name is find and qdq_quantizer.find_by_name is find


def test_the_name_index_finds_what_a_scan_finds_as_the_container_changes():
    from onnx import TensorProto as TP

    from onnxruntime.quantization.quant_utils import find_by_name

    g = onnx.GraphProto()
    for n in ("a", "b", "a", "c"):
        g.initializer.add(name=n, data_type=TP.FLOAT)
    idx = oq._NameIndex(find_by_name)
    steps = [lambda: None, lambda: g.initializer.add(name="d"), lambda: g.initializer.remove(g.initializer[0]),
             lambda: g.initializer.add(name="e"), lambda: g.initializer.remove(g.initializer[-1]),
             lambda: g.initializer.add(name="f"), lambda: g.ClearField("initializer"),
             lambda: g.initializer.add(name="b")]
    for step in steps:
        step()
        for name in "abcdefz":
            assert idx(name, g.initializer) is find_by_name(name, g.initializer), (name, [i.name for i in g.initializer])
    assert idx("b", [g.initializer[0]]) is g.initializer[0]        # plain lists: a scan


def test_external_weights_quantize_the_same_in_a_child_mapping_its_calibration(tmp_path):
    """Past 256 MB the quantizer runs in a spawned child that maps the calibration inputs from .npy
    files (not a pickled copy), and its range pass loads the graph without its weights (the session
    reads them from the data file): the QDQ model is the one an in-process call on the inputs in
    memory makes, and nothing is left beside the source."""
    from omni_export.exporters.lower import isolated

    rng = np.random.default_rng(1)
    (tmp_path / "src").mkdir()
    src = _mlp(tmp_path / "src" / "mlp.onnx", rng)
    onnx.save(onnx.load(str(src)), str(src), save_as_external_data=True, location=ox.data_file(src).name,
              size_threshold=0)
    calib = [{"x": rng.standard_normal((1, 5, 8)).astype(np.float32)} for _ in range(16)]
    mapped = ox.MappedSamples.write(calib, tmp_path / "calib")
    assert len(mapped) == 16 and isinstance(mapped[3]["x"], np.memmap) and np.array_equal(mapped[-1]["x"], calib[15]["x"])
    with ox.linear_calibrator():
        from onnxruntime.quantization import calibrate

        graph_only = calibrate.load_model_with_shape_infer(src)
        assert calibrate.CalibraterBase.create_inference_session is oq._calibration_session   # no pre-packing
    assert {i.name for i in graph_only.graph.initializer if not i.HasField("raw_data")} == {"w1", "w2"}
    models = []
    for where, data in (("memory", calib), ("child", mapped)):
        q = isolated(where == "child", ox.quantize_qdq, src, tmp_path / where / "q.onnx", data, Precision.W8A16)
        m = onnx.load(str(q))
        models.append(({i.name: numpy_helper.to_array(i).tobytes() for i in m.graph.initializer},
                       [(n.op_type, list(n.input), list(n.output)) for n in m.graph.node]))
    assert models[0] == models[1] and len(models[0][0]) > 4
    assert sorted(p.name for p in src.parent.iterdir()) == ["mlp.onnx", "mlp.onnx.data"]


def _outlier_block(path, rng, k=1024):
    """x [1, 16, k] -> MatMul(W1 [k, 64]) -> LayerNorm -> y. Input row 3 of W1 is 40x the others (an outlier
    input channel, as trained LLM weights have): an int4 scale per W1 column (per channel) or for all of W1
    (per tensor) is set by it and the other rows round to zero; a scale per block of input rows loses
    only the rows in the outlier's block."""
    w1 = rng.standard_normal((k, 64)).astype(np.float32) * 0.05
    w1[3] *= 40
    inits = [numpy_helper.from_array(w1, "w1"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(64)).astype(np.float32), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(64)).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1, name="norm")]
    g = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


def test_w4a16_block_int4_beats_per_tensor_on_outlier_channels_and_compiles_for_the_htp(tmp_path):
    """w4a16: int4 only for the MatMul weights (the LayerNorm's gamma stays int8: QNN's HTP LayerNorm
    refuses a 4-bit gamma, which failed Code2Wav's w4a16 context binary), one scale per block of
    INT4_BLOCK input rows; scored against per-tensor and per-channel int4 on ORT CPU, compiled and run on
    the HTP simulator."""
    from omni_export import qnn_ep
    from omni_export.parity.metrics import snr

    rng = np.random.default_rng(0)
    src = _outlier_block(tmp_path / "m.onnx", rng)
    calib = [{"x": rng.standard_normal((1, 16, 1024)).astype(np.float32)} for _ in range(8)]
    held = [{"x": rng.standard_normal((1, 16, 1024)).astype(np.float32)} for _ in range(2)]
    ref = np.concatenate([r[0] for r in _run(src, held)])
    q = {k: ox.quantize_qdq(src, tmp_path / k / "q.onnx", calib, Precision.W4A16, int4_weights=k)
         for k in ox.INT4_WEIGHTS}
    db = {k: snr(ref, np.concatenate([r[0] for r in _run(p, held)])) for k, p in q.items()}
    assert db["block"] > db["tensor"] + 9 and db["block"] > db["channel"] + 9, db

    m = onnx.load(str(q["block"]))
    inits = {i.name: i for i in m.graph.initializer}
    dq = {n.input[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    w1 = next(n for n in dq.values() if inits[n.input[0]].dims == [1024, 64])
    assert inits[w1.input[0]].data_type == TensorProto.INT4
    assert {a.name: a.i for a in w1.attribute} == {"axis": 0, "block_size": ox.INT4_BLOCK}
    assert list(inits[w1.input[1]].dims) == [1024 // ox.INT4_BLOCK, 64]
    gamma = next(n for k, n in dq.items() if list(inits[k].dims) == [64] and inits[k].data_type != TensorProto.INT32)
    assert inits[gamma.input[0]].data_type in (TensorProto.UINT8, TensorProto.INT8)
    assert ox.weight_bits(q["block"]) == {"4": 1.0}

    session = qnn_ep.session(q["block"], qnn_ep.provider_options("69", "79", fp16=False, finalize="1"))
    htp = np.concatenate([session.run(None, h)[0] for h in held])
    assert snr(ref, htp) > db["tensor"] + 9, (snr(ref, htp), db)


def _lookups(path, rng):
    """codes [1, 4, 6] int64 -> three table lookups summed with a MatMul's output: `rvq` [4 * 256, 32]
    (rows of spread norms, an RVQ's codebooks), `narrow` [512, 32] with a column 400x smaller than the
    others, `rope` [8, 32] (too small to matter); the lookups Gather on axis 0."""
    rvq = rng.standard_normal((4 * 256, 32)) * rng.uniform(0.2, 3.0, (4 * 256, 1))
    narrow = rng.standard_normal((512, 32))
    narrow[:, 5] *= 1 / 400
    rope = np.cos(np.arange(8)[:, None] * np.linspace(0.01, 1, 32)[None])
    w = rng.standard_normal((32, 32)) * 0.2
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in
             ((rvq, "rvq"), (narrow, "narrow"), (rope, "rope"), (w, "w"))]
    inits.append(numpy_helper.from_array(np.array([0, 256, 512, 768], np.int64).reshape(1, 4, 1), "offsets"))
    nodes = [helper.make_node("Add", ["codes", "offsets"], ["idx"]),
             helper.make_node("Gather", ["rvq", "idx"], ["e"], name="rvq_lookup", axis=0),
             helper.make_node("ReduceSum", ["e", "one"], ["es"], keepdims=0),
             helper.make_node("Gather", ["narrow", "codes"], ["n"], name="narrow_lookup", axis=0),
             helper.make_node("ReduceSum", ["n", "one"], ["ns"], keepdims=0),
             helper.make_node("Gather", ["rope", "pos"], ["r"], name="rope_lookup", axis=0),
             helper.make_node("MatMul", ["es", "w"], ["h"]),
             helper.make_node("Add", ["h", "ns"], ["hn"]), helper.make_node("Mul", ["hn", "r"], ["y"])]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    g = helper.make_graph(nodes, "lookups", [helper.make_tensor_value_info("codes", TensorProto.INT64, [1, 4, 6]),
                                             helper.make_tensor_value_info("pos", TensorProto.INT64, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 32])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, str(path))
    return path


def test_large_tables_go_8_bit_with_a_scale_per_row_where_every_column_keeps_its_precision(tmp_path, monkeypatch):
    """w8a16 quantizes a table lookup's constant at the activations' 16 bits, one scale for the table
    (all the HTP's Gather takes). tables_per_row stores a table past TABLE_MIN_SHARE of the weight bytes
    as 8-bit codes with a 16-bit scale per row, gathered beside the codes and multiplied in: half the
    bytes, ~45 dB per lookup where one 8-bit scale gave ~30. A table whose column would lose its
    precision (400x smaller than the rest) keeps 16 bits; a small table (RoPE) is left as it was. The
    graph scores as before on ORT CPU and on the HTP simulator."""
    from omni_export import qnn_ep
    from omni_export.parity.metrics import snr

    rng = np.random.default_rng(0)
    src = _lookups(tmp_path / "m.onnx", rng)
    feed = lambda: {"codes": rng.integers(0, 256, (1, 4, 6)), "pos": rng.integers(0, 8, 6)}   # noqa: E731
    calib, held = [feed() for _ in range(8)], [feed() for _ in range(4)]
    q = ox.quantize_qdq(src, tmp_path / "q" / "m.onnx", calib, Precision.W8A16)
    m = onnx.load(str(q))
    inits = {i.name: i for i in m.graph.initializer}
    gathers = {n.name: n for n in m.graph.node if n.op_type == "Gather"}
    producer = {o: n for n in m.graph.node for o in n.output}
    table = lambda g: inits[producer[gathers[g].input[0]].input[0]]                        # noqa: E731
    assert table("rvq_lookup_rows8").data_type == TensorProto.UINT8
    assert list(table("rvq_lookup_rows8").dims) == [1024, 32]
    assert list(table("rvq_lookup_rowscale").dims) == [1024, 1]
    assert table("rvq_lookup_rowscale").data_type == TensorProto.UINT16
    assert table("narrow_lookup").data_type == TensorProto.UINT16 and table("rope_lookup").data_type == TensorProto.UINT16
    assert "rvq_lookup" not in gathers and "rvq" not in inits
    eight, sixteen = 1024 * 32 + 32 * 32, 2 * (1024 + 512 * 32 + 8 * 32)     # rvq's codes and w; scales, narrow, rope
    assert ox.weight_bits(q) == {"8": round(eight / (eight + sixteen), 4), "16": round(sixteen / (eight + sixteen), 4)}

    # a lookup precision repair raises (a kept block's Gather) keeps its 16-bit table
    raised = onnx.load(str(ox.quantize_qdq(src, tmp_path / "raised" / "m.onnx", calib, Precision.W8A16,
                                           wide_weights=["rvq_lookup"])))
    assert "rvq_lookup" in {n.name for n in raised.graph.node if n.op_type == "Gather"}
    assert next(i for i in raised.graph.initializer if i.name.startswith("rvq")).data_type == TensorProto.UINT16

    # the same quantization with the rewrite off: its single 16-bit scale per table as before
    with monkeypatch.context() as mp:
        mp.setattr(ox, "tables_per_row", lambda *a, **k: [])
        plain = ox.quantize_qdq(src, tmp_path / "plain" / "m.onnx", calib, Precision.W8A16)
    assert ox.weight_bits(plain)["16"] > 0.9
    ref = np.concatenate([r[0].ravel() for r in _run(src, held)])
    db = {k: snr(ref, np.concatenate([r[0].ravel() for r in _run(p, held)])) for k, p in (("plain", plain), ("rows", q))}
    assert db["rows"] > 35 and db["rows"] > db["plain"] - 3, db

    # per lookup (the worst row's SNR), against one 8-bit scale for the whole table
    w = numpy_helper.to_array(onnx.load(str(src)).graph.initializer[0]).astype(np.float64)
    codes, sq, step = ox.row_scaled_table(w)
    rows = (codes.astype(np.float64) - 128) * sq * step
    s = (w.max() - w.min()) / 255
    one = np.round((w - w.min()) / s) * s + w.min()
    worst = lambda r: min(snr(a, b) for a, b in zip(w, r))                                # noqa: E731
    assert worst(rows) > 35 and worst(rows) > worst(one) + 10, (worst(rows), worst(one))

    session = qnn_ep.session(q, qnn_ep.provider_options("69", "79", fp16=False, finalize="1"))
    htp = np.concatenate([session.run(None, h)[0].ravel() for h in held])
    assert snr(ref, htp) > 40, snr(ref, htp)


def test_a_float_island_keeps_its_weights_as_fp16_and_scores_as_in_fp32(tmp_path, monkeypatch):
    """Precision repair's kept nodes read their weights unquantized; those weights are stored fp16 behind
    a Cast (the HTP runs the island in fp16 anyway): half the bytes of fp32, the graph's outputs as
    with fp32 weights to within fp16's rounding, and the HTP simulator compiles and runs it."""
    from omni_export import qnn_ep
    from omni_export.parity.metrics import snr

    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((32, 32)).astype(np.float32) * 0.3 for _ in range(2))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="a"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="b")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32])],
                          initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    src = tmp_path / "two.onnx"
    onnx.save(m, str(src))
    feed = lambda: {"x": rng.standard_normal((1, 8, 32)).astype(np.float32)}     # noqa: E731
    calib, held = [feed() for _ in range(8)], [feed() for _ in range(3)]
    q = ox.quantize_qdq(src, tmp_path / "q" / "two.onnx", calib, Precision.W8A16, keep_float=["b"])
    model = onnx.load(str(q))
    inits = {i.name: i for i in model.graph.initializer}
    assert inits["w2_fp16"].data_type == TensorProto.FLOAT16 and "w2" not in inits
    cast = next(n for n in model.graph.node if n.op_type == "Cast")
    assert list(cast.input) == ["w2_fp16"] and list(cast.output) == ["w2"]
    assert ox.weight_bits(q) == {"8": round(1 / 3, 4), "fp16": round(2 / 3, 4)}       # 1 KB at 8 bits, 2 KB fp16

    with monkeypatch.context() as mp:           # the same island with its weights left fp32
        mp.setattr(ox, "float_weights_as_fp16", lambda *a, **k: [])
        q32 = ox.quantize_qdq(src, tmp_path / "q32" / "two.onnx", calib, Precision.W8A16, keep_float=["b"])
    assert ox.weight_bits(q32) == {"8": 0.2, "32": 0.8}
    a = np.concatenate([r[0].ravel() for r in _run(q, held)])
    b = np.concatenate([r[0].ravel() for r in _run(q32, held)])
    assert snr(b, a) > 60

    ref = np.concatenate([r[0].ravel() for r in _run(src, held)])
    session = qnn_ep.session(q, qnn_ep.provider_options("69", "79", fp16=True, finalize="1"))
    htp = np.concatenate([session.run(None, h)[0].ravel() for h in held])
    assert snr(ref, htp) > 35, snr(ref, htp)
