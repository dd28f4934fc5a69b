"""TinyVoc: checkpoint (config.json + model.safetensors, keys `decoder.*`) -> its graph, real inputs,
and the host loop (a long code sequence decoded chunk by chunk) behind its end-to-end row."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...artifacts.manifest import weight_files
from ...core import Graph, Precision, Samples
from ...modeling.checkpoint import DEMO_MARKER, check_directory, demo_label, read_json
from ...weights import TensorDecl, load_tensors, seeded_tensors, write_safetensors
from .recipe import RECIPE

CONFIG = {"model_type": "tinyvoc", "codebook_size": 64, "hidden_size": 16, "hop_length": 8}


def tensor_table(c: dict) -> dict:
    v, h, k = c["codebook_size"], c["hidden_size"], c["hop_length"]
    return {"decoder.embed.weight": TensorDecl((v, h), ("normal", 1.0)),
            "decoder.conv_in.weight": TensorDecl((h, h, 3), ("normal", 0.2)),
            "decoder.conv_in.bias": TensorDecl((h,), ("zeros",)),
            "decoder.upsample.weight": TensorDecl((h, h, k), ("normal", 0.2)),
            "decoder.upsample.bias": TensorDecl((h,), ("zeros",)),
            "decoder.conv_out.weight": TensorDecl((1, h, 3), ("normal", 0.1)),
            "decoder.conv_out.bias": TensorDecl((1,), ("zeros",))}


def write_checkpoint(directory: Path, seed: int = 0) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    marker = {DEMO_MARKER: {"seed": seed, "label": "demo, random weights"}}
    (directory / "config.json").write_text(json.dumps({**CONFIG, **marker}))
    write_safetensors(directory / "model.safetensors", seeded_tensors(tensor_table(CONFIG), seed))
    return directory


class Vocoder(nn.Module):
    def __init__(self, t: dict, hop: int):
        super().__init__()
        w = {k.removeprefix("decoder."): nn.Parameter(v, requires_grad=False) for k, v in t.items()}
        self.embed = nn.Embedding.from_pretrained(w["embed.weight"])
        self.conv_in, self.conv_out = nn.Conv1d(1, 1, 1), nn.Conv1d(1, 1, 1)
        self.upsample = nn.ConvTranspose1d(1, 1, hop, stride=hop)
        for name in ("conv_in", "upsample", "conv_out"):
            m = getattr(self, name)
            m.weight, m.bias = w[name + ".weight"], w[name + ".bias"]
        self.conv_in.padding = self.conv_out.padding = (1,)

    def forward(self, codes):
        x = torch.tanh(self.conv_in(self.embed(codes.long()).transpose(1, 2)))
        x = torch.tanh(self.upsample(x))
        return torch.clamp(self.conv_out(x), -1.0, 1.0)[:, 0]


@dataclass
class TinyVoc:
    config: dict
    tensors: dict
    options: dict
    info: dict = field(default_factory=dict)
    seeds: dict = field(default_factory=lambda: {"calibration": 1, "heldout": 2})
    capture_cache: dict | None = None       # seeded inputs: nothing to cache

    def sizes(self) -> dict:
        return {"N": int(self.options["frames"]), "Hop": self.config["hop_length"]}

    def components(self) -> tuple[str, ...]:
        return ("vocoder",)

    def graph(self, name: str) -> Graph:
        return RECIPE.graph(name, Vocoder(self.tensors, self.config["hop_length"]).eval(), self.sizes())

    def codes(self, kind: str, count: int, frames: int) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seeds[kind])
        return [rng.integers(0, self.config["codebook_size"], (1, frames), dtype=np.int32) for _ in range(count)]

    def samples(self, name: str, kind: str) -> Samples:
        count = 8 if kind == "calibration" else 4
        codes = self.codes(kind, count, self.sizes()["N"])
        return Samples([{"codes": c} for c in codes], f"seeded codes (seed {self.seeds[kind]}, {count} x N)")

    def synthesize(self, graphs, codes: np.ndarray) -> np.ndarray:
        """The host loop: N codes per call, the chunks' waveforms joined."""
        n = self.sizes()["N"]
        return np.concatenate([graphs("vocoder", {"codes": codes[:, i:i + n]})["wav"]
                               for i in range(0, codes.shape[1], n)], axis=1)


def load(checkpoint: Path | None, options: dict, scratch: Path) -> TinyVoc:
    options = {**{o.name: o.default for o in RECIPE.options}, **{k: v for k, v in options.items() if v is not None}}
    checkpoint = Path(checkpoint) if checkpoint else write_checkpoint(Path(scratch) / "demo-checkpoint")
    check_directory(checkpoint, "config.json and model.safetensors")
    config = read_json(checkpoint / "config.json", "model config")
    tensors = load_tensors(checkpoint / "model.safetensors", tensor_table(config))
    model = TinyVoc(config, dict(tensors), options)
    label = demo_label(checkpoint)
    model.info = {"path": str(checkpoint.resolve()), "label": label or "user checkpoint", "demo": label is not None,
                  "weights": weight_files(checkpoint), "config": {k: config[k] for k in CONFIG}}
    return model


def end_to_end(model: TinyVoc, out: Path, manifest: dict, runners: dict, progress) -> list[dict]:
    """Per runner and precision: four held-out utterances of 4 x N codes through the accepted vocoder
    build, chunk by chunk, scored in dB against the same loop over the fp32 module."""
    from ...parity.metrics import snr
    from ...runtime.graphs import BuildGraphs, EagerGraphs, placed_build

    utterances = model.codes("heldout", 4, 4 * model.sizes()["N"])
    reference = [model.synthesize(EagerGraphs(model), c) for c in utterances]
    rows = []
    for runner, precisions in runners.items():
        for prec in precisions:
            row = {"runner": runner, "precision": prec, "utterances": len(utterances)}
            if placed_build(manifest, "vocoder", runner, prec, True) is None:
                rows.append({**row, "verdict": "skipped", "reason": "no accepted vocoder build"})
                continue
            built = BuildGraphs(out, runner, prec, manifest=manifest)
            try:
                wavs = [model.synthesize(built, c) for c in utterances]
            finally:
                built.close()
            db = min(snr(r, w) for r, w in zip(reference, wavs))
            gate = RECIPE.component("vocoder").gate_db(Precision(prec))
            ok = db >= gate
            rows.append({**row, "wav_snr_db": round(db, 3), "threshold": gate, "verdict": "accepted" if ok else "rejected",
                         "reason": f"chunked waveform {db:.1f} dB vs fp32 {'>=' if ok else '<'} {gate:.0f} dB"})
    return rows
