"""Fault injection for the tests. `OMNI_EXPORT_NAN_OUTPUTS=<text>`: every runner whose artifact
path contains <text> returns NaN in its floating outputs (a build broken at run time, e.g. an
fp16 overflow), for the tests of what a rejected NaN build leaves in OUT.

`OMNI_EXPORT_HTP_CRASH=<text>`: a QNN HTP session on a model whose path contains <text>, made with
QNN's fast graph preparation (htp_graph_finalization_optimization_mode 1), kills its process with
SIGSEGV as QNN 2.51 did on one 0.6B Code2Wav graph (exporters/qnn_diagnose.CRASH_HINT); at another mode
it opens as usual.

Crash points for the kill tests: `OMNI_EXPORT_CRASH_AT=<point>[@n]` ends the process with
os._exit(137) -- no cleanup, no atexit, like a SIGKILL -- the n-th time (default: first) a run
reaches <point>. Unset (the normal case) it does nothing. Points, in run order:

  begin                  the store has written the .incomplete marker
  loaded                 the checkpoint is loaded
  traced                 a component is traced (fp32 references computed)
  lowered                a build's files are in .staging
  commit-before-rename   a file is in the marker's journal, not yet renamed into OUT
  commit-after-rename    a file has been renamed into OUT
  component-done         a component's builds are all in OUT and noted in the marker (resumable)
  pruned                 files of older builds are removed
  documents              parity.json and report.md are written, manifest.json is not
  manifest               manifest.json is written, the marker is not yet removed
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

ENV = "OMNI_EXPORT_CRASH_AT"
NAN_ENV = "OMNI_EXPORT_NAN_OUTPUTS"
HTP_CRASH_ENV = "OMNI_EXPORT_HTP_CRASH"
POINTS = ("begin", "loaded", "traced", "lowered", "commit-before-rename", "commit-after-rename", "component-done",
          "pruned", "documents", "manifest")
_reached: dict[str, int] = {}


def crash_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, nth = spec.partition("@")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] == int(nth or 1):
        os._exit(137)


def poisoned(artifact: str) -> bool:
    """Whether a runner of this artifact returns NaN outputs (OMNI_EXPORT_NAN_OUTPUTS; unset: never)."""
    spec = os.environ.get(NAN_ENV)
    return bool(spec) and spec in str(artifact)


def htp_crash(model, options: dict) -> None:
    """Die as QNN's fast graph preparation did, for a session this test hook names (unset: never)."""
    spec = os.environ.get(HTP_CRASH_ENV)
    if spec and spec in str(model) and options.get("htp_graph_finalization_optimization_mode") == "1":
        os.kill(os.getpid(), signal.SIGSEGV)


# ----------------------------------------------------------------------------- Ctrl-C / SIGTERM latch

_interrupted = threading.Event()
_signal: list[str] = []           # the name of the signal that interrupted the run
LATCHED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_latched():
    """While it runs, Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt and are remembered
    (`interrupted_by()` names the signal). Python drops a KeyboardInterrupt raised while a finalizer
    runs (an object's __del__, a weakref callback, during a gc pass: "Exception ignored in ...")
    and the run goes on; a remembered one is raised again at the next `interrupt_point()` (every
    stage start and end), so the run stops as interrupted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    import sys

    def latch(signum, frame):
        _signal[:] = [signal.Signals(signum).name]
        _interrupted.set()
        raise KeyboardInterrupt

    def unraisable(info):          # the dropped interrupt: no traceback, it is raised again later
        if not (isinstance(info.exc_value, KeyboardInterrupt) and _interrupted.is_set()):
            hook(info)

    _interrupted.clear()
    _signal.clear()
    previous = {s: signal.signal(s, latch) for s in LATCHED}
    hook = sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sys.unraisablehook = hook
        _interrupted.clear()


def interrupted_by() -> str:
    """SIGINT or SIGTERM: what interrupted the last latched run (SIGINT when nothing was latched:
    a KeyboardInterrupt Python raised itself)."""
    return _signal[0] if _signal else "SIGINT"


def interrupt_point() -> None:
    """Raise KeyboardInterrupt if Ctrl-C or SIGTERM came (under `interrupts_latched`), even if Python dropped it."""
    if _interrupted.is_set():
        raise KeyboardInterrupt
