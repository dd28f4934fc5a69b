"""Host-side orchestration for Qwen3-TTS graphs: streaming Code2Wav over a whole code sequence.

The static chunk graph always sees T = L + N frames. Upstream `chunked_decode(codes, N, L)` decodes
[context + chunk] with context = L once at least L frames precede the chunk, else everything
before it (the first chunks are shorter), and drops the context's samples. Here the window is
right-padded / left-masked to T frames: real frames sit at [L - ctx, L + n) and the mask zeroes
the rest, which decodes exactly what upstream decodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np


@dataclass(frozen=True)
class Window:
    codes: np.ndarray       # [1, Q, T] int32
    frame_mask: np.ndarray  # [1, T] float32
    keep_from: int          # sample range of the output that belongs to this chunk
    keep_to: int

    def inputs(self) -> dict:
        return {"codes": self.codes, "frame_mask": self.frame_mask}


def windows(codes: np.ndarray, left: int, chunk: int, samples_per_frame: int) -> Iterator[Window]:
    """Chunk windows over codes [frames, Q] in upstream's order."""
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be [frames, codebooks], got shape {codes.shape}")
    frames, q = codes.shape
    t = left + chunk
    start = 0
    while start < frames:
        end = min(start + chunk, frames)
        ctx = left if start - left > 0 else start
        n = end - start
        win = np.zeros((1, q, t), np.int32)
        mask = np.zeros((1, t), np.float32)
        win[0, :, left - ctx:left + n] = codes[start - ctx:end].T
        mask[0, left - ctx:left + n] = 1.0
        yield Window(win, mask, left * samples_per_frame, (left + n) * samples_per_frame)
        start = end


def stream_decode(codes: np.ndarray, run_chunk: Callable[[dict], np.ndarray], left: int, chunk: int,
                  samples_per_frame: int) -> np.ndarray:
    """Decode codes [frames, Q] to a 1-D waveform through a chunk runner (inputs dict -> wav)."""
    pieces = []
    for w in windows(codes, left, chunk, samples_per_frame):
        wav = np.asarray(run_chunk(w.inputs())).reshape(-1)
        pieces.append(wav[w.keep_from:w.keep_to])
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def synthetic_codes(frames: int, codebooks: int, codebook_size: int, seed: int,
                    hold: float = 0.3) -> np.ndarray:
    """Seeded code sequences [frames, Q]: uniform codes, each held from the previous frame with
    probability `hold` (codec codes repeat across frames in steady sounds)."""
    rng = np.random.default_rng(seed)
    out = rng.integers(0, codebook_size, (frames, codebooks))
    keep = rng.random((frames, codebooks)) < hold
    for t in range(1, frames):
        out[t] = np.where(keep[t], out[t - 1], out[t])
    return out.astype(np.int32)
