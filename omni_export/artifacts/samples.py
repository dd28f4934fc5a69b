"""Held-out clips kept for people: one held-out output per build, written as WAV under samples/.

A recipe's Component declares which outputs are audio (`audio_outputs = {"wav": 24000}`); the
pipeline hands every build's runner outputs (and the fp32 reference) here, and the report plays
and draws them. WAVs are 32-bit float (lossless against the runner's output, which can exceed
[-1, 1] for a broken build); Chromium, Firefox and Safari play them.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .store import atomic_write_bytes, sha256_file

SAMPLES_DIR = "samples"


def heldout_index(count: int) -> int:
    """The held-out input whose output is kept: the last one (streaming graphs' later inputs
    carry full context, as in trace_blocks)."""
    return count - 1


def keep_audio(put, stem: str, outputs: Sequence[dict], audio: Mapping[str, int]) -> list[dict]:
    """Write each audio output of one held-out sample to samples/{stem}-{output}.wav through
    `put(relpath, bytes) -> FileRecord` (the store's, so the run's journal knows the file, or a
    directory to write into directly); return records."""
    if not audio or not outputs:
        return []
    if isinstance(put, (str, Path)):
        put = _direct(Path(put))
    i = heldout_index(len(outputs))
    return [_write(put, f"{SAMPLES_DIR}/{stem}-{name}.wav", outputs[i][name], rate, name, i)
            for name, rate in audio.items()]


def _direct(root: Path):
    def put(rel: str, data: bytes):
        path = root / rel
        atomic_write_bytes(path, data)
        return type("Rec", (), {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size})
    return put


def _write(put, rel: str, array, rate: int, output: str, index: int) -> dict:
    from scipy.io import wavfile

    clip = as_channels(array)
    buf = io.BytesIO()
    wavfile.write(buf, int(rate), clip.T if clip.shape[0] > 1 else clip[0])
    rec = put(rel, buf.getvalue())
    finite = clip[np.isfinite(clip)]
    return {"output": output, "path": rec.path, "sample_rate": int(rate), "heldout_index": index,
            "channels": int(clip.shape[0]), "seconds": round(clip.shape[1] / rate, 4),
            "peak": round(float(np.abs(finite).max()), 6) if finite.size else None,
            "finite": bool(finite.size == clip.size), "sha256": rec.sha256, "bytes": rec.bytes}


def as_channels(array) -> np.ndarray:
    """[..., samples] with leading dims of batch/channels -> float32 [channels, samples]."""
    a = np.asarray(array, dtype=np.float32)
    if a.ndim == 0:
        raise ValueError("an audio output must have a time axis")
    return a.reshape(-1, a.shape[-1])


def read_wav(path: Path) -> tuple[int, np.ndarray]:
    """(sample rate, float32 [channels, samples]) of a WAV written by keep_audio."""
    from scipy.io import wavfile

    rate, data = wavfile.read(path)
    data = np.asarray(data, dtype=np.float32)
    return int(rate), (data.T if data.ndim == 2 else data[None, :])
