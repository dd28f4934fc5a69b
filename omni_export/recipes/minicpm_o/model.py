"""MiniCPM-o TTS-head loader: checkpoint -> graphs and their real inputs, for the generic pipeline.

Real inputs come from running the fp32 pipeline: utterances (LLM hidden states + spoken token ids)
go through tts_condition, tts_prefill and the tts_decode loop, and every graph call is captured.
Calibration utterances are sampled (seeded); held-out utterances are generated greedily from other
seeds and only ever used for parity. The utterances are the user's real LLM hidden states
(--calibration-hidden) or, by default, seeded synthetic ones: Gaussian with per-channel scales
drawn log-normally and a few large channels, the shape of an LLM's last hidden states.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ...artifacts.manifest import weight_files
from ...core import Graph, Samples, UsageError
from . import checkpoint as ck
from . import host
from .recipe import RECIPE

CALIBRATION_UTTERANCES, HELDOUT_UTTERANCES = 4, 2
CALIBRATION_CODES, HELDOUT_CODES = 24, 24
UTTERANCE_TOKENS = (20, 37, 13, 28)      # spoken tokens per synthetic utterance (cycled)
CALIBRATION_SEED, HELDOUT_SEED = 1000, 2000
CALIBRATION_PER_GRAPH, HELDOUT_PER_GRAPH = 16, 8


@dataclass
class Utterance:
    hidden: np.ndarray        # [T, llm_dim] float32
    ids: np.ndarray           # [T] int64
    name: str


@dataclass
class MiniCPMO:
    path: Path
    options: dict
    cfg: ck.TTSConfig
    tensors: dict
    info: dict = field(default_factory=dict)
    _samples: dict | None = None
    capture_cache: dict | None = None       # its inputs are captured at load, never cached
    demo_seed: int | None = None

    @property
    def seeds(self) -> dict:
        s = {"calibration_utterances": [CALIBRATION_SEED + i for i in range(CALIBRATION_UTTERANCES)],
             "heldout_utterances": [HELDOUT_SEED + i for i in range(HELDOUT_UTTERANCES)],
             "heldout_generations": "greedy"}
        if self.demo_seed is not None:
            s["demo_checkpoint"] = self.demo_seed
        return s

    dit: object = None                 # (DiTConfig, tensors) when the token2wav flow is present
    dit_path: Path | None = None
    encoder: object = None             # (EncoderConfig, tensors) when the flow has its encoder
    hift: object = None                # (HiFTConfig, tensors) when token2wav's hift.safetensors is present

    def sizes(self) -> dict:
        c = self.cfg
        h = self.hift[0] if self.hift else None
        return {"Up": h.upsample if h else 480, "Hop": h.hop if h else 4, "NFFT": h.n_fft if h else 16,
                "Bins": h.bins if h else 9, "Mel": self.dit[0].mels if self.dit else 80, "M": int(self.options["mel-frames"]), "N": int(self.options["flow-tokens"]), "H": c.hidden_size, "Hl": c.llm_dim, "L": c.num_hidden_layers, "KV": c.num_key_value_heads,
                "HD": c.head_dim, "V": c.num_audio_tokens, "P": int(self.options["prefill-tokens"]),
                "C": int(self.options["context-length"])}

    def components(self) -> tuple[str, ...]:
        """The TTS head always; dit_step / flow_encoder_chunk / hift_f0 + hift when token2wav has them."""
        vocoder = self.hift is not None
        have = {"dit_step": self.dit is not None, "flow_encoder_chunk": self.encoder is not None,
                "hift_f0": vocoder, "hift": vocoder}
        return tuple(c.name for c in RECIPE.components if have.get(c.name, True))

    @cached_property
    def tables(self) -> host.Tables:
        return host.Tables(self.tensors["tts.emb_text.weight"].numpy(), self.tensors["tts.emb_code.0.weight"].numpy())

    @cached_property
    def rope(self) -> tuple[np.ndarray, np.ndarray]:
        from ...modeling.rope import rope_table

        cos, sin = rope_table(int(self.options["context-length"]), self.cfg.head_dim, self.cfg.rope_theta)
        return cos.numpy(), sin.numpy()

    @cached_property
    def _backbone(self):
        from .modules import Backbone

        return Backbone(self.cfg, self.tensors).eval()

    # ---- the pipeline's interface
    def graph(self, component: str) -> Graph:
        return RECIPE.graph(component, self._module(component).eval(), self.sizes())

    def _module(self, component: str):
        from . import modules as m

        if component == "tts_condition":
            return m.Condition(self.cfg, self.tensors)
        if component == "flow_encoder_chunk":
            if self.encoder is None:
                raise UsageError("this checkpoint's token2wav flow has no encoder tensors (encoder.*, input_embedding)")
            from .flow_encoder import flow_encoder

            return flow_encoder(*self.encoder, int(self.options["flow-tokens"]))
        if component == "dit_step":
            if self.dit is None:
                raise UsageError("this checkpoint has no token2wav flow: pass --token2wav DIR (with flow.safetensors)")
            from .dit import dit_step

            return dit_step(*self.dit)
        if component in ("hift_f0", "hift"):
            if self.hift is None:
                raise UsageError("this checkpoint has no token2wav HiFT vocoder (hift.safetensors)")
            from . import hift

            return getattr(hift, component)(*self.hift)
        return m.tts_step(self.cfg, self.tensors, self._backbone)

    def samples(self, component: str, kind: str) -> Samples:
        if self._samples is None:
            self._samples = self._capture()
        inputs, source = self._samples[kind].get(component, ([], ""))
        return Samples(inputs, source)

    # ---- the fp32 pipeline
    def gen_options(self, **kw) -> host.GenOptions:
        c = self.cfg
        base = dict(prefill_tokens=int(self.options["prefill-tokens"]), context=int(self.options["context-length"]),
                    temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, repetition_penalty=c.repetition_penalty)
        return host.GenOptions(**{**base, **kw})

    def condition(self, graphs, utt: Utterance) -> np.ndarray:
        return host.condition(graphs, self.tables, self.cfg, utt.hidden, utt.ids, int(self.options["prefill-tokens"]))

    def synthesize(self, graphs, utt: Utterance, opts: host.GenOptions) -> host.Generation:
        cos, sin = self.rope
        return host.generate(graphs, self.cfg, self.tables, self.condition(graphs, utt), opts, cos, sin)

    def teacher_forced(self, graphs, utt: Utterance, ref: np.ndarray, opts: host.GenOptions):
        cos, sin = self.rope
        return host.teacher_forced(graphs, self.cfg, self.tables, self.condition(graphs, utt), ref, opts, cos, sin)

    def flow(self, graphs, inputs: dict) -> np.ndarray:
        from .token2wav import solve

        return solve(graphs, steps=int(self.options["flow-steps"]), **inputs)

    def encode(self, graphs, codes: np.ndarray) -> np.ndarray:
        """Speech codes -> mu [1, 80, 2 n] through flow_encoder_chunk in windows of N tokens. Each window
        is encoded on its own (no context across windows): exact for utterances up to N tokens."""
        n = int(self.options["flow-tokens"])
        codes = np.asarray(codes, np.int64)
        out = []
        for s in range(0, max(len(codes), 1), n):
            part = codes[s:s + n]
            tokens = np.zeros((1, n), np.int32)
            mask = np.zeros((1, n), np.float32)
            tokens[0, :len(part)], mask[0, :len(part)] = part, 1.0
            out.append(graphs("flow_encoder_chunk", {"tokens": tokens, "token_mask": mask})["mu"][..., :2 * len(part)])
        return np.concatenate(out, axis=-1)

    def token2wav_mel(self, graphs, codes: np.ndarray, seed: int) -> np.ndarray:
        """Codes -> mel [1, 80, 2 n] through flow_encoder_chunk and the dit_step solver. No voice prompt:
        cond is zeros and the speaker vector is a seeded stand-in for campplus' projected embedding;
        the noise is seeded. Codes beyond --mel-frames / 2 are dropped (one DiT window)."""
        m = int(self.options["mel-frames"])
        codes = np.minimum(np.asarray(codes, np.int64), self.encoder[0].vocab - 1)[: m // 2]
        mu = self.encode(graphs, codes)
        n = mu.shape[-1]
        rng = np.random.default_rng(seed)
        mels = self.dit[0].mels
        inputs = {"noise": rng.standard_normal((1, mels, m)).astype(np.float32),
                  "mu": np.zeros((1, mels, m), np.float32), "cond": np.zeros((1, mels, m), np.float32),
                  "spks": (0.3 * rng.standard_normal((1, mels))).astype(np.float32),
                  "mask": np.zeros((1, 1, m), np.float32)}
        inputs["mu"][..., :n], inputs["mask"][..., :n] = mu, 1.0
        return self.flow(graphs, inputs)[..., :n]

    def vocode(self, graphs, mel: np.ndarray, seed: int, f0_graphs=None) -> np.ndarray:
        """mel [1, 80, n] (n <= --mel-frames) -> 24 kHz waveform [480 n] through hift_f0, the host NSF source,
        hift and the host iSTFT. The window is padded to --mel-frames by repeating the last frame; the
        source noise is seeded."""
        from .vocoder import waveform

        cfg, t = self.hift
        m, n = int(self.options["mel-frames"]), mel.shape[-1]
        padded = np.pad(mel[..., :m], ((0, 0), (0, 0), (0, max(m - n, 0))), mode="edge")
        return waveform(graphs, padded, t["m_source.l_linear.weight"].numpy(), t["m_source.l_linear.bias"].numpy(),
                        cfg, seed, frames=min(n, m), f0_graphs=f0_graphs)

    def heldout_flow_inputs(self) -> list[dict]:
        """The held-out flow-matching inputs (the same seeds the held-out dit_step samples came from)."""
        return [synthetic_flow_inputs(self.dit[0].mels, int(self.options["mel-frames"]), HELDOUT_SEED + 50, pad=True)]

    def utterances(self, which: str) -> list[Utterance]:
        if which == "calibration" and self.options.get("calibration-hidden"):
            return load_utterances(Path(self.options["calibration-hidden"]), self.cfg)
        n, seed = (CALIBRATION_UTTERANCES, CALIBRATION_SEED) if which == "calibration" else \
            (HELDOUT_UTTERANCES, HELDOUT_SEED)
        return [synthetic_utterance(self.cfg, seed + i, UTTERANCE_TOKENS[i % len(UTTERANCE_TOKENS)])
                for i in range(n)]

    def _capture(self) -> dict:
        import torch

        threads = torch.get_num_threads()
        if self.cfg.hidden_size <= 256:      # tiny graphs: thread hand-offs cost more than they save
            torch.set_num_threads(1)
        try:
            return self._capture_all()
        finally:
            torch.set_num_threads(threads)

    def _capture_all(self) -> dict:
        from ...artifacts.manifest import hash_arrays
        from ...runtime.graphs import Capture, EagerGraphs

        eager = EagerGraphs(self)
        result = {}
        for which in ("calibration", "heldout"):
            cap = Capture(eager)
            held = which == "heldout"
            for i, utt in enumerate(self.utterances(which)):
                opts = self.gen_options(greedy=held, seed=(HELDOUT_SEED if held else CALIBRATION_SEED) + i,
                                        max_codes=HELDOUT_CODES if held else CALIBRATION_CODES,
                                        min_new_tokens=HELDOUT_CODES if held else CALIBRATION_CODES)
                gen = self.synthesize(cap, utt, opts)
                if self.encoder is not None and self.dit is not None and len(gen.codes):
                    seed = (HELDOUT_SEED if held else CALIBRATION_SEED) + 70 + i
                    mel = self.token2wav_mel(cap, gen.codes, seed)
                    if self.hift is not None:
                        self.vocode(cap, mel, seed)
            if self.dit is not None and self.encoder is None:     # a flow without its encoder: synthetic mu
                flows = self.heldout_flow_inputs() if held else [
                    synthetic_flow_inputs(self.dit[0].mels, int(self.options["mel-frames"]), CALIBRATION_SEED + 50 + i)
                    for i in range(2)]
                for f in flows:
                    self.flow(cap, f)
            if held:            # identical calls are not held out
                for name, calls in cap.calls.items():
                    seen = {hash_arrays([c]) for c in result["calibration"].get(name, ([], ""))[0]}
                    cap.calls[name] = [c for c in calls if hash_arrays([c]) not in seen]
            src = ("greedy fp32 generations from the held-out synthetic utterances" if held else
                   f"seeded fp32 generations from {self._calibration_source()}")
            limit = HELDOUT_PER_GRAPH if held else CALIBRATION_PER_GRAPH
            result[which] = {name: (_spread(calls, limit), f"{src} ({len(calls)} calls captured)")
                             for name, calls in cap.calls.items()}
        return result

    def _calibration_source(self) -> str:
        given = self.options.get("calibration-hidden")
        return f"the user's LLM hidden states ({given})" if given else "seeded synthetic LLM hidden states"


def _spread(calls: list, limit: int) -> list:
    if len(calls) <= limit:
        return [c for c in calls]
    idx = np.linspace(0, len(calls) - 1, limit).round().astype(int)
    return [calls[i] for i in idx]


def synthetic_flow_inputs(mels: int, frames: int, seed: int, pad: bool = False) -> dict:
    """Seeded stand-ins for the flow encoder's output and a prompt: smooth mel-like mu (log-mel scale,
    slow in time), a prompt mel over the first quarter, a speaker vector, noise; `pad` leaves the last
    eighth of the window as padding."""
    rng = np.random.default_rng(seed)

    def smooth(a: np.ndarray) -> np.ndarray:           # a few passes of a 3-tap average along time
        for _ in range(4):
            a = (np.roll(a, 1, -1) + a + np.roll(a, -1, -1)) / 3.0
        return a

    base = np.linspace(-2.0, -8.0, mels)[:, None]
    mu = (base + 1.5 * smooth(rng.standard_normal((mels, frames))))[None].astype(np.float32)
    cond = np.zeros_like(mu)
    n = frames // 4
    cond[..., :n] = base + 1.5 * smooth(rng.standard_normal((mels, n)))
    mask = np.ones((1, 1, frames), np.float32)
    if pad:
        mask[..., frames - frames // 8:] = 0.0
        mu[..., frames - frames // 8:] = 0.0
    return {"noise": rng.standard_normal((1, mels, frames)).astype(np.float32), "mu": mu,
            "spks": (0.3 * rng.standard_normal((1, mels))).astype(np.float32), "cond": cond, "mask": mask}


def synthetic_utterance(cfg: ck.TTSConfig, seed: int, tokens: int) -> Utterance:
    """Seeded stand-in for an LLM's last hidden states: per-channel log-normal scales, 4 loud channels."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.normal(0.0, 0.5, cfg.llm_dim))
    scale[rng.choice(cfg.llm_dim, 4, replace=False)] *= 20.0
    hidden = (rng.standard_normal((tokens, cfg.llm_dim)) * scale).astype(np.float32)
    ids = rng.integers(0, min(cfg.num_text_tokens, 151643), tokens).astype(np.int64)   # ordinary tokens
    return Utterance(hidden, ids, f"synthetic-{seed}")


def load_utterances(path: Path, cfg: ck.TTSConfig) -> list[Utterance]:
    """A directory of NAME.npy hidden states [T, llm_dim] with NAME.ids.npy [T] (or one NAME.npy file)."""
    flag = "--calibration-hidden"
    if not path.exists():
        raise UsageError(f"{flag} {path} does not exist; pass a directory of NAME.npy [tokens, {cfg.llm_dim}] "
                         f"hidden states, each with NAME.ids.npy")
    files = sorted(f for f in path.glob("*.npy") if not f.name.endswith(".ids.npy")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"{flag} {path}: no NAME.npy hidden-state files")
    return [read_utterance(f, f.with_name(f.name[:-4] + ".ids.npy"), cfg, flag) for f in files]


def read_utterance(hidden_path: Path, ids_path: Path, cfg: ck.TTSConfig, flag: str) -> Utterance:
    hidden = _npy(hidden_path, flag)
    if hidden.ndim != 2 or hidden.shape[1] != cfg.llm_dim or hidden.shape[0] < 1:
        raise UsageError(f"{flag} {hidden_path}: expected LLM hidden states [tokens, {cfg.llm_dim}], got "
                         f"{list(hidden.shape)}")
    if not np.issubdtype(hidden.dtype, np.floating) or not np.isfinite(hidden).all():
        raise UsageError(f"{flag} {hidden_path}: hidden states must be finite floats (dtype {hidden.dtype})")
    if not ids_path.exists():
        raise UsageError(f"{flag}: {hidden_path.name} has no {ids_path.name} beside it (the spoken token ids, "
                         f"[{hidden.shape[0]}] integers)")
    ids = _npy(ids_path, flag).reshape(-1)
    if not np.issubdtype(ids.dtype, np.integer) or len(ids) != len(hidden):
        raise UsageError(f"{flag} {ids_path}: expected {len(hidden)} integer token ids, got {ids.dtype} "
                         f"{list(ids.shape)}")
    if len(ids) and (ids.min() < 0 or ids.max() >= cfg.num_text_tokens):
        raise UsageError(f"{flag} {ids_path}: token ids must be in [0, {cfg.num_text_tokens})")
    return Utterance(hidden.astype(np.float32), ids.astype(np.int64), hidden_path.stem)


def _npy(f: Path, flag: str) -> np.ndarray:
    from ...weights import require_regular_file

    require_regular_file(f, flag)
    try:
        a = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"{flag} {f}: not a readable .npy ({str(e).splitlines()[0][:160]}); save arrays with "
                         f"numpy.save (pickled object arrays are never loaded)") from None
    if not isinstance(a, np.ndarray):
        a.close()
        raise UsageError(f"{flag} {f}: is an .npz archive; pass one .npy per array")
    return a


def _load_token2wav(model: MiniCPMO, checkpoint: Path, options: dict) -> None:
    from . import token2wav as t2w

    given = options.get("token2wav")
    directory = Path(given) if given else checkpoint / "assets" / "token2wav"
    if given and not directory.is_dir():
        raise UsageError(f"--token2wav {directory} is not a directory; pass the token2wav directory holding "
                         f"flow.safetensors")
    path = t2w.flow_path(directory) if directory.is_dir() else None
    if path is None:
        if given:
            raise UsageError(f"--token2wav {directory}: no flow.safetensors (convert flow.pt; pickles are never read)")
        return
    m, steps = options.get("mel-frames"), options.get("flow-steps")
    if not (type(m) is int and m >= 8 and type(steps) is int and 1 <= steps <= 100):
        raise UsageError(f"--mel-frames must be >= 8 and --flow-steps in [1, 100] (got {m}, {steps})")
    n = options.get("flow-tokens")
    if not (type(n) is int and n >= 4):
        raise UsageError(f"--flow-tokens must be >= 4 (the window holds 3 lookahead tokens), got {n}")
    model.dit, model.dit_path = t2w.load_dit(path), path
    model.encoder = t2w.load_encoder(path)
    from .hift import hift_path, load_hift

    hpath = hift_path(directory)
    model.hift = load_hift(hpath) if hpath is not None else None


def load(checkpoint: Path | None, options: dict, scratch: Path) -> MiniCPMO:
    """Open a checkpoint (or write the tiny demo one under `scratch`). Options not given take defaults."""
    options = {**{o.name: o.default for o in RECIPE.options}, **options}
    p, c = options.get("prefill-tokens"), options.get("context-length")
    if not (type(p) is int and type(c) is int and 1 <= p <= c):
        raise UsageError(f"--prefill-tokens must be >= 1 and <= --context-length (got {p}, {c})")
    if not (type(options.get("e2e-codes")) is int and options["e2e-codes"] >= 0):
        raise UsageError(f"--e2e-codes must be >= 0 (got {options.get('e2e-codes')}); 0 skips end-to-end parity")
    if options.get("random-weights"):
        checkpoint = ck.write_real_shape(scratch / "random-minicpm-o-4.5")
    elif checkpoint is None:
        checkpoint = ck.write_checkpoint(scratch / "demo-checkpoint")
    checkpoint = Path(checkpoint)
    cfg = ck.read_config(checkpoint)
    if c > cfg.max_position_embeddings:
        raise UsageError(f"--context-length {c} exceeds the TTS head's max_position_embeddings "
                         f"({cfg.max_position_embeddings})")
    label = ck.demo_label(checkpoint)
    model = MiniCPMO(checkpoint, dict(options), cfg, ck.load_tts_tensors(checkpoint, cfg),
                     demo_seed=ck.demo_seed(checkpoint) if label else None)
    _load_token2wav(model, checkpoint, options)
    model.info = {"path": str(checkpoint.resolve()), "label": label or "user checkpoint", "demo": bool(label),
                  "weights": weight_files(checkpoint), "config": {"tts_config": cfg.to_json(),
                  "dit": model.dit[0].to_json() if model.dit else None,
                  "flow_encoder": model.encoder[0].to_json() if model.encoder else None,
                  "hift": model.hift[0].to_json() if model.hift else None,
                  "token2wav": str(model.dit_path) if model.dit_path else None},
                  "options": {k: v for k, v in model.sizes().items() if k in ("P", "C")}}
    if options.get("calibration-hidden"):      # a bad file fails now, not after the other graphs
        load_utterances(Path(options["calibration-hidden"]), cfg)
    return model
