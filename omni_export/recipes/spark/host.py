"""The host side of Spark-X2.5 generation: embeddings, cos/sin and masks per layer type, the KV
caches (a context-length cache per full layer, a W-slot ring buffer per sliding layer), and the
greedy loop over `graphs(name, inputs)` (fp32 modules or a build's artifacts).

Ring buffer: position p of a sliding layer lives in slot p mod W (the write position), `ring_pos[s]`
remembers which position slot s holds. A query at position q may read slot s when
0 <= q - ring_pos[s] < W (the sliding window: itself and the W - 1 positions before it), which
mask_swa encodes; so only the new tokens' K/V ever cross the graph boundary, never a recomputed window.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core import UsageError
from ...modeling.rope import rope_table
from ...progress import frames as frame_meter
from .config import FULL, SLIDING, SparkConfig

MASK = -100.0          # additive mask value (fp16- and uint16-friendly; exp(-100) is below fp32 resolution)


@dataclass
class KVState:
    """Caches as the graphs take them, and where everything lives."""
    cfg: SparkConfig
    context: int
    swa: list = field(default_factory=list)     # [key, value] per sliding layer: [1, kv, W, hd]
    full: list = field(default_factory=list)    # [key, value] per full layer: [1, kv, C, hd]
    ring_pos: np.ndarray | None = None          # position held by each ring slot (-1: empty)
    pos: int = 0                                # next position

    def __post_init__(self):
        c = self.cfg
        shape = lambda slots: (1, c.num_key_value_heads, slots, c.head_dim)  # noqa: E731
        self.swa = [np.zeros(shape(c.sliding_window), np.float32) for _ in range(2 * len(c.sliding_layers))]
        self.full = [np.zeros(shape(self.context), np.float32) for _ in range(2 * len(c.full_layers))]
        self.ring_pos = np.full(max(c.sliding_window, 1), -1, np.int64)

    def caches(self) -> dict:
        out = {}
        for j in range(len(self.swa) // 2):
            out[f"swa_key_{j}"], out[f"swa_value_{j}"] = self.swa[2 * j], self.swa[2 * j + 1]
        for j in range(len(self.full) // 2):
            out[f"full_key_{j}"], out[f"full_value_{j}"] = self.full[2 * j], self.full[2 * j + 1]
        return out

    def inputs(self, embeds: np.ndarray, block: int, pad: np.ndarray | None = None) -> dict:
        """Graph inputs for `len(embeds)` real tokens at positions pos.. padded to `block` with the
        `pad` embedding row. Padding rows are computed and dropped; a real row keeps them ordinary
        activations (an all-zero row has mean(x^2) + eps below one uint16 step of the norm's range,
        and its 0/0 polluted both the quantized outputs and the calibration ranges)."""
        c, n, w = self.cfg, len(embeds), self.cfg.sliding_window
        x = np.zeros((1, block, c.hidden_size), np.float32)
        x[0, :n] = embeds
        if pad is not None and n < block:
            x[0, n:] = pad
        positions = np.arange(self.pos, self.pos + block)
        cf, sf = (t.numpy() for t in rope_table(positions, c.rotary_dim(FULL), c.rope_theta(FULL)))
        cs, ss = (t.numpy() for t in rope_table(positions, c.rotary_dim(SLIDING), c.rope_theta(SLIDING)))
        causal = np.where(np.tril(np.ones((block, block), bool)), 0.0, MASK).astype(np.float32)
        mf = np.full((1, 1, block, self.context + block), MASK, np.float32)
        mf[..., :self.pos] = 0.0
        mf[0, 0, :, self.context:] = causal
        q = positions[:, None]
        ring_ok = (self.ring_pos[None, :w] >= 0) & (q - self.ring_pos[None, :w] < w)
        new_ok = (positions[None, :] <= q) & (q - positions[None, :] < w)
        ms = np.where(np.concatenate([ring_ok, new_ok], axis=1), 0.0, MASK).astype(np.float32)[None, None]
        return {"inputs_embeds": x, "cos_full": cf[None], "sin_full": sf[None], "cos_swa": cs[None],
                "sin_swa": ss[None], "mask_full": mf, "mask_swa": ms, **self.caches()}

    def write(self, out: dict, n: int) -> None:
        """Write the first n new tokens' K/V: full layers at slot = position, sliding layers at
        slot = position mod W (the ring's write position)."""
        w = self.cfg.sliding_window
        for t in range(n):
            p = self.pos + t
            for j in range(len(self.full) // 2):
                self.full[2 * j][:, :, p] = out[f"new_full_key_{j}"][:, :, t]
                self.full[2 * j + 1][:, :, p] = out[f"new_full_value_{j}"][:, :, t]
            if self.swa:
                s = p % w
                for j in range(len(self.swa) // 2):
                    self.swa[2 * j][:, :, s] = out[f"new_swa_key_{j}"][:, :, t]
                    self.swa[2 * j + 1][:, :, s] = out[f"new_swa_value_{j}"][:, :, t]
                self.ring_pos[s] = p
        self.pos += n


@dataclass
class Generation:
    tokens: list                 # generated ids
    logits: list                 # [V] fp32 logits that chose each token
    prompt_len: int


class Session:
    """One sequence through `graphs`: prefill in blocks of N tokens, then single-token decode."""

    def __init__(self, graphs, cfg: SparkConfig, embedding: np.ndarray, prefill_tokens: int, context: int):
        self.graphs, self.cfg, self.embedding = graphs, cfg, embedding
        self.block = prefill_tokens
        self.state = KVState(cfg, context)

    def _run(self, name: str, ids: list[int], block: int) -> np.ndarray:
        if self.state.pos + len(ids) > self.state.context:
            raise UsageError(f"the sequence needs {self.state.pos + len(ids)} positions but the graphs have "
                             f"{self.state.context} context slots; rebuild with a larger --context-length")
        pad_id = self.cfg.pad_token_id if isinstance(self.cfg.pad_token_id, int) and \
            0 <= self.cfg.pad_token_id < len(self.embedding) else ids[-1]
        out = self.graphs(name, self.state.inputs(self.embedding[np.asarray(ids, np.int64)], block,
                                                  self.embedding[pad_id]))
        self.state.write(out, len(ids))
        return out["logits"][0, :len(ids)]

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Logits [len(ids), V] of every prompt token."""
        rows = [self._run("prefill", ids[s:s + self.block], self.block) for s in range(0, len(ids), self.block)]
        return np.concatenate(rows)

    def decode(self, token: int) -> np.ndarray:
        return self._run("decode", [token], 1)[0]


def generate(graphs, cfg, embedding, prompt: list[int], max_tokens: int, prefill_tokens: int, context: int,
             stop: tuple[int, ...] = ()) -> Generation:
    """Greedy decoding through prefill + decode graphs."""
    if not prompt:
        raise UsageError("empty prompt: give some text (or ids)")
    s = Session(graphs, cfg, embedding, prefill_tokens, context)
    last = s.prefill(prompt)[-1]
    tokens, logits = [], []
    tick = frame_meter("generate", max_tokens, bound=True, unit="tokens")
    while len(tokens) < max_tokens:
        tok = int(np.argmax(last))
        tokens.append(tok)
        logits.append(last)
        tick()
        if tok in stop or len(tokens) == max_tokens:
            break
        last = s.decode(tok)
    return Generation(tokens, logits, len(prompt))


def teacher_forced(graphs, cfg, embedding, prompt: list[int], tokens: list[int], prefill_tokens: int,
                   context: int) -> list[np.ndarray]:
    """The logits a build computes for each step of a given (fp32) continuation."""
    s = Session(graphs, cfg, embedding, prefill_tokens, context)
    out = [s.prefill(prompt)[-1]]
    tick = frame_meter("teacher-forced", len(tokens) - 1, unit="tokens")
    for tok in tokens[:-1]:
        out.append(s.decode(tok))
        tick()
    return out
