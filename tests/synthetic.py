"""Small synthetic manifests in the real layout (they validate against manifest.schema.json), for
testing the reports and the report / parity / diff commands without building a model."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from omni_export.artifacts.samples import keep_audio

RATE = 24000
SHA = "ab" * 32
RUNNERS = {
    "onnx": {"kind": "ort-cpu", "short": "ort-cpu", "label": "ONNX Runtime CPU", "options": {}},
    "ctx": {"kind": "qnn-htp", "short": "htp-sim", "label": "QNN HTP simulator (soc_model 69, v79, quantized)",
            "options": {"soc_model": "69"}},
    "pte": {"kind": "executorch", "short": "executorch", "label": "ExecuTorch runtime (XNNPACK)", "options": {}},
}


def build(fmt: str, prec: str, snr, gate: float, *, finite: bool = True, error: str | None = None,
          component: str = "code2wav") -> dict:
    """One manifest build entry; the verdict follows the gate as the pipeline's judge() would."""
    name = f"qwen3-tts-{component}-{prec}-s25-htp"
    if error:
        return {"name": name, "component": component, "format": fmt, "precision": prec, "target": "s25-htp",
                "status": "rejected", "files": [], "error": error,
                "parity": {"runner": None, "threshold_db": gate, "verdict": "rejected", "reason": error,
                           "outputs": []}, "details": {}, "timings": {"lower_s": 0.1}}
    ok = finite and isinstance(snr, (int, float)) and snr >= gate
    status = "accepted" if ok else "rejected"
    reason = (f"min {snr:.1f} dB >= gate {gate:.0f} dB" if ok else
              "output 'wav' has NaN/Inf" if not finite else f"output 'wav' {snr:.1f} dB < gate {gate:.0f} dB")
    path = ("" if ok else "rejected/") + f"{name}.{fmt}"
    score = {"name": "wav", "snr_db": snr if finite else "-inf", "psnr_db": (snr + 15) if finite else "-inf",
             "max_abs_err": 0.01, "finite": finite}
    return {"name": name, "component": component, "format": fmt, "precision": prec, "target": "s25-htp",
            "status": status, "files": [{"path": path, "sha256": SHA, "bytes": 1_500_000}],
            "parity": {"runner": RUNNERS[fmt], "threshold_db": gate, "verdict": status, "reason": reason,
                       "outputs": [score]},
            "details": {}, "timings": {"lower_s": 1.0, "run_wait_s": 2.0}}


def manifest(builds: list[dict], attribution: dict | None = None) -> dict:
    comps = sorted({b["component"] for b in builds})
    m = {
        "schema_version": 1, "tool": "omni-export", "created": "2026-01-01T00:00:00Z",
        "recipe": {"name": "qwen3-tts", "version": "1", "doc": "Qwen3-TTS 12Hz"},
        "checkpoint": {"path": "/ckpt/demo", "label": "demo, random weights", "demo": True,
                       "weights": [{"path": "speech_tokenizer/model.safetensors", "sha256": SHA, "bytes": 10}]},
        "target": {"name": "s25-htp", "device": "Samsung Galaxy S25", "soc": "SM8750", "soc_model": "69",
                   "htp_arch": "79"},
        "options": {"gates_db": {}, "recipe_options": {"left-context": 2}, "rewrites": ["pow_mul"]},
        "toolchain": {"omni-export": "0.1.0", "omni-export-git": "0123456789abcdef0123456789abcdef01234567",
                      "torch": "2.13.0", "executorch": "1.5.1", "onnx": "1.23.2", "onnxruntime": "1.32.0",
                      "onnxruntime-qnn": "2.7.0", "qnn": "2.51.0", "qai-hub": None, "python": "3.11.7"},
        "host": {"hostname": "ci-host", "platform": "Linux", "machine": "x86_64", "cpus": 2},
        "components": {c: _component(attribution or {}) for c in comps},
        "builds": builds, "skipped": [], "timings": {"total_s": 12.0},
    }
    return resummarize(m)


def _component(attribution: dict) -> dict:
    tensor = {"name": "wav", "shape": [1, 1, 7680], "dtype": "float32"}
    data = {"source": "synthetic", "count": 2, "sha256": SHA}
    return {"accepted": False, "inputs": [], "outputs": [tensor], "calibration": data, "heldout": dict(data),
            "rewrites": [], "attribution": copy.deepcopy(attribution), "gated_outputs": [], "samples": [],
            "timings": {}}


def resummarize(m: dict) -> dict:
    for c, info in m["components"].items():
        info["accepted"] = any(b["component"] == c and b["status"] == "accepted" for b in m["builds"])
    m["summary"] = {"accepted": sum(b["status"] == "accepted" for b in m["builds"]),
                    "rejected": sum(b["status"] == "rejected" for b in m["builds"]),
                    "components_without_accepted_build": sorted(c for c, i in m["components"].items()
                                                                if not i["accepted"])}
    return m


def demo_like() -> dict:
    """The shape of the demo build: 4 formats x fp16/w8a16, the int8 ones rejected, attribution."""
    att = {p: [{"block": b, "snr_db": s, "runner": "QNN HTP simulator", "finite": True}
               for b, s in (("rvq", 70.0 - d), ("pre_conv", 60.0 - d), ("decoder.out", 55.0 - d))]
           for p, d in (("fp16", 0.0), ("w8a16", 20.0))}
    builds = [build(f, "fp16", s, 40.0) for f, s in (("onnx", 52.5), ("ctx", 44.3), ("pte", 48.2))]
    builds += [build(f, "w8a16", s, 30.0) for f, s in (("onnx", 24.5), ("ctx", 25.3), ("pte", 25.7))]
    return manifest(builds, att)


def add_audio(root: Path, m: dict, seed: int = 0) -> dict:
    """Real WAVs under root/samples via the pipeline's own keep_audio: an fp32 clip, and per scored
    build the clip plus noise at the build's recorded SNR."""
    rng = np.random.default_rng(seed)
    t = np.arange(7680) / RATE
    ref = (0.4 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)).astype(np.float32)
    audio = {"wav": RATE}
    for c, info in m["components"].items():
        info["samples"] = keep_audio(root, f"{c}-fp32", [{"wav": ref[None, None]}], audio)
    for b in m["builds"]:
        out = b["parity"]["outputs"]
        if not out:
            continue
        snr = out[0]["snr_db"]
        noise = rng.standard_normal(ref.size).astype(np.float32)
        if isinstance(snr, (int, float)):
            noise *= np.sqrt(np.sum(ref ** 2) / np.sum(noise ** 2) / 10 ** (snr / 10))
        clip = ref + noise if out[0]["finite"] else np.full_like(ref, np.nan)
        b["samples"] = keep_audio(root, f"{b['component']}-{b['format']}-{b['precision']}",
                                  [{"wav": clip[None, None]}], audio)
    return m


def write_run(root: Path, m: dict, audio: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if audio:
        add_audio(root, m)
    (root / "manifest.json").write_text(json.dumps(m, indent=2))
    return root


def stub_run(root: Path, gate_db: float = 30.0):
    """What jobs.component.ComponentJobs reads of a build run, without one: the demo recipe on s25-htp
    writing under `root`, one gate for every component and precision, progress lines dropped."""
    from omni_export.pipeline import RunOptions
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    class Run:
        opts = RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), root)
        store = type("S", (), {"root": root})()
        progress = type("P", (), {"job_finished": lambda self, label, note: None})()

        def gate(self, component, precision):
            return gate_db

    return Run()
