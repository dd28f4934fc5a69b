"""Qwen3-TTS loader: checkpoint -> graphs and their real inputs, for the generic pipeline."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core import Graph, Samples, UsageError
from ...weights import require_regular_file, weight_files
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
    demo_seed: int | None = None

    @property
    def seeds(self) -> dict:
        """Every seed behind this model's data (recorded in the manifest)."""
        given = self.options.get("calibration-codes")
        s = {"heldout_codes": SYNTHETIC_SEED_HELDOUT,
             "calibration_codes": None if given else [SYNTHETIC_SEED_CALIBRATION + i for i in range(4)]}
        if self.demo_seed is not None:
            s["demo_checkpoint"] = self.demo_seed
        return s

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
    if not path.exists():
        raise UsageError(f"--calibration-codes {path} does not exist; pass a .npy of codes [frames, "
                         f"{codebooks}] or a directory of them")
    files = sorted(path.glob("*.npy")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"--calibration-codes {path}: no .npy files in the directory")
    return [_code_sequence(f, codebooks, codebook_size) for f in files]


def _code_sequence(f: Path, codebooks: int, codebook_size: int) -> np.ndarray:
    where = f"--calibration-codes {f}"
    require_regular_file(f, where)
    try:
        a = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"{where}: not a readable .npy ({_first_line(e)}); save codes with numpy.save "
                         f"(pickled object arrays are never loaded)") from None
    if not isinstance(a, np.ndarray):
        a.close()
        raise UsageError(f"{where}: is an .npz archive; pass one .npy per sequence (or a directory of them)")
    if a.ndim != 2 or a.shape[1] != codebooks:
        raise UsageError(f"{where}: expected shape [frames, {codebooks}], got {list(a.shape)}")
    if a.shape[0] < 1:
        raise UsageError(f"{where}: holds no frames (shape {list(a.shape)})")
    if not np.issubdtype(a.dtype, np.integer):
        raise UsageError(f"{where}: codes must be integers in [0, {codebook_size}), got dtype {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= codebook_size:
        raise UsageError(f"{where}: codes must be integers in [0, {codebook_size}), found values in "
                         f"[{lo}, {hi}]")
    return a.astype(np.int32)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def load(checkpoint: Path | None, options: dict, scratch: Path) -> Qwen3TTS:
    """Open a checkpoint (or write the embedded demo one under `scratch`) and load what is needed."""
    left, chunk = options.get("left-context"), options.get("chunk-frames")
    if not (isinstance(left, int) and left >= 0 and isinstance(chunk, int) and chunk >= 1):
        raise UsageError(f"--left-context must be >= 0 and --chunk-frames >= 1 (got {left}, {chunk})")
    if checkpoint is None:
        checkpoint = ck.write_checkpoint(scratch / "demo-checkpoint")
    checkpoint = Path(checkpoint)
    ck.check_root_config(checkpoint)
    demo = ck.demo_label(checkpoint)
    model = Qwen3TTS(checkpoint, demo, dict(options), demo_seed=ck.demo_seed(checkpoint) if demo else None)
    model.speech = ck.load_speech_tokenizer(checkpoint)
    model.info = {
        "path": str(checkpoint.resolve()),
        "label": demo or "user checkpoint",
        "demo": bool(demo),
        "weights": weight_files(checkpoint),
        "config": {"code2wav": model.speech.config.to_json()},
        "options": {"left_context": model.left, "chunk_frames": model.chunk},
    }
    return model
