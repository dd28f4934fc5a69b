"""ONNX files as the exporters write them: a model saved with its weights inline, or in a data file
beside it past EXTERNAL_DATA_BYTES, and INT4 initializers packed two per byte. The ONNX exporter
(onnx.py) and GPTQ (gptq.py) both write through here, so neither imports the other for it."""
from __future__ import annotations

from pathlib import Path

import numpy as np

EXTERNAL_DATA_BYTES = 1_800_000_000   # stay clear of protobuf's 2 GB limit


def save(model, dst: Path) -> None:
    """`model` to `dst`, its weights in DST.data beside it past EXTERNAL_DATA_BYTES."""
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    big = model.ByteSize() > EXTERNAL_DATA_BYTES
    onnx.save(model, str(dst), save_as_external_data=big,
              location=dst.name + ".data" if big else None)


def int4_tensor(name: str, q: np.ndarray):
    """An INT4 TensorProto of the int8 array `q` (values in [-8, 7]), two per byte, low nibble first."""
    from onnx import TensorProto, helper

    flat = (q.ravel().astype(np.int16) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    packed = flat[0::2] | (flat[1::2] << 4)
    return helper.make_tensor(name, TensorProto.INT4, list(q.shape), packed.tobytes(), raw=True)
