"""Captured graph inputs, held compactly.

A captured call of a KV-cache graph carries every cache at its full static length: at real
Qwen3-TTS shapes one talker call is 28 layers x K/V x [1, 8, 1024, 128] fp32 = 235 MB, of which
only the first (prompt + frames) slots are used; the rest are zeros. Recording every call of the
calibration generations that way needs ~100 GB. Two measures keep it bounded:

  Sample        one call's {name: array}; an array whose trailing slots along axis -2 are all
                zero is kept as its used prefix and padded back with zeros when read (lossless).
  CallRecorder  the calls of one graph, thinned once they pass a byte budget: every other kept
                call is dropped and only every 2nd (4th, ...) later call is kept, so the kept
                calls stay evenly spread over the whole generation. Below the budget every call
                is kept (small graphs capture exactly as before).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

TRIM_MIN_BYTES = 1 << 20          # arrays below 1 MB are kept as they are
RECORD_BUDGET_BYTES = 256 << 20   # per graph, before thinning starts


class Sample(Mapping):
    """{input name: ndarray}, read-only; large zero-padded arrays are stored as their used prefix."""

    __slots__ = ("_arrays", "_shapes")

    def __init__(self, arrays: Mapping):
        self._arrays: dict[str, np.ndarray] = {}
        self._shapes: dict[str, tuple] = {}
        for k, v in arrays.items():
            a = np.asarray(v)
            n = _used_prefix(a)
            if n is None:
                self._arrays[k] = np.array(a, copy=True)
            else:
                self._arrays[k] = np.array(a[..., :n, :], copy=True)
                self._shapes[k] = a.shape

    def __getitem__(self, key: str) -> np.ndarray:
        a = self._arrays[key]
        shape = self._shapes.get(key)
        if shape is None:
            return a
        full = np.zeros(shape, a.dtype)
        full[..., :a.shape[-2], :] = a
        return full

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    @property
    def nbytes(self) -> int:
        """Bytes held (not the padded size)."""
        return sum(a.nbytes for a in self._arrays.values())

    def __reduce__(self):                 # pickled compact (to runner worker processes)
        return (_restore, (self._arrays, self._shapes))

    def compact(self) -> tuple[dict, dict]:
        """(stored arrays, {name: full shape} of the trimmed ones): what `from_compact` takes back."""
        return self._arrays, self._shapes

    @staticmethod
    def from_compact(arrays: dict, shapes: dict) -> "Sample":
        return _restore(dict(arrays), {k: tuple(v) for k, v in shapes.items()})


def _restore(arrays: dict, shapes: dict) -> Sample:
    s = Sample.__new__(Sample)
    s._arrays, s._shapes = arrays, shapes
    return s


def _used_prefix(a: np.ndarray) -> int | None:
    """Length of the prefix along axis -2 holding every nonzero, when trimming saves at least half."""
    if a.ndim < 2 or a.nbytes < TRIM_MIN_BYTES or a.dtype.kind not in "fiu":
        return None
    axes = tuple(i for i in range(a.ndim) if i != a.ndim - 2)
    used = np.flatnonzero(np.any(a != 0, axis=axes))
    n = int(used[-1]) + 1 if used.size else 0
    return n if n <= a.shape[-2] // 2 else None


class CallRecorder:
    """The calls of one graph: all of them below `budget` bytes, then an evenly thinned subset."""

    def __init__(self, budget: int = RECORD_BUDGET_BYTES):
        self.budget = budget
        self.kept: list[Sample] = []
        self.seen = 0                     # calls offered
        self.stride = 1
        self._bytes = 0

    def add(self, inputs: Mapping) -> None:
        i = self.seen
        self.seen += 1
        if i % self.stride:
            return
        s = Sample(inputs)
        self.kept.append(s)
        self._bytes += s.nbytes
        while self._bytes > self.budget and len(self.kept) > 2:
            self.kept = self.kept[::2]    # kept calls sat at multiples of stride; now of 2 * stride
            self.stride *= 2
            self._bytes = sum(k.nbytes for k in self.kept)

    @property
    def thinned(self) -> bool:
        return self.stride > 1
