"""Host side of the TTS head: condition building, KV cache bookkeeping, prefill in chunks, the decode
loop and sampling. Graphs are called by name through `graphs(name, inputs) -> outputs` (fp32 eager
modules or a build's artifacts), so the same loop produces references and scores builds.

Upstream (MiniCPMTTS.generate, non-streaming): the condition is [emb_text(ids) + normalize(
projector_semantic(llm_hidden)) per token, emb_text(text_eos), emb_text(audio_bos)] at positions
0..L-1; the last position's logits give the first code; each next step feeds emb_code[0](previous
code) at the next position. Codes are sampled with temperature, a repetition penalty over the last
16 codes, top-k and top-p; EOS (the last code) is masked for the first `min_new_tokens` steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...progress import frames as frame_meter

MASKED = -100.0          # additive mask: exp(-100) is 0 in fp32 and fp16, and keeps 16-bit activations fine
REPETITION_WINDOW = 16


@dataclass
class Tables:
    """Embedding tables the host gathers rows from (fp32 numpy)."""
    text: np.ndarray          # tts.emb_text [num_text_tokens, H]
    code: np.ndarray          # tts.emb_code.0 [V, H]


@dataclass
class GenOptions:
    prefill_tokens: int = 32
    context: int = 1024
    max_codes: int = 64
    min_new_tokens: int = 50
    greedy: bool = True
    temperature: float = 0.8
    top_k: int = 25
    top_p: float = 0.85
    repetition_penalty: float = 1.05
    seed: int = 0


@dataclass
class Generation:
    codes: np.ndarray                          # [n] int64, EOS excluded
    stopped: str
    margins: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))   # top-2 gap per decision


def condition(graphs, tables: Tables, cfg, hidden: np.ndarray, ids: np.ndarray, p: int) -> np.ndarray:
    """[T + 2, H]: the per-token conditions (tts_condition graph, P tokens per call) + text_eos, audio_bos rows."""
    rows = []
    for s in range(0, len(ids), p):
        n = min(p, len(ids) - s)
        h = np.zeros((1, p, hidden.shape[1]), np.float32)
        e = np.zeros((1, p, tables.text.shape[1]), np.float32)
        h[0, :n] = hidden[s:s + n]
        e[0, :n] = tables.text[ids[s:s + n]]
        rows.append(graphs("tts_condition", {"llm_hidden": h, "text_embeds": e})["condition"][0, :n])
    rows.append(tables.text[[cfg.text_eos_token_id, cfg.audio_bos_token_id]])
    return np.concatenate(rows).astype(np.float32)


class Cache:
    """Per-layer K/V [1, kv, C, hd]; slot = position."""

    def __init__(self, cfg, context: int):
        shape = (1, cfg.num_key_value_heads, context, cfg.head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in range(cfg.num_hidden_layers)]
        self.v = [np.zeros(shape, np.float32) for _ in range(cfg.num_hidden_layers)]
        self.context = context

    def inputs(self) -> dict:
        d = {}
        for n, (k, v) in enumerate(zip(self.k, self.v)):
            d[f"past_key_{n}"], d[f"past_value_{n}"] = k, v
        return d

    def write(self, out: dict, pos: int, n: int) -> None:
        for i in range(len(self.k)):
            self.k[i][:, :, pos:pos + n] = out[f"new_key_{i}"][:, :, :n]
            self.v[i][:, :, pos:pos + n] = out[f"new_value_{i}"][:, :, :n]


def step_inputs(embeds: np.ndarray, pos: int, cache: Cache, cos: np.ndarray, sin: np.ndarray) -> dict:
    """Inputs of a prefill (P rows) or decode (1 row) call whose first row sits at `pos`."""
    p = embeds.shape[0]
    c = cache.context
    mask = np.full((1, 1, p, c + p), MASKED, np.float32)
    mask[..., :pos] = 0.0
    mask[0, 0, :, c:] = np.triu(np.full((p, p), MASKED, np.float32), k=1)
    idx = np.minimum(np.arange(pos, pos + p), len(cos) - 1)
    return {"inputs_embeds": embeds[None].astype(np.float32), "cos": cos[idx][None], "sin": sin[idx][None],
            "attn_mask": mask, **cache.inputs()}


def prefill(graphs, cond: np.ndarray, cache: Cache, cos, sin, p: int) -> np.ndarray:
    """Runs the condition through tts_prefill in chunks of P; returns the last position's logits [V]."""
    if len(cond) > cache.context:
        from ...core import UsageError

        raise UsageError(f"the condition has {len(cond)} positions but the KV cache holds {cache.context}; "
                         f"raise --context-length or shorten the text")
    logits = None
    for s in range(0, len(cond), p):
        n = min(p, len(cond) - s)
        x = np.zeros((p, cond.shape[1]), np.float32)
        x[:n] = cond[s:s + n]
        out = graphs("tts_prefill", step_inputs(x, s, cache, cos, sin))
        cache.write(out, s, n)
        logits = out["logits"][0, n - 1]
    return logits


def decode(graphs, tables: Tables, code: int, pos: int, cache: Cache, cos, sin) -> np.ndarray:
    out = graphs("tts_decode", step_inputs(tables.code[[code]], pos, cache, cos, sin))
    cache.write(out, pos, 1)
    return out["logits"][0, 0]


def pick(logits: np.ndarray, history: list[int], step: int, eos: int, o: GenOptions, rng) -> tuple[int, float]:
    """(code, top-2 margin of the decision scores)."""
    x = logits.astype(np.float64).copy()
    if step < o.min_new_tokens:
        x[eos] = -np.inf
    if o.greedy:
        top2 = np.sort(x)[-2:]
        return int(np.argmax(x)), float(top2[1] - top2[0])
    x /= o.temperature
    if history and o.repetition_penalty != 1.0:
        freq = np.bincount(history[-REPETITION_WINDOW:], minlength=len(x))
        alpha = o.repetition_penalty ** freq
        x = np.where(x < 0, x * alpha, x / alpha)
    if 0 < o.top_k < len(x):
        kth = np.sort(x)[-o.top_k]
        x[x < kth] = -np.inf
    order = np.argsort(-x)
    probs = np.exp(x[order] - x[order[0]])
    probs /= probs.sum()
    keep = np.cumsum(probs) - probs < o.top_p          # smallest set reaching top_p (the best always kept)
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    return int(order[rng.choice(len(order), p=probs)]), 0.0


def generate(graphs, cfg, tables: Tables, cond: np.ndarray, o: GenOptions, cos, sin) -> Generation:
    cache = Cache(cfg, o.context)
    rng = np.random.default_rng(o.seed)
    logits = prefill(graphs, cond, cache, cos, sin, o.prefill_tokens)
    codes, margins = [], []
    pos = len(cond)
    stopped = f"max codes ({o.max_codes})"
    tick = frame_meter("generate", o.max_codes, bound=True, unit="codes")
    for t in range(o.max_codes):
        code, margin = pick(logits, codes, t, cfg.eos_code, o, rng)
        tick()
        if code == cfg.eos_code:
            stopped = "eos"
            break
        codes.append(code)
        margins.append(margin)
        if t == o.max_codes - 1:
            break
        if pos >= o.context:
            stopped = f"context full ({o.context} positions)"
            break
        logits = decode(graphs, tables, code, pos, cache, cos, sin)
        pos += 1
    return Generation(np.array(codes, np.int64), stopped, np.array(margins, np.float32))


def teacher_forced(graphs, cfg, tables: Tables, cond: np.ndarray, ref: np.ndarray, o: GenOptions, cos, sin):
    """The greedy code the graphs choose at every step given the reference history: (codes, margins)."""
    cache = Cache(cfg, o.context)
    logits = prefill(graphs, cond, cache, cos, sin, o.prefill_tokens)
    out, margins = [], []
    pos = len(cond)
    tick = frame_meter("teacher-forced", len(ref), unit="codes")
    for t, prev in enumerate(ref):
        code, margin = pick(logits, [], t, cfg.eos_code, GenOptions(greedy=True, min_new_tokens=o.min_new_tokens), None)
        tick()
        out.append(code)
        margins.append(margin)
        if t < len(ref) - 1:
            logits = decode(graphs, tables, int(prev), pos, cache, cos, sin)
            pos += 1
    return np.array(out, np.int64), np.array(margins, np.float32)
