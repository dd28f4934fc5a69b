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
