"""ONNX: export (torch dynamo exporter), fp16 conversion, QDQ quantization for the HTP.

Knows the format, never the model: every function takes a program or a file and tensors by name.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core import Precision

OPSET = 21
_EXTERNAL_DATA_BYTES = 1_800_000_000   # stay clear of protobuf's 2 GB limit


def export(program, path: Path, input_names: Sequence[str], output_names: Sequence[str]) -> Path:
    """Export a torch.export ExportedProgram to ONNX (weights inline below ~1.8 GB)."""
    import torch

    weight_bytes = sum(t.numel() * t.element_size() for t in program.state_dict.values())
    weight_bytes += sum(t.numel() * t.element_size() for t in program.constants.values()
                        if isinstance(t, torch.Tensor))
    path.parent.mkdir(parents=True, exist_ok=True)
    _quiet_exporter()
    big = weight_bytes > _EXTERNAL_DATA_BYTES
    onnx_program = torch.onnx.export(program, (), None, opset_version=OPSET, dynamo=True, verbose=False)
    model = onnx_program.model_proto if not big else None
    if model is None:                        # large: save with external data, then rename in place
        onnx_program.save(str(path), external_data=True)
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    name_io(model, input_names, output_names)
    if big:
        import onnx

        onnx.save(model, str(path))
    else:
        _save(model, path)
    return path


def name_io(model, input_names: Sequence[str], output_names: Sequence[str]) -> None:
    """Give the graph's inputs and outputs our names, renaming any internal value that already
    carries one of them (the exporter names values after ops, e.g. an `embedding` op)."""
    g = model.graph
    wanted = {v.name: new for v, new in zip(g.input, input_names)}
    wanted.update({v.name: new for v, new in zip(g.output, output_names)})
    taken = set(wanted.values())
    renames = {}
    for node in g.node:
        for out in node.output:
            if out in taken and out not in wanted:
                renames[out] = f"{out}__internal"
    renames.update(wanted)
    if len(g.input) != len(input_names) or len(g.output) != len(output_names):
        raise ValueError(f"graph has {len(g.input)} inputs / {len(g.output)} outputs, expected "
                         f"{len(input_names)} / {len(output_names)}")

    def r(name):
        return renames.get(name, name)

    for node in g.node:
        node.input[:] = [r(n) for n in node.input]
        node.output[:] = [r(n) for n in node.output]
    for v in list(g.input) + list(g.output) + list(g.value_info):
        v.name = r(v.name)


def to_fp16(src: Path, dst: Path) -> Path:
    """fp16 weights and compute, fp32 inputs/outputs (Cast nodes at the edges)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)
    _save(half, dst)
    return dst


class _Reader:
    """onnxruntime.quantization CalibrationDataReader over a list of input dicts."""

    def __init__(self, data: Sequence[dict]):
        self._it = iter(data)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # not needed by MinMax, kept for the reader protocol
        pass


def quantize_qdq(src: Path, dst: Path, calibration: Sequence[dict], precision: Precision) -> Path:
    """Static QDQ for the HTP: int8 (w8a16, w8a8) or signed symmetric int4 (w4a16) per-channel weights,
    16- or 8-bit activations, MinMax ranges collected by running the fp32 model on `calibration`
    (captured real inputs; never dummies)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if not calibration:
        raise ValueError("quantization needs calibration data; none was given")
    act = {Precision.W8A16: QuantType.QUInt16, Precision.W8A8: QuantType.QUInt8,
           Precision.W4A16: QuantType.QUInt16}[precision]
    weight = QuantType.QInt4 if precision == Precision.W4A16 else QuantType.QUInt8
    model = onnx.load(str(src))
    cfg = get_qnn_qdq_config(model, _Reader(calibration), activation_type=act,
                             weight_type=weight, per_channel=True)
    logging.getLogger().setLevel(logging.ERROR)   # ORT prints pre-processing advice at WARNING
    dst.parent.mkdir(parents=True, exist_ok=True)
    quantize(str(src), str(dst), cfg)
    return dst


def input_feed(path: Path) -> list[tuple[str, list, str]]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    out = []
    for i in m.graph.input:
        t = i.type.tensor_type
        out.append((i.name, [d.dim_value for d in t.shape.dim], onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name))
    return out


def _save(model, dst: Path) -> None:
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    big = model.ByteSize() > _EXTERNAL_DATA_BYTES
    onnx.save(model, str(dst), save_as_external_data=big,
              location=dst.name + ".data" if big else None)


def _quiet_exporter() -> None:
    for name in ("torch.onnx", "torch.export", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)


def as_arrays(d: dict) -> dict:
    return {k: np.ascontiguousarray(v) for k, v in d.items()}
