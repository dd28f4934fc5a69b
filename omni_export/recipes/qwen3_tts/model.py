"""Qwen3-TTS loader: checkpoint -> graphs and their real inputs, for the generic pipeline.

Real inputs come from running the fp32 pipeline itself: the recipe's calibration prompts are
generated (seeded sampling, half through the fused predictor graph, half through the step graphs)
and every graph call is captured; the held-out prompts are generated greedily and captured the same
way, and only ever used for parity. Code2Wav chunks are windows over the generated codes.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ...artifacts.manifest import weight_files
from ...captured import RECORD_BUDGET_BYTES
from ...core import Graph, Samples, UsageError, resolve_specs, variant_base, variant_name
from ...weights import require_regular_file
from . import checkpoint as ck
from . import host, prompts
from .config import talker_split
from .recipe import RECIPE, TALKER_PARTS

CALIBRATION_PER_GRAPH = 16
HELDOUT_PER_GRAPH = {"talker_decode": 12, "talker_decode_part1": 12, "talker_decode_part2": 12,
                     "predictor_prefill": 12, "predictor_decode": 12, "predictor_frame": 12, "code2wav": 2,
                     "speech_encoder": 4}
# --talker-parts default: split the talker in two when its layers' fp16 weights pass this (1.7B:
# 2.6 GiB; 0.6B: 0.8 GiB). HTP contexts have a size limit, and one 28-layer 1.7B talker context
# binary held 11.2 GiB RssAnon in its compile, a 14-layer half 5.6 GiB (1.7B benchmark at 785c43e).
TALKER_PART_BYTES = 2 << 30
HELDOUT_DEFAULT = 4
HELDOUT_ENCODER_EXTRA = 3     # held-out speech-encoder calls on whole-window references, besides the ICL prompt's
CALIBRATION_FRAMES = 24       # frames generated per calibration prompt (random weights never stop)
CALIBRATION_SEED = 1000
HELDOUT_FRAMES = 24
# At real sizes an eager fp32 frame costs ~0.5 s (0.6B, 2 cores) and only CALIBRATION_PER_GRAPH
# calls per graph are kept: 18 prompts x 4 frames still leave more than 16 of every per-frame call.
REAL_SIZE_HIDDEN = 512
REAL_CALIBRATION_FRAMES = 4
REAL_HELDOUT_FRAMES = 12
VOICE_DESIGN_INSTRUCTS = ("A calm, low-pitched male voice, speaking slowly.",
                          "A bright, cheerful young female voice.")


@dataclass
class HostTables:
    """Embedding tables the host gathers from (fp32 numpy)."""
    text: np.ndarray             # [text vocab, Tw]
    codec: np.ndarray            # talker codec table [Vt, Ht]
    groups: np.ndarray           # predictor tables [Q-1, V, Ht]

    def codec_emb(self, ids) -> np.ndarray:
        return self.codec[np.asarray(ids, dtype=np.int64)]

    def embedding_sum(self, codes16) -> np.ndarray:
        rows = [self.codec[codes16[0]]] + [self.groups[g - 1, c] for g, c in enumerate(codes16) if g > 0]
        return np.stack(rows).sum(axis=0, dtype=np.float32)


@dataclass
class Qwen3TTS:
    path: Path
    demo: str | None
    options: dict
    cfg: object = None
    tensors: dict = field(default_factory=dict)
    speech: ck.SpeechTokenizer | None = None
    info: dict = field(default_factory=dict)
    _samples: dict | None = None
    demo_seed: int | None = None
    _core_ref: object = None
    capture_cache: dict | None = None          # {"key", "hit", "store"} once inputs are captured
    speech_encoder_config: object = None       # Base with speech_tokenizer/ encoder_config: in-context cloning
    user_voices: list | None = None            # --speaker-calibration: real references (24 kHz)

    @property
    def seeds(self) -> dict:
        """Every seed behind this model's data (recorded in the manifest)."""
        n_cal = len(prompts.CALIBRATION)
        s = {"calibration_generations": [CALIBRATION_SEED + i for i in range(n_cal)],
             "heldout_generations": "greedy", "code2wav_calibration": "user codes" if
             self.options.get("calibration-codes") else "windows of the calibration generations"}
        if self.demo_seed is not None:
            s["demo_checkpoint"] = self.demo_seed
        if self.options.get("speaker-calibration"):
            s["speaker_calibration"] = str(self.options["speaker-calibration"])
        return s

    # ---- geometry
    def sizes(self) -> dict:
        t, p, c = self.cfg.talker, self.cfg.predictor, self.speech.config
        split = talker_split(t.num_hidden_layers)
        return {"Ht": t.hidden_size, "Tw": t.text_hidden_size, "Lt": t.num_hidden_layers,
                "Lt1": split, "Lt2": t.num_hidden_layers - split,
                "KVt": t.num_key_value_heads, "HDt": t.head_dim, "Vt": t.vocab_size,
                "Lp": p.num_hidden_layers, "KVp": p.num_key_value_heads, "HDp": p.head_dim,
                "V": p.vocab_size, "Q": p.num_code_groups, "P": int(self.options["prefill-tokens"]),
                "C": int(self.options["context-length"]), "L": self.left, "N": self.chunk,
                "S": c.samples_per_frame, "F": int(self.options["speaker-frames"]),
                "E": self.encoder_frames, "R": self.encoder_frames * c.samples_per_frame}

    @property
    def left(self) -> int:
        return int(self.options["left-context"])

    @property
    def chunk(self) -> int:
        return int(self.options["chunk-frames"])

    @property
    def schedule(self) -> tuple[int, ...]:
        """New frames of the stream's first chunks (--chunk-schedule, each capped at --chunk-frames);
        every later chunk has --chunk-frames."""
        return tuple(min(n, self.chunk) for n in parse_schedule(self.options.get("chunk-schedule")))

    def chunk_graph(self, frames: int) -> str:
        """The Code2Wav graph of chunks of `frames` new frames."""
        return "code2wav" if frames == self.chunk else variant_name("code2wav", "N", frames)

    def chunk_graphs(self) -> tuple[str, ...]:
        """Every Code2Wav graph the schedule runs: code2wav, then one per other chunk size."""
        return tuple(dict.fromkeys(self.chunk_graph(n) for n in (self.chunk, *sorted(self.schedule))))

    def _chunk_of(self, component: str) -> int:
        return self.chunk if component == "code2wav" else int(component[len("code2wav_n"):])

    def components(self) -> tuple[str, ...]:
        """Components this checkpoint has (the speaker encoder only in Base checkpoints), with the
        talker as one graph per call or two halves (`talker_parts`)."""
        skip = {"talker_prefill", "talker_decode"} if self.talker_parts == 2 else set(TALKER_PARTS)
        if self.cfg.speaker_encoder is None:
            skip.add("speaker_encoder")
        if self.speech_encoder_config is None:
            skip.add("speech_encoder")
        names = tuple(c.name for c in RECIPE.components if c.name not in skip)
        i = names.index("code2wav") + 1
        return names[:i] + self.chunk_graphs()[1:] + names[i:]

    @cached_property
    def talker_parts(self) -> int:
        """1: each talker call is one graph; 2: two halves (--talker-parts; default by weight size)."""
        given = self.options.get("talker-parts")
        if given is None:
            t = self.cfg.talker
            per_layer = 2 * (t.hidden_size * (t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim
                             + t.num_attention_heads * t.head_dim * t.hidden_size
                             + 3 * t.hidden_size * t.intermediate_size)
            return 2 if per_layer * t.num_hidden_layers > TALKER_PART_BYTES else 1
        return int(given)

    @cached_property
    def tables(self) -> HostTables:
        import torch

        q = self.cfg.predictor.num_code_groups
        return HostTables(
            self.tensors["talker.model.text_embedding.weight"].numpy(),
            self.tensors["talker.model.codec_embedding.weight"].numpy(),
            torch.stack([self.tensors[f"talker.code_predictor.model.codec_embedding.{j}.weight"]
                         for j in range(q - 1)]).numpy())

    @property
    def _predictor_core(self):
        """The predictor's weights, shared by its three graphs while any of them is alive (a weak
        reference: once the pipeline drops a component's graph, its weights go with it)."""
        from .talker import PredictorCore

        core = self._core_ref() if self._core_ref is not None else None
        if core is None:
            core = PredictorCore(self.cfg, self.tensors).eval()
            self._core_ref = weakref.ref(core)
        return core

    # ---- the pipeline's interface
    def graph(self, component: str) -> Graph:
        comp = RECIPE.component(component)
        if component not in self.components():
            raise UsageError(f"this checkpoint has no {component} (tts_model_type {self.cfg.tts_model_type})")
        sizes = self.sizes()
        if comp.name.startswith("code2wav"):
            sizes["N"] = self._chunk_of(component)
        return Graph(component, self._module(component).eval(), resolve_specs(comp.inputs, sizes),
                     resolve_specs(comp.outputs, sizes), comp.logits, self._row_tables(comp))

    def _row_tables(self, comp) -> dict:
        """The checkpoint's codebook tables of a summed embedding (RowSum: code0's talker table, then
        predictor table j for code j + 1), as the host sums them (HostTables.embedding_sum); views of
        the loaded tensors, no copy."""
        if "embedding" not in comp.row_sums:
            return {}
        q = self.cfg.predictor.num_code_groups
        return {"embedding": (self.tensors["talker.model.codec_embedding.weight"].numpy(),
                              *(self.tensors[f"talker.code_predictor.model.codec_embedding.{j}.weight"].numpy()
                                for j in range(q - 1)))}

    def _module(self, component: str):
        from . import talker as tk

        if component in self.chunk_graphs():
            from .modules import build_code2wav

            n = self._chunk_of(component)
            return build_code2wav(self.speech.config, self.speech.tensors, self.left + n, n)
        if component == "text_projection":
            return tk.TextProjection(self.tensors)
        if component in ("talker_prefill", "talker_decode"):
            return tk.TalkerStep(self.cfg, self.tensors)
        if component in TALKER_PARTS:
            return tk.TalkerPart(self.cfg, self.tensors, int(component[-1]))
        if component == "predictor_prefill":
            return tk.PredictorPrefill(self._predictor_core)
        if component == "predictor_decode":
            return tk.PredictorDecode(self._predictor_core)
        if component == "predictor_frame":
            return tk.PredictorFrame(self._predictor_core, top_k=host.FRAME_TOP_K)
        if component == "speech_encoder":
            from .speech_encoder import SpeechEncoderGraph, load_speech_encoder

            return SpeechEncoderGraph(load_speech_encoder(self.path))
        if component == "speaker_encoder":
            from .speaker import SpeakerEncoder

            return SpeakerEncoder(self.cfg.speaker_encoder, self.tensors, self.speaker_frames)
        raise UsageError(f"component {component} is not built by this loader")  # pragma: no cover

    def samples(self, component: str, kind: str) -> Samples:
        if component in self.chunk_graphs() and kind == "calibration" and self.options.get("calibration-codes"):
            return self._code2wav_user_samples(self._chunk_of(component))
        if self._samples is None:
            self._samples = self._capture()
        inputs, source = self._samples[kind].get(component, ([], ""))
        return Samples(inputs, source)

    # ---- real inputs from the fp32 pipeline
    def gen_options(self, **kw) -> host.GenOptions:
        split = talker_split(self.cfg.talker.num_hidden_layers) if self.talker_parts == 2 else 0
        return host.GenOptions(prefill_tokens=int(self.options["prefill-tokens"]),
                               context=int(self.options["context-length"]), talker_split=split, **kw)

    def requests(self, which: str) -> list:
        from .prompt import Request

        tok = self.tokenizer
        items = prompts.CALIBRATION if which == "calibration" else prompts.HELDOUT
        speakers = sorted(self.cfg.talker.spk_id)
        out = []
        for i, p in enumerate(items):
            kind = self.cfg.tts_model_type
            req = Request(text_ids=self.template(p["text"]), language=self._language(p["language"]),
                          non_streaming=p.get("non_streaming", True), name=p["text"][:40])
            if kind == "custom_voice" and speakers:
                req.speaker = speakers[i % len(speakers)]
            if kind == "voice_design":
                req.instruct_ids = tok.encode(f"<|im_start|>user\n{VOICE_DESIGN_INSTRUCTS[i % 2]}<|im_end|>\n")
            out.append(req)
        return out

    def _language(self, lang: str) -> str:
        return lang if lang == "auto" or lang in self.cfg.talker.codec_language_id else "auto"

    def template(self, text: str) -> list[int]:
        from .prompt import template_ids

        return template_ids(self.tokenizer, text)

    @cached_property
    def tokenizer(self):
        """The text tokenizer, split as upstream qwen-tts loads it (calibration prompts, e2e rows)."""
        from ...text_tokenizer import load as load_tokenizer

        return load_tokenizer(self.path, "auto")

    def synthesize(self, graphs, req, opts: host.GenOptions, with_audio: bool = True, on_frame=None):
        """Text to codes (and waveform) through `graphs`: eager, or a build's artifacts; `on_frame`: see
        host.generate."""
        from .prompt import build

        if self.cfg.tts_model_type == "base" and req.speaker_embedding is None:
            req.speaker_embedding = self.speaker_embedding(graphs, self.default_voice())
        pr = build(self.cfg, req, lambda ids: self.text_proj(graphs, ids), self.tables.codec_emb, self.frame_emb)
        gen = host.generate(graphs, self.cfg, self.tables, pr, opts, on_frame)
        wav = self.decode(graphs, gen.codes) if with_audio and len(gen.codes) else None
        return gen, wav

    def text_proj(self, graphs, ids: list[int]) -> np.ndarray:
        p = int(self.options["prefill-tokens"])
        rows = self.tables.text[np.asarray(ids, dtype=np.int64)]
        out = []
        for s in range(0, len(rows), p):
            x = np.zeros((1, p, rows.shape[1]), np.float32)
            chunk = rows[s:s + p]
            x[0, :len(chunk)] = chunk
            out.append(graphs("text_projection", {"text_embeds": x})["projected"][0, :len(chunk)])
        return np.concatenate(out) if out else np.zeros((0, self.cfg.talker.hidden_size), np.float32)

    def decode(self, graphs, codes: np.ndarray) -> np.ndarray:
        """The stitched stream of codes [frames, Q]: chunks along the schedule (chunk_stream)."""
        return self.chunk_stream(graphs).decode(codes)

    def chunk_stream(self, graphs, on_chunk=None) -> host.ChunkStream:
        """A streaming Code2Wav decoder over `graphs`: each chunk of the schedule runs its own graph."""
        return host.ChunkStream(lambda x, n: graphs(self.chunk_graph(n), x)["wav"], self.left, self.chunk,
                                self.speech.config.samples_per_frame, self.schedule, on_chunk)

    @property
    def speaker_frames(self) -> int:
        """F: the most log-mel frames a reference may have (--speaker-frames)."""
        return int(self.options["speaker-frames"])

    def frame_emb(self, codes: np.ndarray) -> np.ndarray:
        """Each frame's summed 16 codebook embeddings [frames, Ht] (a reference's codes in the prompt)."""
        return np.stack([self.tables.embedding_sum([int(c) for c in frame]) for frame in codes])

    @property
    def encoder_frames(self) -> int:
        """E: the most codec frames an in-context reference may have (--encoder-frames)."""
        return int(self.options["encoder-frames"])

    def reference_codes(self, graphs, wav: np.ndarray, what: str = "the reference audio", hint: str = "") -> np.ndarray:
        """Upstream's codes [frames, Q] of a whole reference (the speech encoder over a zero-padded
        window of E frames): an error when it is longer than the window, never cropped."""
        from .speech_encoder import check_reference, window

        sps = self.speech.config.samples_per_frame
        n = check_reference(len(wav), self.encoder_frames, sps, what=what, hint=hint)
        out = graphs("speech_encoder", window(wav, self.encoder_frames * sps))["codes"]
        return np.asarray(out[0, :n], dtype=np.int64)

    def decode_continuation(self, graphs, ref_codes: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """In-context cloning's waveform as upstream's generate_voice_clone makes it: the reference's
        codes and the generated ones decoded as one stream, the reference's share of the samples cut
        (int(ref / total * samples), its float rounding included)."""
        wav = self.decode(graphs, np.concatenate([np.asarray(ref_codes, np.int64), codes]))
        cut = int(len(ref_codes) / max(len(ref_codes) + len(codes), 1) * len(wav))
        return wav[cut:]

    def speaker_embedding(self, graphs, wav: np.ndarray, what: str = "the reference audio",
                          hint: str = "") -> np.ndarray:
        """The x-vector of the whole reference (upstream's): an error when it has more log-mel
        frames than the graph's window, or fewer than the encoder's reflect pads need."""
        from .speaker import check_reference, log_mel, shortest, window

        check_reference(len(wav), self.speaker_frames, shortest(self.cfg.speaker_encoder), what=what, hint=hint)
        return graphs("speaker_encoder", window(log_mel(wav), self.speaker_frames))["embedding"].reshape(-1)

    def default_voice(self) -> np.ndarray:
        """The synthetic reference used when none is given: 3 s, or the window when that is shorter."""
        return reference_voice(0, seconds=min(3.0, _seconds(self.speaker_frames)))

    def calibration_voice(self, i: int, count: int, heldout: bool) -> np.ndarray:
        """The i-th of `count` synthetic references: lengths spread from 0.5 s (or the shortest the
        encoder takes) to the whole window, so the speaker encoder is calibrated and scored with
        masked frames as real references have them (held-out: the shortest and the longest).
        With --speaker-calibration, the calibration references are its WAVs in name order (cut to
        the speaker encoder's window); the held-out ones stay synthetic."""
        from .speaker import shortest

        if self.user_voices and not heldout:
            return self.user_voices[i % len(self.user_voices)][:self.speaker_frames * 256 + 128]
        most = self.speaker_frames
        least = min(most, max(shortest(self.cfg.speaker_encoder), 46))           # 46 frames: 0.5 s
        frac = (i / max(1, count - 1)) if not heldout else (0.0 if i % 2 == 0 else 1.0)
        frames = int(round(least + frac * (most - least)))
        return reference_voice(i + (100 if heldout else 0), seconds=_seconds(frames))

    def capture_frames(self) -> tuple[int, int]:
        """(calibration, held-out) frames generated per prompt: --calibration-frames, else by size."""
        given = self.options.get("calibration-frames")
        if given is not None:
            return int(given), int(given)
        if self.cfg.talker.hidden_size >= REAL_SIZE_HIDDEN:
            return REAL_CALIBRATION_FRAMES, REAL_HELDOUT_FRAMES
        return CALIBRATION_FRAMES, HELDOUT_FRAMES

    def capture_key(self) -> str:
        from ...artifacts import captures

        voices = {}
        if self.user_voices:          # the WAVs' samples, not only the directory's name
            from ...artifacts.manifest import hash_arrays

            voices = {"speaker_calibration": hash_arrays([{"wav": v} for v in self.user_voices])}
        return captures.key(recipe=[RECIPE.name, RECIPE.version], options=self.options,
                            checkpoint=captures.checkpoint_files(self.path, self.info.get("weights", [])), **voices)

    def _capture(self) -> dict:
        """Calibration and held-out inputs: from the capture cache when this checkpoint, these
        options and this code were captured before (artifacts/captures.py), else generated."""
        from ...artifacts import captures

        k = self.capture_key()
        kept = captures.load(k)
        if kept is not None:
            self.heldout_codes = kept["heldout_codes"]
            self.capture_cache = {"key": k, "hit": True}
            return kept["samples"]
        result = self._capture_fresh()
        self.capture_cache = {"key": k, "hit": False,
                              "store": captures.store(k, {"samples": result, "heldout_codes": self.heldout_codes})}
        return result

    def _capture_fresh(self) -> dict:
        import torch

        # Small graphs run op by op: thread hand-offs cost more than they save (15x slower on a
        # loaded 2-core machine). Real sizes keep torch's default.
        threads = torch.get_num_threads()
        if self.cfg.talker.hidden_size <= 256:
            torch.set_num_threads(1)
        try:
            return self._capture_all()
        finally:
            torch.set_num_threads(threads)
            # The host tables (the text embedding alone is 1.24 GB fp32 at 0.6B) are read again
            # if end-to-end parity needs them; until then only the component being built is held.
            self.__dict__.pop("tables", None)

    def _capture_all(self) -> dict:
        from ...artifacts.manifest import hash_arrays
        from ...runtime.graphs import Capture, EagerGraphs

        eager = EagerGraphs(self)
        result = {}
        cal_frames, held_frames = self.capture_frames()
        for which in ("calibration", "heldout"):
            cap = Capture(eager)
            gens = []
            for i, req in enumerate(self.requests(which)):
                held = which == "heldout"
                opts = self.gen_options(greedy=held, seed=CALIBRATION_SEED + i, predictor="frame" if i % 2 else "step",
                                        max_frames=held_frames if held else cal_frames)
                if self.cfg.tts_model_type == "base":
                    self._clone(cap, req, i, held)
                gen, _ = self.synthesize(cap, req, opts, with_audio=False)
                gens.append(gen.codes)
            if which == "heldout" and self.speech_encoder_config is not None:
                for k in range(HELDOUT_ENCODER_EXTRA):      # whole windows: agreement over real frames
                    self.reference_codes(cap, reference_voice(200 + k, seconds=self.encoder_frames * 0.08))
            calls, counts = cap.calls, cap.counts()
            for name in self.chunk_graphs():
                windows = self._code2wav_windows(gens, self._chunk_of(name))
                calls[name] = windows
                counts[name] = (len(windows), len(windows))
            if which == "heldout":      # identical calls (e.g. the special-token rows) are not held out
                for name, kept in calls.items():
                    seen = {hash_arrays([c]) for c in calibration_calls.get(name, [])}
                    calls[name] = [c for c in kept if hash_arrays([c]) not in seen]
            src = (f"greedy fp32 generations of the recipe's held-out prompts, {held_frames} frames each"
                   if which == "heldout" else
                   f"seeded fp32 generations of the recipe's calibration prompts, {cal_frames} frames each")
            if self.user_voices and which == "calibration":
                src += (f", cloning {len(self.user_voices)} WAVs of --speaker-calibration "
                        f"{self.options['speaker-calibration']}")
            if which == "heldout":      # Code2Wav: the first chunk (no context) and a full-context one
                for name in self.chunk_graphs():
                    full = [w for w in calls[name] if w["frame_mask"].all()]
                    calls[name] = calls[name][:1] + full[-1:]
            result[which] = {name: (_spread(kept, HELDOUT_PER_GRAPH.get(variant_base(name) or name, HELDOUT_DEFAULT)
                                            if which == "heldout"
                                            else CALIBRATION_PER_GRAPH),
                                    f"{src} ({_captured(*counts[name], len(kept))})")
                             for name, kept in calls.items()}
            if which == "calibration":
                calibration_calls = calls      # every kept call: held-out calls must differ from all of them
            del cap
            if which == "heldout":
                self.heldout_codes = gens
        return result

    def _clone(self, cap, req, i: int, held: bool) -> None:
        """A Base request's voice: the i-th synthetic reference's x-vector, and (odd calibration prompts,
        the second held-out one; when the checkpoint has the speech encoder) in-context cloning from it,
        its transcript another prompt's text. ICL references are cut to the encoder's window and to a
        quarter of the talker's context (their codes are prompt rows)."""
        items = prompts.HELDOUT if held else prompts.CALIBRATION
        voice = self.calibration_voice(i, len(items), held)
        if self.speech_encoder_config is not None and i % 2 == 1:
            sps = self.speech.config.samples_per_frame
            frames = min(self.encoder_frames, max(1, int(self.options["context-length"]) // 4))
            voice = voice[:frames * sps]
            req.ref_ids = self.ref_template(items[(i + 1) % len(items)]["text"])
            req.ref_codes = self.reference_codes(cap, voice)
        req.speaker_embedding = self.speaker_embedding(cap, voice)

    def ref_template(self, text: str) -> list[int]:
        from .prompt import ref_ids

        return ref_ids(self.tokenizer, text)

    def _code2wav_windows(self, gens: list, chunk: int) -> list[dict]:
        """Inputs of the Code2Wav graph of `chunk` new frames over generated codes. Generations shorter
        than a chunk (real sizes generate 4 frames per calibration prompt) are joined end to end and
        windowed at a few offsets, so the windows carry left context as streaming ones do."""
        sps = self.speech.config.samples_per_frame
        seqs = [c for c in gens if len(c)]
        if not seqs or max(len(c) for c in seqs) >= chunk:
            return [w.inputs() for codes in seqs for w in host.windows(codes, self.left, chunk, sps)]
        joined = np.concatenate(seqs)
        step = max(1, chunk // 3)
        return [w.inputs() for o in range(0, min(chunk, len(joined)), step)
                for w in host.windows(joined[o:], self.left, chunk, sps)]

    def _code2wav_user_samples(self, chunk: int) -> Samples:
        c = self.speech.config
        given = self.options["calibration-codes"]
        seqs = load_code_sequences(Path(given), c.num_quantizers, c.codebook_size)
        wins = [w.inputs() for s in seqs for w in host.windows(s, self.left, chunk, c.samples_per_frame)]
        return Samples(_spread(wins, CALIBRATION_PER_GRAPH), f"user codes: {given}")


def parse_schedule(given) -> tuple[int, ...]:
    """--chunk-schedule: comma-separated new-frame counts; 'none' or empty: no ramp."""
    text = str(given if given is not None else "").replace(" ", "")
    if text.lower() in ("", "none"):
        return ()
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or not all(1 <= n <= 250 for n in sizes):
        raise UsageError(f"--chunk-schedule takes comma-separated new-frame counts in 1..250 (e.g. 1,2,4,8) or "
                         f"none; got '{given}'")
    return sizes


def _captured(made: int, recorded: int, usable: int) -> str:
    """usable: recorded calls left after removing those equal to a calibration call."""
    if made == recorded:
        return f"{usable} calls captured"
    return (f"{made} calls, {usable} of them kept evenly spread (captured inputs past "
            f"{RECORD_BUDGET_BYTES >> 20} MB per graph are thinned)")


def _spread(calls: list, limit: int) -> list:
    """At most `limit` samples spread evenly over the calls (early, middle and late positions)."""
    if len(calls) <= limit:
        return list(calls)
    idx = np.linspace(0, len(calls) - 1, limit).round().astype(int)
    return [calls[i] for i in idx]


def load_voices(path: Path, model, option: str = "--speaker-calibration") -> list[np.ndarray]:
    """Real reference WAVs for a Base checkpoint's calibration prompts: the first len(CALIBRATION) .wav
    files of `path` in name order, each read as `synth --ref-audio` reads one (24 kHz mono) and at least
    as long as the speaker encoder takes; errors name `option`."""
    from .speaker import mel_frames, shortest
    from ...modeling.audio import read_wav

    if model.cfg.tts_model_type != "base":
        raise UsageError(f"{option} calibrates a Base checkpoint's speaker and speech encoders; this one is "
                         f"{model.cfg.tts_model_type}")
    if not path.is_dir():
        raise UsageError(f"{option} {path} is not a directory; pass a directory of reference speech WAVs")
    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".wav")[:len(prompts.CALIBRATION)]
    if not files:
        raise UsageError(f"{option} {path}: no .wav files in the directory")
    sr, least = model.speech.sample_rate, shortest(model.cfg.speaker_encoder)
    voices = []
    for f in files:
        x = read_wav(f, sr, option)
        if mel_frames(len(x)) < least:
            raise UsageError(f"{option} {f} is {len(x) / sr:.3f} s; a reference needs at least {least} log-mel "
                             f"frames ({least * 256 / sr:.2f} s)")
        voices.append(x)
    return voices


def _speech_encoder_config(checkpoint: Path, cfg):
    """The speech tokenizer's encoder config of a Base checkpoint (in-context cloning), or None: other
    kinds, and a Base checkpoint whose speech_tokenizer/config.json has no encoder_config (it clones
    by x-vector only)."""
    from .speech_encoder import read_speech_encoder_config

    if cfg.tts_model_type != "base" or "encoder_config" not in ck.read_json(
            ck.speech_tokenizer_dir(checkpoint) / "config.json", "speech tokenizer config"):
        return None
    c = read_speech_encoder_config(checkpoint)
    if c.valid_num_quantizers != cfg.predictor.num_code_groups:
        raise UsageError(f"{checkpoint / 'speech_tokenizer' / 'config.json'}: encoder_valid_num_quantizers "
                         f"{c.valid_num_quantizers} differs from the talker's {cfg.predictor.num_code_groups} code groups")
    return c


def _seconds(frames: int) -> float:
    """A duration whose samples make exactly `frames` log-mel frames (speaker.mel_frames)."""
    from .speaker import HOP

    return (frames * HOP + HOP // 2) / 24000


def reference_voice(seed: int, seconds: float = 3.0, sr: int = 24000) -> np.ndarray:
    """A synthetic voice-like reference for Base checkpoints when no audio is given: a harmonic
    series with vibrato and a syllable envelope, plus a little noise (seeded)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = rng.uniform(100, 240) * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    env = 0.5 * (1 - np.cos(2 * np.pi * rng.uniform(3, 5) * t)).clip(0, 1)
    wav = 0.3 * voice * env / np.abs(voice).max() + 0.01 * rng.standard_normal(t.shape)
    return wav.astype(np.float32)


def load_code_sequences(path: Path, codebooks: int, codebook_size: int,
                        option: str = "--calibration-codes") -> list[np.ndarray]:
    """Code sequences [frames, codebooks] from a .npy or a directory of them, each checked (regular
    file, shape, integer values in [0, codebook_size)); errors name `option`, the flag that gave `path`."""
    if not path.exists():
        raise UsageError(f"{option} {path} does not exist; pass a .npy of codes [frames, "
                         f"{codebooks}] or a directory of them")
    files = sorted(path.glob("*.npy")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"{option} {path}: no .npy files in the directory")
    return [_code_sequence(f, codebooks, codebook_size, option) for f in files]


def _code_sequence(f: Path, codebooks: int, codebook_size: int, option: str) -> np.ndarray:
    where = f"{option} {f}"
    require_regular_file(f, option)
    try:
        a = np.load(f, allow_pickle=False)
    except (OSError, ValueError, EOFError, MemoryError) as e:   # MemoryError: a header claiming TiBs
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


def _text_split(model: Qwen3TTS) -> dict:
    """The split the calibration prompts and end-to-end rows are tokenized with (upstream's rule, as synth's
    --text-split auto) and why, for the manifest's checkpoint entry; the tokenizer is kept for them. A
    checkpoint whose tokenizer cannot load records why (synth --text-ids needs none; a build fails when its
    prompts are tokenized, naming the files)."""
    from ...text_tokenizer import load as load_tokenizer

    try:
        tok = model.__dict__["tokenizer"] = load_tokenizer(model.path, "auto")
    except UsageError as e:
        return {"text_split": None, "text_split_reason": _first_line(e)}
    return {"text_split": tok.split, "text_split_reason": tok.split_reason}


def load(checkpoint: Path | None, options: dict, scratch: Path) -> Qwen3TTS:
    """Open a checkpoint (or write the embedded demo one under `scratch`) and load what is needed.
    Options not given take the recipe's defaults (as the CLI would)."""
    options = {**{o.name: o.default for o in RECIPE.options}, **options}
    left, chunk = options.get("left-context"), options.get("chunk-frames")
    if not (isinstance(left, int) and left >= 0 and isinstance(chunk, int) and chunk >= 1):
        raise UsageError(f"--left-context must be >= 0 and --chunk-frames >= 1 (got {left}, {chunk})")
    parse_schedule(options.get("chunk-schedule"))
    if not (isinstance(options.get("e2e-frames"), int) and options["e2e-frames"] >= 0):
        raise UsageError(f"--e2e-frames must be >= 0 (got {options.get('e2e-frames')}); 0 skips end-to-end parity")
    if options.get("talker-parts") not in (None, 1, 2):
        raise UsageError(f"--talker-parts must be 1 or 2 (got {options['talker-parts']})")
    if options.get("random-weights"):
        size = options.get("size") or "0.6b"
        if size not in ("0.6b", "1.7b"):
            raise UsageError(f"--size must be 0.6b or 1.7b, got '{size}'")
        checkpoint = ck.write_real_shape(scratch / f"random-{size}", size, options.get("variant") or "custom_voice")
    elif checkpoint is None:
        checkpoint = ck.write_checkpoint(scratch / "demo-checkpoint", kind=options.get("variant") or "custom_voice",
                                        decisive=True)
    checkpoint = Path(checkpoint)
    ck.check_root_config(checkpoint)
    demo = ck.demo_label(checkpoint)
    model = Qwen3TTS(checkpoint, demo, dict(options), demo_seed=ck.demo_seed(checkpoint) if demo else None)
    model.cfg = ck.read_model_config(checkpoint)
    if model.cfg.speaker_encoder is not None:
        from .speaker import shortest

        least = shortest(model.cfg.speaker_encoder)
        if model.speaker_frames < least:
            raise UsageError(f"--speaker-frames {model.speaker_frames} is below the {least} frames this speaker "
                             f"encoder's reflect pads need")
    if model.talker_parts == 2 and model.cfg.talker.num_hidden_layers < 2:
        raise UsageError(f"--talker-parts 2 needs a talker of 2 layers or more (this one has "
                         f"{model.cfg.talker.num_hidden_layers})")
    model.speech = ck.load_speech_tokenizer(checkpoint)
    model.speech_encoder_config = _speech_encoder_config(checkpoint, model.cfg)
    # Weights are read per component when its graph is built (weights.LazyTensors), not held for the run.
    model.tensors = ck.load_model_tensors(checkpoint, model.cfg, ("talker", "predictor", "speaker_encoder"))
    model.info = {
        "path": str(checkpoint.resolve()),
        "label": demo or "user checkpoint",
        "demo": bool(demo),
        "tts_model_type": model.cfg.tts_model_type,
        "weights": weight_files(checkpoint),
        "config": {"code2wav": model.speech.config.to_json(),
                   "talker_hidden": model.cfg.talker.hidden_size, "predictor_hidden": model.cfg.predictor.hidden_size,
                   "small_to_mtp_projection": model.cfg.has_projection},
        "options": {k: v for k, v in model.sizes().items() if k in ("P", "C", "L", "N", "F", "E")},
        **_text_split(model),
    }
    if options.get("speaker-calibration"):
        model.user_voices = load_voices(Path(options["speaker-calibration"]), model)
    if options.get("calibration-codes"):        # a bad file fails now, not after minutes of other components
        c = model.speech.config
        load_code_sequences(Path(options["calibration-codes"]), c.num_quantizers, c.codebook_size)
    return model
