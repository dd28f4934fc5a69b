"""Code2Wav's chunk shapes (--chunk-schedule) in one QNN context binary with shared weights, against one
context binary per shape: bytes on disk, and whether the HTP simulator loads the shared one.

    .venv/bin/python benchmarks/shared_context.py OUT WORK

OUT: a build with fp16 ONNX builds of code2wav and its shapes (code2wav_n<size>); WORK: a scratch
directory. The shared binary is ONNX Runtime's EP-context sharing (`ep.share_ep_contexts` on every
compile session, `ep.stop_share_ep_contexts` on the last): one *_qnn.bin, one EPContext wrapper per
shape. Each model is compiled from its path (ONNX Runtime names the QNN graph after it: compiled from
bytes, the shapes' graphs collide and the compose fails). Prints one JSON line; docs/streaming.md
has the figures.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path, work: Path) -> dict:
    from omni_export import qnn_ep

    srcs = sorted(out.glob("qwen3-tts-code2wav*-fp16-*.onnx"))
    srcs = [s for s in srcs if not s.name.endswith(".ctx.onnx")]
    if len(srcs) < 2:
        raise SystemExit(f"{out}: fewer than two fp16 Code2Wav ONNX builds (build with --chunk-schedule)")
    opts = qnn_ep.provider_options("69", "79", fp16=True, finalize="1")
    shared, alone = work / "shared", work / "alone"
    for i, s in enumerate(srcs):
        cfg = {"ep.context_enable": "1", "ep.context_embed_mode": "0", "ep.share_ep_contexts": "1",
               "ep.context_file_path": str(shared / f"{s.stem}.ctx.onnx"),
               **({"ep.stop_share_ep_contexts": "1"} if i == len(srcs) - 1 else {})}
        shared.mkdir(parents=True, exist_ok=True)
        del_ = qnn_ep.session(s, opts, cfg)
        del del_
        qnn_ep.compile_context(s, alone / f"{s.stem}.ctx.onnx", opts)
    size = {d.name: {b.name: b.stat().st_size for b in sorted(d.glob("*.bin"))} for d in (shared, alone)}
    try:
        qnn_ep.session(shared / f"{srcs[0].stem}.ctx.onnx", opts, {"ep.share_ep_contexts": "1"})
        loads = "yes"
    except Exception as e:          # noqa: BLE001 -- the finding is the message
        loads = str(e).splitlines()[0][:300]
    return {"graphs": [s.stem for s in srcs], "bytes": size,
            "shared_total": sum(size["shared"].values()), "alone_total": sum(size["alone"].values()),
            "simulator_loads_shared": loads}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
