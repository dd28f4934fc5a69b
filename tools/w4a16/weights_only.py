"""The weights' share of a w4a16 loss: the fp32 graph with only its linear weights (MatMul / Conv /
ConvTranspose, input 1) replaced by their int4 values (per tensor / per channel / per block), on ORT CPU.

    PYTHONPATH=. .venv/bin/python tools/w4a16/weights_only.py qwen3-tts-code2wav [BLOCK]
"""
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
from run import W, load, score  # noqa: E402

from omni_export.exporters.onnx import _int4_weights  # noqa: E402


def fake(w, axis, mode, block, bits=4):
    hi = 2 ** (bits - 1) - 1
    if mode == "tensor":
        s = np.abs(w).max() / hi
        return np.clip(np.rint(w / s), -hi - 1, hi) * s
    red = tuple(i for i in range(w.ndim) if i != axis)
    if mode == "channel" or w.shape[1 - axis if w.ndim == 2 else 1] % block:
        s = np.abs(w).max(axis=red, keepdims=True) / hi
        return np.clip(np.rint(w / np.where(s > 0, s, 1)), -hi - 1, hi) * s
    k_axis = 0 if w.ndim == 2 else 1
    shape = list(w.shape)
    split = shape[:k_axis] + [shape[k_axis] // block, block] + shape[k_axis + 1:]
    wb = w.reshape(split)
    s = np.abs(wb).max(axis=tuple([k_axis + 1] + list(range(k_axis + 2, wb.ndim)) if w.ndim > 2 and shape[2:] != [1, 1] else [k_axis + 1]), keepdims=True) / hi
    return (np.clip(np.rint(wb / np.where(s > 0, s, 1)), -hi - 1, hi) * s).reshape(shape)


def main(tag, block="64"):
    meta, rows = load(tag)
    src = onnx.load(meta["fp32"])
    targets = _int4_weights(src)
    print(tag, len(targets), "linear weights")
    for mode, bits in (("tensor", 4), ("channel", 4), ("block", 4), ("channel", 8)):
        m = onnx.ModelProto()
        m.CopyFrom(src)
        for i in m.graph.initializer:
            if i.name in targets:
                w = numpy_helper.to_array(i).astype(np.float32)
                i.CopyFrom(numpy_helper.from_array(fake(w, targets[i.name][1], mode, int(block), bits).astype(np.float32), i.name))
        out = W / tag / "arms" / f"wonly-{mode}{bits}.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(m, str(out))
        print(mode, bits, block, score(out, meta, rows, "ort-cpu"), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
