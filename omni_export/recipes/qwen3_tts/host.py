"""Host-side orchestration for Qwen3-TTS graphs: streaming Code2Wav over a whole code sequence.

A static chunk graph of N new frames always sees T = L + N frames. Upstream `chunked_decode(codes,
N, L)` decodes [context + chunk] with context = L once at least L frames precede the chunk, else
everything before it (the first chunks are shorter), and drops the context's samples. Here the
window is right-padded / left-masked to T frames: real frames sit at [L - ctx, L + n) and the mask
zeroes the rest, which decodes exactly what upstream decodes. The graph outputs the N new frames'
samples only (older builds output all T frames'); the host keeps the last N*S samples either way,
then the first n*S of them (the last chunk has n <= N real frames).

A schedule (--chunk-schedule) gives the first chunks other sizes (1, 2, 4, ... new frames, each its
own graph) before the steady N: the first audio leaves after the first chunk's frames, not N.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ...progress import frames as frame_meter


@dataclass(frozen=True)
class Window:
    codes: np.ndarray       # [1, Q, T] int32
    frame_mask: np.ndarray  # [1, T] float32
    samples: int            # real new samples: the first `samples` of the N*S the graph outputs
    chunk: int = 0          # N of the graph this window is for (T = L + N)

    def inputs(self) -> dict:
        return {"codes": self.codes, "frame_mask": self.frame_mask}


def chunk_sizes(chunk: int, schedule=()) -> Iterator[int]:
    """New frames of each chunk in order: the schedule's sizes, then `chunk` for ever."""
    yield from schedule
    while True:
        yield chunk


def window(codes: np.ndarray, start: int, end: int, left: int, chunk: int, samples_per_frame: int) -> Window:
    """The window of the chunk of frames [start, end) (end - start <= chunk) for a graph of `chunk` new
    frames: upstream's context (L frames, or all before `start` when fewer)."""
    q = codes.shape[1]
    ctx = left if start - left > 0 else start
    n = end - start
    win = np.zeros((1, q, left + chunk), np.int32)
    mask = np.zeros((1, left + chunk), np.float32)
    win[0, :, left - ctx:left + n] = codes[start - ctx:end].T
    mask[0, left - ctx:left + n] = 1.0
    return Window(win, mask, n * samples_per_frame, chunk)


def windows(codes: np.ndarray, left: int, chunk: int, samples_per_frame: int, schedule=()) -> Iterator[Window]:
    """Chunk windows over codes [frames, Q] in upstream's order (sizes: chunk_sizes)."""
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be [frames, codebooks], got shape {codes.shape}")
    start, sizes = 0, chunk_sizes(chunk, schedule)
    while start < len(codes):
        n = next(sizes)
        end = min(start + n, len(codes))
        yield window(codes, start, end, left, n, samples_per_frame)
        start = end


def stream_decode(codes: np.ndarray, run_chunk: Callable[[dict], np.ndarray], left: int, chunk: int,
                  samples_per_frame: int) -> np.ndarray:
    """Decode codes [frames, Q] to a 1-D waveform through one chunk runner (inputs dict -> wav)."""
    return ChunkStream(lambda x, n: run_chunk(x), left, chunk, samples_per_frame).decode(codes)


class ChunkStream:
    """Code2Wav as a stream: frames go in as they are generated (push), each chunk of the schedule is
    decoded as soon as its frames are there, by `run_chunk(inputs, n)` (the graph of n new frames);
    finish() decodes what is left (a shorter last chunk, masked). Returns the new audio pieces;
    `on_chunk(frames, samples)` is called after each decode (latency bookkeeping)."""

    def __init__(self, run_chunk: Callable[[dict, int], np.ndarray], left: int, chunk: int,
                 samples_per_frame: int, schedule=(), on_chunk=None):
        self.run_chunk, self.left, self.sps, self.on_chunk = run_chunk, left, samples_per_frame, on_chunk
        self._sizes = chunk_sizes(chunk, schedule)
        self._next = next(self._sizes)
        self.codes: list = []
        self.start = 0                          # first frame not decoded yet

    def push(self, frames) -> list[np.ndarray]:
        frames = np.asarray(frames)
        self.codes.extend(frames.reshape(-1, frames.shape[-1]))
        out = []
        while len(self.codes) - self.start >= self._next:
            out.append(self._decode(self.start + self._next))
        return out

    def decode(self, codes) -> np.ndarray:
        """The whole stitched stream of codes [frames, Q] (pushed at once, then finished)."""
        pieces = [*self.push(codes), *self.finish()]
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def finish(self) -> list[np.ndarray]:
        return [self._decode(len(self.codes))] if len(self.codes) > self.start else []

    def _decode(self, end: int) -> np.ndarray:
        n = self._next
        w = window(np.asarray(self.codes), self.start, end, self.left, n, self.sps)
        wav = np.asarray(self.run_chunk(w.inputs(), n)).reshape(-1)
        piece = wav[wav.size - n * self.sps:][:w.samples]
        self.start, self._next = end, next(self._sizes)
        if self.on_chunk is not None:
            self.on_chunk(end, piece.size)
        return piece


def synthetic_codes(frames: int, codebooks: int, codebook_size: int, seed: int,
                    hold: float = 0.3) -> np.ndarray:
    """Seeded code sequences [frames, Q]: uniform codes, each held from the previous frame with
    probability `hold` (codec codes repeat across frames in steady sounds)."""
    rng = np.random.default_rng(seed)
    out = rng.integers(0, codebook_size, (frames, codebooks))
    keep = rng.random((frames, codebooks)) < hold
    for t in range(1, frames):
        out[t] = np.where(keep[t], out[t - 1], out[t])
    return out.astype(np.int32)


# ------------------------------------------------------------------------------------ generation
# The talker / predictor loop of upstream's generate, over graphs called by name (graphs.py).

MASK = -100.0     # additive attention mask (matches the graphs' internal masks)


FRAME_TOP_K = 50                  # the top-k the fused predictor frame graph is traced with


@dataclass
class GenOptions:
    """Upstream's sampling (generation_config.json keys in brackets; their processors in upstream's
    order: repetition penalty, min_new_tokens, suppressed codes; then temperature, top-k, top-p)."""
    greedy: bool = False              # not [do_sample]: talker and code predictor
    seed: int = 0
    max_frames: int = 300             # [max_new_tokens] - 1
    temperature: float = 0.9          # [temperature]
    top_k: int = 50                   # [top_k]
    top_p: float = 1.0                # [top_p]
    repetition_penalty: float = 1.05  # [repetition_penalty]
    min_new_tokens: int = 2
    sub_greedy: bool = False          # not [subtalker_dosample]: the code predictor alone
    sub_temperature: float = 0.9      # [subtalker_temperature]
    sub_top_k: int = 50               # [subtalker_top_k]
    sub_top_p: float = 1.0            # [subtalker_top_p]
    predictor: str = "frame"          # "frame": one fused graph per frame; "step": prefill + 14 steps
    prefill_tokens: int = 32
    context: int = 1024
    talker_split: int = 0             # > 0: the talker runs as two graphs, layers [0, split) then the rest


@dataclass
class Generation:
    codes: np.ndarray                  # [frames, Q] int64
    c0_tokens: list                    # every sampled talker token (incl. eos)
    stopped: str                       # "eos" | "max_frames" | "context"
    prompt_tokens: int


class Talker:
    """KV cache and position bookkeeping for the static talker graphs."""

    def __init__(self, graphs, layers: int, kv_heads: int, head_dim: int, theta: float, opts: GenOptions):
        self.graphs, self.opts = graphs, opts
        c = opts.context
        self.k = [np.zeros((1, kv_heads, c, head_dim), np.float32) for _ in range(layers)]
        self.v = [np.zeros((1, kv_heads, c, head_dim), np.float32) for _ in range(layers)]
        inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)))
        self.inv = inv.astype(np.float32)
        self.pos = 0

    def _rope(self, positions: np.ndarray):
        ang = positions.astype(np.float32)[:, None] * self.inv[None, :]
        emb = np.concatenate([ang, ang], axis=-1)
        return np.cos(emb)[None].astype(np.float32), np.sin(emb)[None].astype(np.float32)

    def _past(self, layers: range) -> dict:
        d = {}
        for i in layers:
            d[f"past_key_{i}"], d[f"past_value_{i}"] = self.k[i], self.v[i]
        return d

    def _call(self, name: str, x, cos, sin, mask) -> dict:
        """One talker call: one graph, or a split talker's two halves with the residual stream
        passed between them (their outputs merged: K/V keep global layer numbers)."""
        rope = {"cos": cos, "sin": sin, "attn_mask": mask}
        s, n = self.opts.talker_split, len(self.k)
        if not s:
            return self.graphs(name, {"inputs_embeds": x, **rope, **self._past(range(n))})
        first = self.graphs(f"{name}_part1", {"inputs_embeds": x, **rope, **self._past(range(s))})
        second = self.graphs(f"{name}_part2", {"residual": first["residual"], **rope, **self._past(range(s, n))})
        return {**first, **second}

    def run(self, embeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Feed [n, Ht] rows at the next positions; returns logits [n, V] and hidden [n, Ht]."""
        n = embeds.shape[0]
        block = self.opts.prefill_tokens if n > 1 else 1
        name = "talker_prefill" if n > 1 else "talker_decode"
        logits, hidden = [], []
        for start in range(0, n, block):
            rows = embeds[start:start + block]
            got = rows.shape[0]
            if self.pos + got > self.opts.context:
                raise ContextFull()
            # Rows past the prompt's end repeat its last row: they are causally after every real
            # row and their outputs are dropped, but all-zero rows would put 0 / sqrt(eps) into
            # every RMSNorm, which 16-bit quantized graphs on ORT CPU turn into garbage K/V.
            x = np.empty((1, block, embeds.shape[1]), np.float32)
            x[0, :got] = rows
            x[0, got:] = rows[-1]
            cos, sin = self._rope(np.arange(self.pos, self.pos + block))
            mask = np.full((1, 1, block, self.opts.context + block), MASK, np.float32)
            mask[..., :self.pos] = 0.0
            causal = np.triu(np.full((block, block), MASK, np.float32), 1)
            mask[0, 0, :, self.opts.context:] = causal
            out = self._call(name, x, cos, sin, mask)
            for i in range(len(self.k)):
                self.k[i][:, :, self.pos:self.pos + got] = out[f"new_key_{i}"][:, :, :got]
                self.v[i][:, :, self.pos:self.pos + got] = out[f"new_value_{i}"][:, :, :got]
            self.pos += got
            logits.append(out["logits"][0, :got])
            hidden.append(out["hidden"][0, :got])
        return np.concatenate(logits), np.concatenate(hidden)


class ContextFull(Exception):
    """The KV cache is full: generation stops there ("context"); a prompt that does not fit at all
    is refused before its first row (prompt_fits)."""


def prompt_fits(prompt, opts: GenOptions) -> None:
    """A prompt longer than the context is a usage error, before any graph runs (it was a ContextFull
    traceback from the prefill). synth checks the user's text earlier, naming the option."""
    from ...core import UsageError

    n = prompt.embeds.shape[0]
    if n > opts.context:
        raise UsageError(f"a talker prompt needs {n} positions but the context holds {opts.context}; raise "
                         f"--context-length above {n} (each generated frame takes one more position)")


def gumbel(rng: np.random.Generator, shape) -> np.ndarray:
    u = rng.random(shape, dtype=np.float64)
    return (-np.log(-np.log(np.clip(u, 1e-20, 1.0 - 1e-12)))).astype(np.float32)


def pick(logits: np.ndarray, noise: np.ndarray | None, top_k: int, top_p: float = 1.0,
         temperature: float = 1.0) -> int:
    """argmax(kept(logits) + noise): greedy when noise is None; else a sample of softmax(logits / T)
    over the kept codes (noise = T * Gumbel): the top k, then upstream's top-p (transformers'
    TopPLogitsWarper on the temperature-scaled, top-k-filtered scores: drop the least likely codes
    while their summed probability stays <= 1 - top_p, keep at least one)."""
    logits = logits.astype(np.float32)
    if noise is None:
        return int(np.argmax(logits))
    kept = logits >= np.partition(logits, -top_k)[-top_k] if top_k < logits.size else np.isfinite(logits)
    if top_p < 1.0:
        kept &= _top_p(logits, kept, top_p, temperature)
    # Dropped codes: below every noisy score, so noise never lifts one over a kept logit
    # (upstream's filter sets them to -inf; a floor under the logits alone did not hold).
    noisy = logits + noise
    return int(np.argmax(np.where(kept, noisy, noisy.min() - 1.0)))


def _top_p(logits: np.ndarray, kept: np.ndarray, top_p: float, temperature: float) -> np.ndarray:
    scores = np.where(kept, logits / np.float32(temperature), -np.inf).astype(np.float32)
    order = np.argsort(scores, kind="stable")                       # ascending, as upstream sorts
    z = scores[order] - scores[order[-1]]
    probs = np.exp(z) / np.exp(z).sum(dtype=np.float32)
    drop = np.cumsum(probs, dtype=np.float32) <= np.float32(1.0 - top_p)
    drop[-1] = False                                                # min_tokens_to_keep = 1
    out = np.ones_like(kept)
    out[order[drop]] = False
    return out


def talker_logits(logits: np.ndarray, generated: list[int], cfg, opts: GenOptions) -> np.ndarray:
    """Upstream's processors on the fp32 logits, in its order: repetition penalty (generated c0
    tokens only), min_new_tokens (eos masked), suppress codes [V - 1024, V) except eos."""
    x = logits.astype(np.float32).copy()
    t = cfg.talker
    if opts.repetition_penalty != 1.0 and generated:
        ids = np.unique(np.asarray(generated))
        s = x[ids]
        x[ids] = np.where(s < 0, s * opts.repetition_penalty, s / opts.repetition_penalty)
    if len(generated) < opts.min_new_tokens:
        x[t.codec_eos_token_id] = -np.inf
    sup = np.arange(t.vocab_size - 1024, t.vocab_size)
    sup = sup[sup != t.codec_eos_token_id]
    x[sup] = -np.inf
    return x


def frame_cannot_honour(opts: GenOptions) -> list[str]:
    """The code-predictor sampling settings the fused frame graph cannot follow (it samples inside,
    over the top FRAME_TOP_K codes, without top-p); the step graphs follow every one."""
    if opts.greedy or opts.sub_greedy:
        return []
    gaps = [f"subtalker_top_k {opts.sub_top_k} (the frame graph's is {FRAME_TOP_K})"] if opts.sub_top_k != FRAME_TOP_K else []
    return gaps + ([f"subtalker_top_p {opts.sub_top_p}"] if opts.sub_top_p < 1.0 else [])


def predictor_frame(graphs, cfg, hidden: np.ndarray, c0: int, noise: np.ndarray, opts: GenOptions,
                    tables) -> tuple[list[int], np.ndarray]:
    """Codes c1..c15 and the summed 16-codebook embedding for the next talker input."""
    h = hidden.reshape(1, 1, -1).astype(np.float32)
    code0 = np.array([[c0]], np.int32)
    if opts.predictor == "frame":
        out = graphs("predictor_frame", {"past_hidden": h, "code0": code0, "noise": noise[None]})
        return [int(c) for c in out["codes"][0]], out["embedding"].reshape(-1)
    p = cfg.predictor
    out = graphs("predictor_prefill", {"past_hidden": h, "code0": code0})
    past = _predictor_past(p, out)
    greedy = opts.greedy or opts.sub_greedy

    def choose(logits, s):
        return pick(logits, None if greedy else noise[s], opts.sub_top_k, opts.sub_top_p, opts.sub_temperature)

    codes = [choose(out["logits"][0], 0)]
    for s in range(1, p.num_code_groups - 1):
        out = graphs("predictor_decode", {"code": np.array([[codes[-1]]], np.int32),
                                          "step": np.array([s], np.int32), **past})
        for i in range(p.num_hidden_layers):
            for kind in ("key", "value"):
                past[f"past_{kind}_{i}"][:, :, s + 1] = out[f"new_{kind}_{i}"][:, :, 0]
        codes.append(choose(out["logits"][0], s))
    return codes, tables.embedding_sum([c0] + codes)


def generate(graphs, cfg, tables, prompt, opts: GenOptions, on_frame=None) -> Generation:
    """Prefill the prompt, then alternate predictor (frame k) and talker decode (token k + 1).
    `on_frame(codes16)` is called as each frame's codes are known (a streaming decoder's push)."""
    t = cfg.talker
    prompt_fits(prompt, opts)
    if opts.predictor == "frame" and frame_cannot_honour(opts):
        from ...core import UsageError

        raise UsageError(f"the fused predictor frame graph cannot sample with {', '.join(frame_cannot_honour(opts))}; "
                         f"use --predictor step")
    rng = np.random.default_rng(opts.seed)
    tick = frame_meter("generate", opts.max_frames, bound=True)
    talker = Talker(graphs, t.num_hidden_layers, t.num_key_value_heads, t.head_dim, t.rope_theta, opts)
    logits, hidden = talker.run(prompt.embeds)
    generated: list[int] = []
    frames = []
    stopped = "max_frames"

    def sample(lg) -> int:
        x = talker_logits(lg, generated, cfg, opts)
        if opts.greedy:
            return int(np.argmax(x))
        noise = gumbel(rng, x.shape) * np.float32(opts.temperature)
        return pick(np.where(np.isfinite(x), x, -1e30).astype(np.float32), noise, opts.top_k, opts.top_p,
                    opts.temperature)

    c0, h = sample(logits[-1]), hidden[-1]
    generated.append(c0)
    while True:
        if c0 == t.codec_eos_token_id:
            stopped = "eos"
            break
        if len(frames) >= opts.max_frames:
            break
        q1 = cfg.predictor.num_code_groups - 1
        noise = (np.zeros((q1, cfg.predictor.vocab_size), np.float32) if opts.greedy or opts.sub_greedy else
                 gumbel(rng, (q1, cfg.predictor.vocab_size)) * np.float32(opts.sub_temperature))
        codes, emb = predictor_frame(graphs, cfg, h, c0, noise, opts, tables)
        frames.append([c0] + codes)
        tick()
        if on_frame is not None:
            on_frame(frames[-1])
        k = len(frames) - 1
        x = emb + (prompt.trailing[k] if k < len(prompt.trailing) else prompt.pad)
        try:
            logits, hidden = talker.run(x[None].astype(np.float32))
        except ContextFull:
            stopped = "context"
            break
        c0, h = sample(logits[-1]), hidden[-1]
        generated.append(c0)
    codes = np.asarray(frames, dtype=np.int64).reshape(-1, cfg.predictor.num_code_groups)
    return Generation(codes, generated, stopped, prompt.embeds.shape[0])


def _top2_gap(x: np.ndarray) -> float:
    finite = x[np.isfinite(x)]
    if finite.size < 2:
        return float("inf")
    two = np.partition(finite, -2)[-2:]
    return float(two[1] - two[0])


def teacher_forced(graphs, cfg, tables, prompt, forced: np.ndarray, opts: GenOptions) -> tuple[np.ndarray, np.ndarray]:
    """Greedy decisions of every code given the reference's history (no cascade): the talker is fed
    the forced frames and the predictor step graphs the forced codes. Returns (predicted codes,
    decision margins) [frames, Q]; margins are the gaps between the two best processed logits."""
    t, p = cfg.talker, cfg.predictor
    prompt_fits(prompt, opts)
    talker = Talker(graphs, t.num_hidden_layers, t.num_key_value_heads, t.head_dim, t.rope_theta, opts)
    logits, hidden = talker.run(prompt.embeds)
    generated: list[int] = []
    pred = np.zeros_like(forced)
    margins = np.zeros(forced.shape, np.float32)
    tick = frame_meter("teacher-forced", len(forced))
    for k, frame in enumerate(forced):
        x = talker_logits(logits[-1], generated, cfg, opts)
        pred[k, 0], margins[k, 0] = int(np.argmax(x)), _top2_gap(x)
        generated.append(int(frame[0]))
        h = hidden[-1].reshape(1, 1, -1).astype(np.float32)
        out = graphs("predictor_prefill", {"past_hidden": h, "code0": np.array([[frame[0]]], np.int32)})
        past = _predictor_past(p, out)
        for s in range(1, p.num_code_groups):
            lg = out["logits"][0]
            pred[k, s], margins[k, s] = int(np.argmax(lg)), _top2_gap(lg)
            if s == p.num_code_groups - 1:
                break
            out = graphs("predictor_decode", {"code": np.array([[frame[s]]], np.int32),
                                              "step": np.array([s], np.int32), **past})
            for i in range(p.num_hidden_layers):
                for kind in ("key", "value"):
                    past[f"past_{kind}_{i}"][:, :, s + 1] = out[f"new_{kind}_{i}"][:, :, 0]
        tick()
        if k + 1 == len(forced):
            break
        x_in = tables.embedding_sum([int(c) for c in frame]) + \
            (prompt.trailing[k] if k < len(prompt.trailing) else prompt.pad)
        logits, hidden = talker.run(x_in[None].astype(np.float32))
    return pred, margins


def _predictor_past(p, out: dict) -> dict:
    """The predictor's 17-slot KV inputs after prefill: its two new positions in slots 0..1."""
    past = {}
    for i in range(p.num_hidden_layers):
        for kind in ("key", "value"):
            buf = np.zeros((1, p.num_key_value_heads, 17, p.head_dim), np.float32)
            buf[:, :, :2] = out[f"new_{kind}_{i}"]
            past[f"past_{kind}_{i}"] = buf
    return past
