"""Ways to break an int8 build on purpose, for the gate tests."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from omni_export.weights import write_safetensors


def outlier_input_channel(src: Path, dst: Path, channel: int = 3, gain: float = 400.0) -> Path:
    """Copy a Code2Wav checkpoint and give pre_conv an outlier input channel.

    The channel's activations are made tiny (its rows of both RVQ output projections are scaled
    by 1/gain) and every pre_conv weight reading it is scaled by gain: the fp32 function is nearly
    unchanged and fp16 represents it easily, but each output channel's int8 weight scale is now set
    by the outlier, and all its other weights round to zero.
    """
    from safetensors.numpy import load_file

    shutil.copytree(src, dst)
    path = dst / "speech_tokenizer" / "model.safetensors"
    t = load_file(path)
    for group in ("rvq_first", "rvq_rest"):
        t[f"decoder.quantizer.{group}.output_proj.weight"][channel] /= gain
    w = t["decoder.pre_conv.conv.weight"]
    w[:, channel, :] = np.sign(w[:, channel, :]) * np.abs(w).max() * gain
    write_safetensors(path, t)
    return dst


def constant_codes(path: Path, frames: int = 64, codebooks: int = 16, value: int = 7) -> Path:
    """A calibration set from the wrong distribution: one code repeated in every frame."""
    np.save(path, np.full((frames, codebooks), value, dtype=np.int64))
    return path


def outlier_activation_channel(src: Path, dst: Path, channel: int = 3, gain: float = 1000.0) -> Path:
    """Copy a Code2Wav checkpoint and give the activation entering pre_conv an outlier channel.

    The channel's rows of both RVQ output projections are scaled by gain (the summed quantizer
    output carries one channel ~1000x the others) and every pre_conv weight reading it by 1/gain:
    the fp32 function is the same and fp16 holds both ranges, but a per-tensor 16-bit activation
    scale set by the outlier leaves the other channels a few levels, and the compensating weights
    round to zero in int8 -- the activation outliers LLM and TTS int8 builds break on.
    """
    from safetensors.numpy import load_file

    shutil.copytree(src, dst)
    path = dst / "speech_tokenizer" / "model.safetensors"
    t = load_file(path)
    for group in ("rvq_first", "rvq_rest"):
        t[f"decoder.quantizer.{group}.output_proj.weight"][channel] *= gain
    t["decoder.pre_conv.conv.weight"][:, channel, :] /= gain
    write_safetensors(path, t)
    return dst
