"""Giving freed memory back to the OS between the stages of a long build."""
from __future__ import annotations

import contextlib


def trim_heap() -> None:
    """malloc_trim(0): glibc keeps freed small blocks (a model's many tensors under its 32 MB mmap
    threshold, a lowering's graph objects) in its arenas, so RssAnon stays at the last stage's peak
    and the next stage starts from there. Not glibc: nothing to do."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def release_memory() -> None:
    """Free what the last component left (its graphs, programs, weights) and hand the heap's free
    pages back to the OS: glibc keeps freed small blocks (a model's many < 32 MB tensors) in its
    arenas otherwise, and the next component would start from the last one's peak."""
    import gc

    gc.collect()
    trim_heap()


def _proc_kib(path: str, key: str) -> int | None:
    """A `Key:   N kB` field of a /proc file, in bytes; None when absent (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what the kernel can hand out without swapping); None off Linux."""
    return _proc_kib("/proc/meminfo", "MemAvailable")


def own_rss_anon() -> int:
    """This process's RssAnon (bytes); 0 when /proc is not there."""
    return _proc_kib("/proc/self/status", "RssAnon") or 0


class MemoryGate:
    """Reservations for the heavy processes a build runs beside itself: QNN compile and quantizer
    children, simulator / ONNX Runtime scoring workers, an in-process .pte lowering. Each heavy step
    holds an estimate of its peak (a multiple of its graph's weight bytes, measured at 0.6B) while
    it runs; a step whose estimate does not fit beside what is already held waits for the others
    to finish. A step always runs when nothing else is held, so the build never stalls: the gate
    only decides what may overlap.

    With a budget alone (--max-memory), at 0.6B on 24 GiB everything overlaps (two ~3.9 GB
    reservations fit); at 1.7B a ~13 GB QNN compile child and a ~13 GB simulator worker would not
    fit beside the build process, and run one after the other instead of being killed by the
    kernel. `budget` None: no gating.

    alone: steps acquired with `alone=True` (the QNN compile and quantizer children, ~1.2-2.5x their
    graph's fp32 weight bytes each) wait until nothing else is held, and nothing else starts while
    one waits or runs: the tree then peaks at one such child beside the build process. The job
    scheduler passes a `ceiling` (`alone_ceiling`: the largest alone reservation of the build): an
    alone step then shares the machine with other heavy steps while all reservations held together
    stay within it, since the tree must make room for that largest step anyway. At 0.6B (9bba532)
    the talker's quantized compiles and repair steps (~2.5 GiB each against the fp16 compile's ~4 GiB)
    ran 700 s with one core idle. Before the alone rule (no ceiling either), at 0.6B the
    talker decode's compile child (3.69 GiB) overlapped a scoring worker (1.48 GiB) and the build
    process (2.12 GiB): 7.30 GiB, where one child beside the build process is ~5.3. It costs wall
    (the scoring queue pauses while a child runs); the build gives a --max-memory budget to let
    them overlap where it fits."""

    def __init__(self, budget: int | None = None, alone: bool = False):
        import threading

        self.budget = budget
        self.alone = alone
        self._held = 0
        self._count = 0
        self._alone_waiting = 0
        self._alone_held = False
        self._cond = threading.Condition()
        self.waits = 0
        self.waited_s = 0.0
        self.peak_held = 0
        self.alone_steps = 0

    def _must_wait(self, nbytes: int, alone: bool, ceiling: int | None = None) -> bool:
        over = self.budget is not None and self._count > 0 and self._held + nbytes > self.budget
        # beside an alone step: what is held stays within the build's largest alone reservation
        beside = ceiling is not None and self._held + nbytes <= ceiling and not self._alone_waiting
        if alone:
            return self._count > 0 and (not beside or over)
        if self._alone_held or self._alone_waiting:
            return not beside or over
        return over

    def acquire(self, nbytes: int, alone: bool = False) -> None:
        import time

        alone = alone and self.alone
        if nbytes <= 0:
            return
        with self._cond:
            t0 = time.monotonic()
            waited = False
            if alone:
                self._alone_waiting += 1
            try:
                while self._must_wait(nbytes, alone):
                    waited = True
                    self._cond.wait()
            finally:
                if alone:
                    self._alone_waiting -= 1
            if waited:
                self.waits += 1
                self.waited_s += time.monotonic() - t0
            self._take(nbytes, alone)

    def _take(self, nbytes: int, alone: bool) -> None:
        """Hold the reservation (under the lock)."""
        if alone:
            self._alone_held = True
            self.alone_steps += 1
        self._held += nbytes
        self._count += 1
        self.peak_held = max(self.peak_held, self._held)

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._cond:
            self._held -= nbytes
            self._count -= 1
            if self._count == 0:
                self._alone_held = False
            self._cond.notify_all()

    def try_acquire(self, nbytes: int, alone: bool = False, ceiling: int | None = None) -> bool:
        """acquire() if the reservation fits now, without waiting; False (nothing held) otherwise.
        The job scheduler's form: it tries again when a running job ends. `ceiling`: the largest
        reservation among the build's alone steps (`alone_ceiling`); heavy steps then share the
        machine with an alone one while every reservation held together stays within it."""
        alone = alone and self.alone
        if nbytes <= 0:
            return True
        with self._cond:
            if self._must_wait(nbytes, alone, ceiling if self.alone else None):
                return False
            self._take(nbytes, alone)
            return True

    @contextlib.contextmanager
    def hold(self, nbytes: int, alone: bool = False):
        self.acquire(nbytes, alone)
        try:
            yield
        finally:
            self.release(nbytes)

    def report(self) -> dict:
        return {"budget_bytes": self.budget, "peak_held_bytes": self.peak_held, "waits": self.waits,
                "waited_s": round(self.waited_s, 3), "children_alone": self.alone,
                **({"alone_steps": self.alone_steps} if self.alone else {})}


NO_GATE = MemoryGate(None)


# Peak RssAnon of one heavy step per byte of its graph's fp32 weights, measured on the Qwen3-TTS
# talker graphs (0.6B: ~1.8 GB of fp32 weights; 1.7B: ~5.6 GB), each process sampled every 0.5 s:
#   QNN compile child (context binary, fp16): 4.17 GiB at 0.6B (2.5x), 11.39 GiB at 1.7B (2.2x)
#     from the fp32 ONNX; 3.68 GiB at 0.6B (2.2x) from the fp16 ONNX, as now
#   QNN DLC child (fp16, from the fp16 ONNX): 1.79 GiB at 0.6B (1.1x; 3.56 GiB from the fp32 ONNX)
#   HTP simulator worker compiling the source ONNX: 3.57 GiB at 0.6B (2.1x)
#   HTP simulator worker loading the compiled context binary: 1.24 GiB at 0.6B (0.74x)
#   quantizer child: 3.08 GiB at 0.6B (1.8x, alone, 16 calibration calls)
#   in-process fp16 .pte lowering (the fp16 copy and XNNPACK's serialized one; above the process's
#     RssAnon before it): 1.84 GiB at 0.6B (talker decode, 1.12x), 4.99 GiB at 1.7B (talker
#     prefill, 0.96x) -- 2.73 / 8.10 GiB (1.66x / 1.56x) before preprocessing shared the weights
# ORT CPU sessions of an fp16 / QDQ graph fold their weights to fp32 once (~1x) plus the session's
# arena: an estimate. A lean session (heavy graphs) keeps them in the file's pages (0.08 GiB after a
# 0.6B talker decode call on zeros, against 1.97 GiB); what remains is mostly the held-out inputs:
# 1.48 GiB for the 0.6B talker decode's scoring worker (12 calls, each with its KV cache; 1.84 before).
#   QNN compile child from a QDQ (w8a16) ONNX: 2.03 GiB at 0.6B (1.2x); a repair step (quantize, compile
#     and simulate in one process): 2.47-2.50 GiB (1.5x); a w8a16-mixed context binary 2.54 GiB (1.5x)
STEP_FACTORS = {"qnn-compile": 2.5, "qnn-compile-qdq": 1.6, "qnn-dlc": 1.3, "quantize": 2.0, "qnn-htp": 2.2, "qnn-htp-ctx": 0.9, "ort-cpu": 1.5,
                "ort-cpu-lean": 0.8, "pte-lower": 1.15, "executorch": 1.0}


# Steps that run alone unless the build was given a --max-memory budget (MemoryGate.alone): the
# QNN compile and quantizer children, and a simulator worker compiling a source ONNX itself.
ALONE_STEPS = frozenset({"qnn-compile", "quantize", "qnn-htp"})
# ...when their reservation comes to this much: the 0.6B talker's (1.7 GiB of weights) compile
# reserves 4.4 GB and runs alone; a predictor's or Code2Wav's (~0.5 GiB) 1.3 GB and overlaps other
# jobs under the gate. At 3e7927b every one of them ran alone, one core idle meanwhile.
ALONE_MIN_BYTES = 2 << 30


# Steps that run one at a time among themselves when their reservation comes to LANE_MIN_BYTES, beside
# any other job: ExecuTorch lowerings. At 4bce34b the 0.6B build's peak was the talker prefill's and
# decode's fp16 .pte lowerings at once (2.82 + 1.97 GiB RssAnon) beside the build process: 5.62 GiB.
LANE_STEPS = frozenset({"pte-lower"})
LANE_MIN_BYTES = 1 << 30


def lane(kind: str, nbytes: int) -> str | None:
    """The lane a heavy step of this kind and reservation runs in (one job of a lane at a time), or None."""
    return kind if kind in LANE_STEPS and nbytes >= LANE_MIN_BYTES else None


def runs_alone(kind: str, nbytes: int) -> bool:
    """Whether a heavy step of this kind and reservation runs with nothing else heavy beside it."""
    return kind in ALONE_STEPS and nbytes >= ALONE_MIN_BYTES


def alone_ceiling(reservations) -> int | None:
    """The largest of the alone steps' reservations (MemoryGate.try_acquire's `ceiling`); None without one."""
    return max(reservations, default=None)


def step_bytes(kind: str, weight_bytes: int) -> int:
    """The reservation of a heavy step (STEP_FACTORS) for a graph of `weight_bytes` fp32 weights."""
    return int(STEP_FACTORS.get(kind, 1.0) * weight_bytes)


def tensor_bytes(tensors) -> int:
    """The bytes a set of tensors holds: a stretch of memory that several of them view (a slice of a
    flat buffer registered beside it, a tensor listed twice) counts once."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in tensors:
        start = t.storage_offset() * t.element_size()
        spans.setdefault(t.untyped_storage().data_ptr(), []).append((start, start + t.numel() * t.element_size()))
    total = 0
    for runs in spans.values():
        end = -1
        for a, b in sorted(runs):
            total += max(0, b - max(a, end))
            end = max(end, b)
    return total


def build_budget(max_memory: int | None) -> int:
    """What the heavy steps of one component may hold together: 90 % of what the kernel can hand
    out now (MemAvailable; the build process's own memory is already taken from it), and with
    `max_memory` (the whole tree's target) no more than it minus this process's RssAnon."""
    avail = available_bytes()
    budget = int(avail * 0.9) if avail is not None else None
    if max_memory is not None:
        mine = max(0, max_memory - own_rss_anon())
        budget = mine if budget is None else min(budget, mine)
    return budget if budget is not None else 1 << 62
