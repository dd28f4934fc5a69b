"""Time to first audio and real-time factor of `synth` per --chunk-schedule, on this machine's wall clock.

    .venv/bin/python benchmarks/streaming.py [--build OUT --runner ort|htp] [--passes 3] [--frames 24]
        [--schedules none,2,1] [--out results.json]

Without --build: the demo checkpoint's fp32 modules (eager), the schedule given as a recipe option.
With --build: that build's graphs on the runner (the build's schedule; --schedules is ignored).
Arms rotate on every pass; min / median / max over passes. One JSON document with provenance.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = "Hello there, this is a streaming test of the talker."


def one(schedule: str | None, build: str | None, runner: str, frames: int) -> dict:
    from omni_export.recipes.qwen3_tts import model as M, synth

    kw = {"text": TEXT, "greedy": True, "max_frames": frames, "runner": runner, "build": build, "seed": 0}
    with tempfile.TemporaryDirectory(prefix="streaming-bench-") as scratch:
        if build:
            opts, ckpt = synth._options_and_checkpoint(Path(build), None)
        else:
            opts, ckpt = {"chunk-schedule": schedule}, None
        model = M.load(Path(ckpt) if ckpt else None, opts, Path(scratch))
        s = synth._run(model, Path(build) if build else None, kw, "demo")
    lat = s["latency"]
    return {"ttfa_ms": s["ttfa_ms"], "first_audio_after_frames": s["first_audio_after_frames"], "rtf": s["rtf"],
            "frames": s["frames"], "per_frame_ms": lat["per_frame_ms"],
            "chunks": [(c["graph"], c["frames"], c["ms"]) for c in lat["chunks"]], "timed_on": lat["timed_on"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--runner", default="ort")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--schedules", default="none,2,1")
    ap.add_argument("--out")
    a = ap.parse_args()
    arms = [None] if a.build else a.schedules.split(",")
    runs: dict = {str(x): [] for x in arms}
    load = [os.getloadavg()[0]]
    for p in range(a.passes):
        for x in arms[p % len(arms):] + arms[:p % len(arms)]:          # rotate the arm order
            runs[str(x)].append(one(x, a.build, a.runner, a.frames))
    load.append(os.getloadavg()[0])

    def spread(key, rs):
        v = sorted(r[key] for r in rs if r[key] is not None)
        return {"min": v[0], "median": statistics.median(v), "max": v[-1]} if v else None

    doc = {"git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "dirty": bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                        text=True).stdout.strip()),
           "graphs": f"{a.build} on {a.runner}" if a.build else "demo checkpoint, fp32 eager", "frames": a.frames,
           "text": TEXT, "passes": a.passes, "load_average": {"start": load[0], "end": load[1]},
           "clock": "wall clock of this machine (time.perf_counter), sessions opened before the clock",
           "arms": {x: {"ttfa_ms": spread("ttfa_ms", rs), "rtf": spread("rtf", rs),
                        "first_audio_after_frames": rs[0]["first_audio_after_frames"], "runs": rs}
                    for x, rs in runs.items()}}
    text = json.dumps(doc, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    t = time.time()
    main()
    print(f"# {time.time() - t:.0f} s", file=sys.stderr)
