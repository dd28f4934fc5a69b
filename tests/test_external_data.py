"""ONNX past 2 GB: weights go to `<name>.onnx.data`. The same code paths are exercised here on a
small model by lowering the threshold: export, fp16 conversion (streamed tensor by tensor),
QDQ quantization and the copy under the build's name must give the outputs of the inline model."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from omni_export.core import Precision
from omni_export.exporters import onnx as ox
from omni_export.exporters import onnxfile


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 32)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.a.weight.data[0, 0] = 1e6              # clamped to fp16's max by both converters

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def program():
    return torch.export.export(MLP().eval(), (torch.zeros(2, 64),))


def both(program, tmp_path, monkeypatch):
    inline = ox.export(program, tmp_path / "inline" / "fp32.onnx", ["x"], ["y"])
    monkeypatch.setattr(onnxfile, "EXTERNAL_DATA_BYTES", 0)
    external = ox.export(program, tmp_path / "external" / "fp32.onnx", ["x"], ["y"])
    return inline, external


def test_export_fp16_and_copy_with_external_data_match_the_inline_model(program, tmp_path, monkeypatch):
    inline, external = both(program, tmp_path, monkeypatch)
    assert not ox.data_file(inline).exists() and ox.data_file(external).exists()
    assert onnx.load(str(external), load_external_data=False).ByteSize() < 10_000   # weights are not in the proto
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_array_equal(run(inline, x), run(external, x))

    h_in = ox.to_fp16(inline, tmp_path / "inline" / "fp16.onnx")
    h_ex = ox.to_fp16(external, tmp_path / "external" / "fp16.onnx")
    assert ox.data_file(h_ex).stat().st_size < ox.data_file(external).stat().st_size * 0.6
    w_in = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(h_in)).graph.initializer}
    w_ex = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(h_ex)).graph.initializer}
    assert w_in.keys() == w_ex.keys() and all(w_in[k].dtype == np.float16 for k in w_in)
    for k in w_in:                                  # the streamed conversion is the same conversion
        np.testing.assert_array_equal(w_in[k], w_ex[k])
    np.testing.assert_array_equal(run(h_in, x), run(h_ex, x))

    files = ox.copy(h_ex, tmp_path / "out" / "model-fp16.onnx")
    assert [f.name for f in files] == ["model-fp16.onnx", "model-fp16.onnx.data"]
    ox.data_file(h_ex).unlink()                      # the copy stands alone
    np.testing.assert_array_equal(run(files[0], x), run(h_in, x))


def test_qdq_quantization_reads_an_external_data_source(program, tmp_path, monkeypatch):
    inline, external = both(program, tmp_path, monkeypatch)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((2, 64)).astype(np.float32)} for _ in range(8)]
    q_in = ox.quantize_qdq(inline, tmp_path / "inline" / "w8a16.qdq.onnx", calib, Precision.W8A16)
    q_ex = ox.quantize_qdq(external, tmp_path / "external" / "w8a16.qdq.onnx", calib, Precision.W8A16)
    x = calib[0]["x"]
    np.testing.assert_allclose(run(q_in, x), run(q_ex, x), rtol=0, atol=1e-6)


def test_a_job_store_and_a_bundle_leave_external_data_readable_by_onnx(program, tmp_path, monkeypatch):
    """onnx refuses external data with more than one hard link ('potential hardlink attack'). The job
    store hard-linked a finished export's files, so every 0.6B w8a16 quantization (the QDQ quantizer
    loads the fp32 graph with onnx) failed with that error and no w8a16 build was made. Copying them
    instead filled the disk (the 0.6B output directory reached 62 GB on a resume): a graph with external data is not
    kept (a resumed run exports it again), and the bundle copies only the data file."""
    from omni_export.jobs.results import JobStore

    out = tmp_path / "out"
    monkeypatch.setattr(onnxfile, "EXTERNAL_DATA_BYTES", 0)
    fp32 = ox.export(program, out / ".staging" / "work" / "mlp" / "fp32.onnx", ["x"], ["y"])
    store = JobStore(out)
    assert not store.save("k1", "mlp/export", "export", {"onnx": {"fp32": str(fp32)}})
    assert not (out / ".jobs" / "k1").exists() and store.load("k1") is None
    calib = [{"x": np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)} for _ in range(8)]
    ox.quantize_qdq(fp32, out / "w8a16.qdq.onnx", calib, Precision.W8A16)      # onnx.load of the graph
    assert ox.data_file(fp32).stat().st_nlink == 1

    monkeypatch.setattr(onnxfile, "EXTERNAL_DATA_BYTES", 1 << 40)
    inline = ox.export(program, out / ".staging" / "work" / "inline" / "fp32.onnx", ["x"], ["y"])
    assert store.save("k2", "inline/export", "export", {"onnx": {"fp32": str(inline)}})      # others are kept

    from omni_export.artifacts.store import link_or_copy

    (tmp_path / "bundle").mkdir()                                                  # the bundle's way in OUT
    link_or_copy(fp32, tmp_path / "bundle" / fp32.name)
    link_or_copy(ox.data_file(fp32), tmp_path / "bundle" / ox.data_file(fp32).name)
    assert fp32.stat().st_nlink > 1 and ox.data_file(fp32).stat().st_nlink == 1     # only the data is copied
    onnx.checker.check_model(str(tmp_path / "bundle" / fp32.name))


class Unrolled(torch.nn.Module):
    """Three unrolled steps reading the same weights, as the fused predictor frame's 15 do: a large
    linear (128 x 128: the exporter does not fold the Transpose of a weight with several readers past
    8192 elements), a small one (folded once per reader) and a head on a 2-D input (a Gemm)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.big = torch.nn.Linear(128, 128, bias=False)
        self.small = torch.nn.Linear(128, 16)
        self.head = torch.nn.Linear(16, 24)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)

    def forward(self, x):
        outs = []
        for _ in range(3):
            x = torch.tanh(self.big(x))
            outs.append(self.head(self.small(x).reshape(1, 16)))
        return torch.cat(outs, 0)


def test_weights_read_by_several_steps_are_one_constant_that_quantizes_as_a_weight(tmp_path, monkeypatch):
    """Inline and external: each weight is one initializer however many steps read it (no Transpose
    of a weight left for the quantizer to take for an activation), the outputs are the module's, the
    w8a16 graph holds every weight at 8 bits, and the per-channel form has one Conv weight per weight
    (the Gemm head's bias its Conv's)."""
    program = torch.export.export(Unrolled().eval(), (torch.zeros(1, 1, 128),))
    x = np.random.default_rng(0).standard_normal((1, 1, 128)).astype(np.float32)
    want = Unrolled().eval()(torch.from_numpy(x)).detach().numpy()
    inline = ox.export(program, tmp_path / "inline" / "fp32.onnx", ["x"], ["y"])
    monkeypatch.setattr(ox, "_STREAM_BYTES", 0)
    external = ox.export(program, tmp_path / "external" / "fp32.onnx", ["x"], ["y"])
    assert ox.data_file(external).exists() and not ox.data_file(inline).exists()
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 1, 128)).astype(np.float32)} for _ in range(8)]
    for path in (inline, external):
        m = onnx.load(str(path))
        inits = {i.name for i in m.graph.initializer}
        assert sum(1 for i in m.graph.initializer if len(i.dims) == 2) == 3, path
        assert not [n for n in m.graph.node if n.op_type == "Transpose" and n.input[0] in inits]
        np.testing.assert_allclose(run(path, x), want, rtol=1e-5, atol=1e-5)
        q = ox.quantize_qdq(path, path.parent / "w8a16.qdq.onnx", calib, Precision.W8A16)
        assert ox.weight_bits(q) == {"8": 1.0}
        q4 = onnx.load(str(ox.quantize_qdq(path, path.parent / "w4a16.qdq.onnx", calib, Precision.W4A16)))
        blocks = [a.i for n in q4.graph.node if n.op_type == "DequantizeLinear"
                  for a in n.attribute if a.name == "block_size"]
        assert blocks == [ox.INT4_BLOCK] * 2        # both MatMul weights in blocks, read by 3 steps each
        conv = ox.linears_as_conv(path, path.parent / "conv.onnx")
        cm = onnx.load(str(conv))
        assert [n.op_type for n in cm.graph.node].count("Conv") == 9
        assert sum(1 for i in cm.graph.initializer if len(i.dims) == 4) == 3
        np.testing.assert_allclose(run(conv, x), want, rtol=1e-5, atol=1e-5)
