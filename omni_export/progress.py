"""How a build tells what it is doing: stages (sequential steps of the driver) and jobs (many at once).

The CLI swaps in a rich console (cli._Console); tests keep the silent base class or watch it.
"""
from __future__ import annotations

import contextlib
import time
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
