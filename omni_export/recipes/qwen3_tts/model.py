"""Qwen3-TTS loader: checkpoint -> graphs and their real inputs, for the generic pipeline."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core import Graph, Samples, UsageError
from . import checkpoint as ck
from . import host
from .recipe import RECIPE

CALIBRATION_WINDOWS = 16
SYNTHETIC_SEED_CALIBRATION = 1000
SYNTHETIC_SEED_HELDOUT = 2000


@dataclass
class Qwen3TTS:
    path: Path
    demo: str | None
    options: dict
    speech: ck.SpeechTokenizer | None = None
    info: dict = field(default_factory=dict)

    # ---- geometry
    @property
    def left(self) -> int:
        return int(self.options["left-context"])

    @property
    def chunk(self) -> int:
        return int(self.options["chunk-frames"])

    def sizes(self) -> dict:
        c = self.speech.config
        return {"Q": c.num_quantizers, "L": self.left, "N": self.chunk, "S": c.samples_per_frame}

    # ---- the pipeline's interface
    def graph(self, component: str) -> Graph:
        comp = RECIPE.component(component)
        sizes = self.sizes()
        if component == "code2wav":
            from .modules import build_code2wav

            module = build_code2wav(self.speech.config, self.speech.tensors, self.left + self.chunk)
        else:  # pragma: no cover - every declared component is handled above
            raise UsageError(f"component {component} is not built by this loader")
        return Graph(component, module, tuple(s.resolve(sizes) for s in comp.inputs),
                     tuple(s.resolve(sizes) for s in comp.outputs))

    def samples(self, component: str, kind: str) -> Samples:
        if component == "code2wav":
            return self._code2wav_samples(kind)
        raise UsageError(f"no {kind} inputs for component {component}")  # pragma: no cover

    # ---- Code2Wav inputs: chunk windows over code sequences, as the host streams them
    def _code2wav_samples(self, kind: str) -> Samples:
        c = self.speech.config
        spf = c.samples_per_frame
        if kind == "heldout":
            # One held-out sequence: its first chunk (no left context: mostly masked) and a chunk
            # with the full L frames of context. Seeds differ from every calibration seed.
            codes = host.synthetic_codes(self.left + 2 * self.chunk, c.num_quantizers, c.codebook_size,
                                         SYNTHETIC_SEED_HELDOUT)
            wins = list(host.windows(codes, self.left, self.chunk, spf))
            chosen = [wins[0], next(w for w in wins if w.frame_mask.all())] if len(wins) > 1 else wins
            return Samples([w.inputs() for w in chosen],
                           f"synthetic code sequence (seed {SYNTHETIC_SEED_HELDOUT}): first chunk "
                           f"(no context) and a full-context chunk")
        seqs, source = self._calibration_sequences()
        wins = [w for s in seqs for w in host.windows(s, self.left, self.chunk, spf)]
        if len(wins) > CALIBRATION_WINDOWS:
            idx = np.linspace(0, len(wins) - 1, CALIBRATION_WINDOWS).round().astype(int)
            wins = [wins[i] for i in idx]
        return Samples([w.inputs() for w in wins], source)

    def _calibration_sequences(self) -> tuple[list[np.ndarray], str]:
        c = self.speech.config
        given = self.options.get("calibration-codes")
        if given:
            return load_code_sequences(Path(given), c.num_quantizers, c.codebook_size), f"user codes: {given}"
        frames = self.left + 4 * self.chunk
        seqs = [host.synthetic_codes(frames, c.num_quantizers, c.codebook_size, SYNTHETIC_SEED_CALIBRATION + i)
                for i in range(4)]
        note = ("synthetic code sequences (seeded; demo checkpoint: random weights, any codes are as "
                "real as any other)" if self.demo else
                "synthetic code sequences (seeded) -- not speech: pass --calibration-codes with codes "
                "from real generations for a representative calibration")
        return seqs, note


def load_code_sequences(path: Path, codebooks: int, codebook_size: int) -> list[np.ndarray]:
    files = sorted(path.glob("*.npy")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise UsageError(f"--calibration-codes {path}: no .npy files found")
    seqs = []
    for f in files:
        try:
            a = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise UsageError(f"--calibration-codes {f}: not a readable .npy ({e})") from None
        if a.ndim != 2 or a.shape[1] != codebooks or a.shape[0] < 1:
            raise UsageError(f"--calibration-codes {f}: expected shape [frames, {codebooks}], got {list(a.shape)}")
        if not np.issubdtype(a.dtype, np.integer) or a.min() < 0 or a.max() >= codebook_size:
            raise UsageError(f"--calibration-codes {f}: codes must be integers in [0, {codebook_size})")
        seqs.append(a.astype(np.int32))
    return seqs


def load(checkpoint: Path | None, options: dict, scratch: Path) -> Qwen3TTS:
    """Open a checkpoint (or write the embedded demo one under `scratch`) and load what is needed."""
    from ...artifacts.store import sha256_file

    if checkpoint is None:
        checkpoint = ck.write_checkpoint(scratch / "demo-checkpoint")
    checkpoint = Path(checkpoint)
    ck.check_root_config(checkpoint)
    demo = ck.demo_label(checkpoint)
    model = Qwen3TTS(checkpoint, demo, dict(options))
    model.speech = ck.load_speech_tokenizer(checkpoint)
    if model.left < 0 or model.chunk < 1:
        raise UsageError("--left-context must be >= 0 and --chunk-frames >= 1")
    files = sorted(p for p in checkpoint.rglob("*.safetensors"))
    model.info = {
        "path": str(checkpoint.resolve()),
        "label": demo or "user checkpoint",
        "demo": bool(demo),
        "weights": [{"path": str(p.relative_to(checkpoint)), "sha256": sha256_file(p),
                     "bytes": p.stat().st_size} for p in files],
        "config": {"code2wav": model.speech.config.to_json()},
        "options": {"left_context": model.left, "chunk_frames": model.chunk},
    }
    return model
