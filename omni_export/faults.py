"""Crash points for the kill tests: `OMNI_EXPORT_CRASH_AT=<point>[@n]` ends the process with
os._exit(137) -- no cleanup, no atexit, like a SIGKILL -- the n-th time (default: first) a run
reaches <point>. Unset (the normal case) it does nothing. Points, in run order:

  begin                  the store has written the .incomplete marker
  loaded                 the checkpoint is loaded
  traced                 a component is traced (fp32 references computed)
  lowered                a build's files are in .staging
  commit-before-rename   a file is in the marker's journal, not yet renamed into OUT
  commit-after-rename    a file has been renamed into OUT
  pruned                 files of older builds are removed
  documents              parity.json and report.md are written, manifest.json is not
  manifest               manifest.json is written, the marker is not yet removed
"""
from __future__ import annotations

import os

ENV = "OMNI_EXPORT_CRASH_AT"
POINTS = ("begin", "loaded", "traced", "lowered", "commit-before-rename", "commit-after-rename",
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
