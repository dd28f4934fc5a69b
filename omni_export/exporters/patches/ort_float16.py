"""ONNX Runtime's fp16 converter without reading each converted initializer back (used by
exporters/onnx.py to_fp16 on a model whose weights stay in their data file)."""
from __future__ import annotations

import contextlib

PINNED = {"onnxruntime": "1.32.0"}
TARGETS = ("onnxruntime.transformers.float16:make_value_info_from_tensor",)


@contextlib.contextmanager
def value_info_from_dims():
    """Within the block, float16.make_value_info_from_tensor takes a tensor's name, type and dims from
    its proto: the converter reads each converted initializer back only for its shape, and with the
    weights left on disk there is nothing to read."""
    from unittest import mock

    import onnx
    from onnxruntime.transformers import float16

    with mock.patch.object(float16, "make_value_info_from_tensor", lambda t: onnx.helper.make_tensor_value_info(
            t.name, t.data_type, list(t.dims))):
        yield
