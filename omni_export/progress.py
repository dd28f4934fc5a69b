"""How a build tells what it is doing: stages (sequential steps of the driver) and jobs (many at once).

The CLI swaps in a rich console (cli._Console); tests keep the silent base class or watch it.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator


class StageNote:
    """Set inside a stage, shown on its line when it ends: what it found (`text`, e.g. a build's
    verdict) and, for a stage that only waited on work done elsewhere (a scoring job in a worker),
    that work's own `seconds` instead of the wait."""

    def __init__(self) -> None:
        self.text = ""
        self.failed = False          # what it found is a failure (a rejected build), not an error of the stage
        self.seconds: float | None = None


class Progress:
    """Stage reporting; a stage yields a StageNote (or None, for reporters that show no results).
    A job of the job graph starts (`job_started`) and ends (`job_finished`, with its note); by
    default an ended job is reported as a stage of its own."""

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        yield StageNote()

    def note(self, text: str) -> None:
        pass

    def job_started(self, text: str) -> None:
        pass

    def job_finished(self, text: str, note: StageNote) -> None:
        with self.stage(text) as n:
            if n is not None:
                n.text, n.failed, n.seconds = note.text, note.failed, note.seconds

    def jobs_status(self, running: list[tuple[str, float]], done: int, total: int) -> None:
        """What runs now (label, seconds running) and how far the job graph is; called often."""


class Wrapped(Progress):
    """A Progress around another, passing everything on."""

    def __init__(self, inner: Progress):
        self.inner = inner

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        with self.inner.stage(text) as note:
            yield note

    def note(self, text: str) -> None:
        self.inner.note(text)

    def job_started(self, text: str) -> None:
        self.inner.job_started(text)

    def job_finished(self, text: str, note: StageNote) -> None:
        self.inner.job_finished(text, note)

    def jobs_status(self, running, done: int, total: int) -> None:
        self.inner.jobs_status(running, done, total)


class StageLog(Wrapped):
    """Appends one JSON line per stage or job start/end to a file (wall-clock seconds):
    OMNI_EXPORT_STAGE_LOG=path. The benchmark harness lines these up with its memory samples to
    attribute the peak to a stage."""

    def __init__(self, inner: Progress, path: str):
        super().__init__(inner)
        self.path = path

    def _log(self, event: str, text: str) -> None:
        import json

        with open(self.path, "a") as f:
            f.write(json.dumps({"t": time.time(), "event": event, "stage": text}) + "\n")

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        self._log("start", text)
        try:
            with self.inner.stage(text) as note:
                yield note
        finally:
            self._log("end", text)

    def job_started(self, text: str) -> None:
        self._log("start", text)
        self.inner.job_started(text)

    def job_finished(self, text: str, note: StageNote) -> None:
        self._log("end", text)
        self.inner.job_finished(text, note)


class InterruptPoints(Wrapped):
    """Every stage and job start and end is an interrupt point (faults.interrupts_latched)."""

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        from .faults import interrupt_point

        interrupt_point()
        with self.inner.stage(text) as note:
            yield note
        interrupt_point()

    def job_started(self, text: str) -> None:
        from .faults import interrupt_point

        interrupt_point()
        self.inner.job_started(text)

    def job_finished(self, text: str, note: StageNote) -> None:
        from .faults import interrupt_point

        self.inner.job_finished(text, note)
        interrupt_point()


def clock(seconds: float) -> str:
    """A duration as a person reads it: 45s, 7m20s, 1h05m."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Paced(Wrapped):
    """Knows when the last line went out, and keeps a heartbeat: whenever `every` seconds pass without
    a line, one line saying what runs (`status()`, else the open stages), so no step runs longer
    than that silently -- a trace, a simulator run, a host loop in the build process."""

    def __init__(self, inner: Progress, every: float = 9.0):      # checked once a second: a line every <= 10 s
        super().__init__(inner)
        self.every = every
        self.last = time.monotonic()
        self.status = None                     # () -> str: what the job graph is doing, set while it runs
        self._stages: list[tuple[str, float]] = []
        self._beating = _Beat(self.beat, "progress-heartbeat")

    def _line(self) -> None:
        self.last = time.monotonic()

    @contextlib.contextmanager
    def stage(self, text: str) -> Iterator[StageNote | None]:
        item = (text, time.time())
        self._stages.append(item)
        try:
            with self.inner.stage(text) as note:
                yield note
        finally:
            self._stages.remove(item)
            self._line()

    def note(self, text: str) -> None:
        self.inner.note(text)
        self._line()

    def job_finished(self, text: str, note: StageNote) -> None:
        self.inner.job_finished(text, note)
        self._line()

    def beat(self) -> None:
        """One heartbeat check (the thread calls it every second)."""
        if time.monotonic() - self.last < self.every:
            return
        text = None
        if self.status is not None:
            try:
                text = self.status()
            except Exception as e:           # a status that cannot be read is no reason to stop a build
                text = f"still running ({type(e).__name__} reading the status)"
        elif self._stages:
            now = time.time()
            text = "still running: " + "; ".join(f"{t} ({clock(now - t0)})" for t, t0 in self._stages)
        if text:
            self.note(text)
        else:
            self._line()

    def start(self) -> "Paced":
        self._beating.start()
        return self

    def stop(self) -> None:
        self._beating.stop()


class _Beat:
    """Calls `beat` once a second in a daemon thread between start() and stop()."""

    def __init__(self, beat, name: str):
        import threading

        self.beat, self.name = beat, name
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        import threading

        def loop():
            while not self._stop.wait(1.0):
                self.beat()

        self._thread = threading.Thread(target=loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


# ---- frames of a host loop (synth, end-to-end rows): done / total, with an ETA
_frame_sink = None          # callable(Frames) or None: where meters report


class Frames:
    """A host loop's meter: call it once per frame done. `bound`: the total is an upper bound (a
    generation that stops at its end-of-speech token)."""

    def __init__(self, label: str, total: int, bound: bool = False, sink=None, unit: str = "frames"):
        self.label, self.total, self.bound, self.sink = label, max(0, int(total)), bound, sink
        self.unit = unit
        self.done = 0
        self.t0 = self.last = time.time()

    def __call__(self, n: int = 1) -> None:
        self.done += n
        self.last = time.time()
        if self.sink is not None:
            self.sink(self)

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def text(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        total = f"{'≤' if self.bound else ''}{self.total}"
        if not self.done:
            return f"{self.label}: {self.unit[:-1]} 1/{total} running ({clock(now - self.t0)})"
        rate = (self.last - self.t0) / self.done
        left = max(0, self.total - self.done) * rate
        eta = "" if self.finished else f", ETA {'≤' if self.bound else ''}{clock(left)}"
        return f"{self.label}: {self.done}/{total} {self.unit}, {rate:.2f} s/{self.unit[:-1]}{eta}"

    def state(self) -> dict:
        return {"label": self.label, "total": self.total, "bound": self.bound, "done": self.done,
                "t0": self.t0, "last": self.last, "unit": self.unit}

    @classmethod
    def from_state(cls, d: dict) -> "Frames":
        f = cls(str(d["label"])[:80], int(d["total"]), bool(d["bound"]), unit=str(d.get("unit") or "frames")[:20])
        f.done, f.t0, f.last = int(d["done"]), float(d["t0"]), float(d["last"])
        return f


def frames(label: str, total: int, bound: bool = False, unit: str = "frames") -> Frames:
    """A meter for a host loop (`unit`: what one step makes, plural), reporting to the sink in place
    (frame_sink); silent without one."""
    return Frames(label, total, bound, _frame_sink, unit)


@contextlib.contextmanager
def frame_sink(sink):
    """Meters opened inside report to `sink` (a callable taking the Frames)."""
    global _frame_sink
    saved, _frame_sink = _frame_sink, sink
    try:
        yield sink
    finally:
        _frame_sink = saved


class FrameLines:
    """A sink printing a meter's line (`emit`) after its first frame, then whenever `every` seconds
    passed since the last line, and a heartbeat while a single frame takes longer than that."""

    def __init__(self, emit, every: float = 9.0):
        import threading

        self.emit, self.every = emit, every
        self.current: Frames | None = None
        self.printed = time.monotonic()
        self._lock = threading.Lock()
        self._beating = _Beat(self.beat, "frames-heartbeat")

    def __call__(self, meter: Frames) -> None:
        with self._lock:
            new = meter is not self.current
            self.current = meter
            if meter.done == 1 or (new and meter.done) or time.monotonic() - self.printed >= self.every \
                    or (meter.finished and meter.last - meter.t0 >= self.every):
                self._say(meter.text())

    def _say(self, text: str) -> None:
        self.printed = time.monotonic()
        self.emit(text)

    def beat(self) -> None:
        with self._lock:
            m = self.current
            if m is None or time.monotonic() - self.printed < self.every:
                return
            if m.finished:           # the loop is over; what follows it (a decode) has no meter
                self._say(f"... still running, {clock(time.time() - m.last)} after {m.label} ended "
                          f"({m.done} {m.unit})")
            else:
                self._say(m.text() if not m.done else f"{m.text()}; {m.unit[:-1]} {m.done + 1} running "
                                                      f"({clock(time.time() - m.last)})")

    def __enter__(self) -> "FrameLines":
        self._beating.start()
        return self

    def __exit__(self, *exc) -> None:
        self._beating.stop()


@contextlib.contextmanager
def frame_lines(emit, every: float = 9.0):
    """Host loops inside print their frames done / total with an ETA through `emit` (FrameLines)."""
    with FrameLines(emit, every) as lines, frame_sink(lines):
        yield lines


class FrameFile:
    """A sink for a worker's host loop: the meter's state as a small JSON file (rewritten atomically at
    most once a second), read by the build process for its heartbeat line (`read_frames`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.written = 0.0

    def __call__(self, meter: Frames) -> None:
        import json
        import os

        now = time.monotonic()
        if now - self.written < 1.0 and not meter.finished and meter.done > 1:
            return
        self.written = now
        try:
            tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(meter.state()))
            os.replace(tmp, self.path)
        except OSError:
            pass                              # a meter is never a reason to fail the job


def read_frames(path: str | Path) -> Frames | None:
    """The meter a worker's FrameFile left, or None (not there yet, or not one)."""
    import json

    try:
        p = Path(path)
        if p.is_symlink() or not p.is_file() or p.stat().st_size > 4096:
            return None
        return Frames.from_state(json.loads(p.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
