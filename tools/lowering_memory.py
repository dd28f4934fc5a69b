"""Where lowering one Qwen3-TTS graph spends memory: RssAnon of this process sampled every 50 ms
around each step (load, capture, trace, HTP rewrites, ONNX fp32, ONNX fp16; with --quantize the
w8a16 QDQ ONNX, with --compile DLC / context builds), peak above the step's start and what stays
after, and the peak summed over the process tree (children that compile in isolation).
Attribution for issue 5, not a benchmark (no provenance block; the build benchmark in
benchmarks/ is the measured record).

    .venv/bin/python tools/lowering_memory.py --size 0.6b --graph talker_decode
    .venv/bin/python tools/lowering_memory.py --size 0.6b --graph talker_decode --quantize \
        --compile dlc:fp16,ctx:fp16,ctx:w8a16
"""
from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_anon_gib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) / 2 ** 20
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="0.6b", choices=("tiny", "0.6b", "1.7b"))
    ap.add_argument("--graph", default="talker_decode")
    ap.add_argument("--target", default="s25-htp")
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / ".work" / "lowering-memory"))
    ap.add_argument("--quantize", action="store_true", help="also the w8a16 QDQ ONNX")
    ap.add_argument("--compile", default="", help="builds to lower too, e.g. dlc:fp16,ctx:fp16,ctx:w8a16")
    a = ap.parse_args()
    a.compile = [c for c in a.compile.split(",") if c]

    import os

    from benchmarks.proctree import rss_anon_bytes, tree

    peak, tree_peak = [0.0], [0.0]

    def sample():
        while True:
            peak[0] = max(peak[0], rss_anon_gib())
            total = sum(rss_anon_bytes(p) or 0 for p in tree(os.getpid()))
            tree_peak[0] = max(tree_peak[0], total / 2 ** 30)
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()

    def step(name, f):
        peak[0] = tree_peak[0] = before = rss_anon_gib()
        t = time.monotonic()
        r = f()
        time.sleep(0.1)
        after = rss_anon_gib()
        import gc
        import ctypes

        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(f"{name:28s} start {before:6.2f}  peak {peak[0]:6.2f}  after {after:6.2f} GiB"
              f"  (after gc + malloc_trim {rss_anon_gib():6.2f})"
              f"  (tree peak {tree_peak[0]:6.2f})  {time.monotonic() - t:6.1f} s", flush=True)
        return r

    from benchmarks.runtime import capture_inputs, load_model
    from omni_export.core import BuildSpec, Format, Precision, Samples
    from omni_export.exporters.lower import Lowering
    from omni_export.targets import get_target
    from omni_export.trace import trace

    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        model, _ = step("load", lambda: load_model(a.size, work, {}))
        eager, calls = step("capture 2 frames", lambda: capture_inputs(model, 2))
        g = eager.graph(a.graph)
        traced = step("trace", lambda: trace(g, None, Samples(calls[a.graph][:2], "2 captured calls")))
        target = get_target(a.target)
        low = Lowering(traced, target, work / "lowering", rewrites=target.rewrites)
        step("program + rewrites", low.program)
        step("onnx fp32", lambda: low.onnx(Precision.FP32))
        step("onnx fp16", lambda: low.onnx(Precision.FP16))
        if a.quantize:
            traced.calibration = traced.heldout[:1]      # shape only: a memory probe, not a build
            step("onnx w8a16 (QDQ)", lambda: low.onnx(Precision.W8A16))
        for fmt in a.compile:
            spec = BuildSpec("qwen3-tts", a.graph, Format(fmt.split(":")[0]), Precision(fmt.split(":")[1]), a.target)
            step(f"{fmt}", lambda: low.build(spec, work / "staging" / fmt.replace(":", "-")))
        for p in sorted((work / "lowering").rglob("*.onnx*")):
            print(f"{p.name}: {p.stat().st_size >> 20} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
