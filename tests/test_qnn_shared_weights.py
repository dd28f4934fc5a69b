"""A weight several MatMuls read is compiled once by the QNN EP (onnx.share_matmul_weights).

Unrolled graphs (the fused predictor frame: 15 steps through the same decoder) read each weight
many times; the EP's FullyConnected path copies a 2-D constant weight per MatMul."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from omni_export import qnn_ep
from omni_export.exporters import onnx as ox
from omni_export.parity.metrics import snr

K = 512


def _model(path, external: bool, activation_rank: int = 3):
    """y = ((x @ W^T) @ W^T) @ W^T, then @ V twice: W as Transpose(initializer), V read directly."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32)
    v = (rng.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32)
    shape = [1, 1, K] if activation_rank == 3 else [1, K]
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0])]
    prev = "x"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [prev, "wt"], [f"h{i}"]))
        prev = f"h{i}"
    nodes.append(helper.make_node("MatMul", [prev, "v"], ["a"]))
    nodes.append(helper.make_node("MatMul", ["a", "v"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=ox.data_file(path).name, size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


def _cpu(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_shared_weights_are_one_copy_in_the_dlc_and_the_function_is_unchanged(tmp_path):
    src = _model(tmp_path / "m.onnx", external=False)
    dst = tmp_path / "m.shared.onnx"
    assert ox.share_matmul_weights(src, dst) == 2
    x = np.random.default_rng(1).standard_normal((1, 1, K)).astype(np.float32)
    ref = _cpu(src, x)
    assert snr(ref, _cpu(dst, x)) > 100          # a batched MatMul kernel: not bit-exact

    opts = qnn_ep.provider_options("69", "79", fp16=True, finalize="1")
    sizes = {name: qnn_ep.compile_dlc(path, tmp_path / name, opts).stat().st_size
             for name, path in (("plain", src), ("shared", dst))}
    weight_bytes = 2 * K * K * 4
    # plain: 3 copies of W + 2 of V (5 x 1 MiB); shared: one of each
    assert sizes["plain"] > 2.2 * weight_bytes, sizes
    assert sizes["shared"] < 1.4 * weight_bytes, sizes
    out = qnn_ep.session(dst, opts).run(None, {"x": x})[0]
    assert snr(ref, out) > 40


def test_external_data_models_and_their_source_stay_loadable(tmp_path):
    """The source keeps its own data file: onnx refuses external data with several hard links, and
    the QDQ quantizer loads the fp32 ONNX after this ran (a hard link failed the 0.6B frame's w8a16)."""
    src = _model(tmp_path / "m.onnx", external=True)
    dst = tmp_path / "m.shared.onnx"
    assert ox.share_matmul_weights(src, dst) == 2
    assert os.stat(ox.data_file(src)).st_nlink == 1 and ox.data_file(dst).exists()
    for path in (src, dst):
        onnx.load(str(path), load_external_data=True)
    x = np.random.default_rng(2).standard_normal((1, 1, K)).astype(np.float32)
    assert snr(_cpu(src, x), _cpu(dst, x)) > 100


@pytest.mark.parametrize("rank", [2])
def test_a_2d_activation_is_left_alone(tmp_path, rank):
    """[S, K] @ [1, K, N] would be [1, S, N]: the output's rank would change, so nothing is shared."""
    src = _model(tmp_path / "m.onnx", external=False, activation_rank=rank)
    dst = tmp_path / "m.shared.onnx"
    assert ox.share_matmul_weights(src, dst) == 0
    assert not dst.exists()
