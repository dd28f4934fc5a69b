"""Spark-X2.5 loader: checkpoint -> graphs and their real inputs, for the generic pipeline.

Real inputs come from the fp32 graphs themselves: the recipe's calibration prompts are tokenised
with the checkpoint's tokenizer and generated greedily through the eager prefill + decode graphs,
and every graph call is captured (Capture); the held-out prompts are captured the same way and only
ever used for parity. Decode calls run past the sliding window, so the ring buffer wraps in both sets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from ...artifacts.manifest import weight_files
from ...core import Graph, Samples, UsageError
from . import checkpoint as ck
from . import host, prompts
from .config import FULL, SLIDING, SparkConfig
from .recipe import RECIPE

CALIBRATION_TOKENS = 16       # greedy tokens generated per calibration prompt
HELDOUT_TOKENS = 24
# Decode calls see one token each, so their activation ranges need many more calls than prefill's
# (32 decode calls left held-out activations outside the calibrated ranges: 18.9 dB on the tiny
# demo's HTP w8a16 decode); both are capped by bytes, as real-size decode samples carry the caches.
CALIBRATION_PER_GRAPH = {"prefill": 128, "decode": 256}
CALIBRATION_BYTES = 2 << 30
COVERAGE_TOKENS = 32          # embedding rows fed to calibrate the input range (see _cover_embedding)
HELDOUT_PER_GRAPH = 12


@dataclass
class Spark:
    path: Path
    options: dict
    cfg: SparkConfig
    tensors: dict
    info: dict = field(default_factory=dict)
    demo_seed: int | None = None
    capture_cache: dict | None = None       # its inputs are captured at load, never cached
    _samples: dict | None = None

    @property
    def seeds(self) -> dict:
        s = {"calibration_generations": "greedy", "heldout_generations": "greedy"}
        if self.demo_seed is not None:
            s["demo_checkpoint"] = self.demo_seed
        return s

    @property
    def prefill_tokens(self) -> int:
        return int(self.options["prefill-tokens"])

    @property
    def context(self) -> int:
        return int(self.options["context-length"])

    def sizes(self) -> dict:
        c = self.cfg
        return {"H": c.hidden_size, "V": c.vocab_size, "KV": c.num_key_value_heads, "HD": c.head_dim,
                "Rf": c.rotary_dim(FULL), "Ls": len(c.sliding_layers), "Lf": len(c.full_layers),
                "W": c.sliding_window, "C": self.context, "N": self.prefill_tokens}

    def components(self) -> tuple[str, ...]:
        return tuple(c.name for c in RECIPE.components)

    @cached_property
    def embedding(self) -> np.ndarray:
        return self.tensors["model.embedding.weight"].numpy()

    @cached_property
    def _module(self):
        from .modules import SparkStep

        return SparkStep(self.cfg, self.tensors).eval()

    def graph(self, component: str) -> Graph:
        return RECIPE.graph(component, self._module, self.sizes())

    @cached_property
    def tokenizer(self):
        from ...text_tokenizer import load as load_tokenizer

        return load_tokenizer(self.path)

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        bad = [i for i in ids if not 0 <= i < self.cfg.vocab_size]
        if bad:
            raise UsageError(f"{self.path}: the tokenizer gives id {bad[0]} but the model's vocab_size is "
                             f"{self.cfg.vocab_size}; tokenizer and weights do not belong together")
        return ids

    @property
    def stop_ids(self) -> tuple[int, ...]:
        e = self.cfg.eos_token_id
        return tuple(e) if isinstance(e, list) else ((e,) if isinstance(e, int) else ())

    def generate(self, graphs, ids: list[int], max_tokens: int, stop: bool = True) -> host.Generation:
        return host.generate(graphs, self.cfg, self.embedding, ids, max_tokens, self.prefill_tokens,
                             self.context, self.stop_ids if stop else ())

    def teacher_forced(self, graphs, ids: list[int], tokens: list[int]) -> list[np.ndarray]:
        return host.teacher_forced(graphs, self.cfg, self.embedding, ids, tokens, self.prefill_tokens, self.context)

    def prompt_ids(self, which: str, new_tokens: int = 0) -> list[list[int]]:
        """The recipe's prompts, tokenised; each cut to leave room for `new_tokens` in the context."""
        items = prompts.CALIBRATION if which == "calibration" else prompts.HELDOUT
        keep = max(1, self.context - new_tokens)
        return [self.encode(p)[:keep] for p in items]

    # ---- real inputs
    def coverage_ids(self, count: int = COVERAGE_TOKENS) -> list[int]:
        """Tokens whose embedding rows hold the table's most extreme entries (largest |value| first)."""
        e = np.abs(self.embedding).max(axis=1)
        return [int(i) for i in np.argsort(-e, kind="stable")[:count]]

    def _cover_embedding(self, cap) -> None:
        """The graphs' input is a row gather from a known table, so its true range is the table's, not
        what a few prompts happen to touch (held-out rows outside the calibrated range are clipped:
        the decode graph lost ~20 dB at its first norm on the tiny demo). One more calibration sequence
        feeds the rows holding the table's extreme entries, prefill for half and teacher-forced decode
        steps for the rest, all through the real fp32 graphs."""
        ids = self.coverage_ids()[: max(2, self.context - 1)]
        half = max(1, len(ids) // 2)
        s = host.Session(cap, self.cfg, self.embedding, self.prefill_tokens, self.context)
        s.prefill(ids[:half])
        for tok in ids[half:]:
            s.decode(tok)

    def samples(self, component: str, kind: str) -> Samples:
        if self._samples is None:
            self._samples = self._capture()
        calls, source = self._samples[kind].get(component, ([], ""))
        return Samples(calls, source)

    def _capture(self) -> dict:
        import torch

        from ...runtime.graphs import Capture, EagerGraphs

        threads = torch.get_num_threads()
        if self.cfg.hidden_size <= 256:          # tiny graphs: thread hand-offs cost more than they save
            torch.set_num_threads(1)
        try:
            result = {}
            for which, n_tok in (("calibration", CALIBRATION_TOKENS), ("heldout", HELDOUT_TOKENS)):
                cap = Capture(EagerGraphs(self))
                for ids in self.prompt_ids(which, n_tok):
                    self.generate(cap, ids, n_tok, stop=False)
                if which == "calibration":
                    self._cover_embedding(cap)
                src = (f"greedy fp32 generations ({n_tok} tokens) of the recipe's "
                       f"{len(self.prompt_ids(which))} {which} prompts")
                result[which] = {name: (_spread(calls, _limit(which, name, calls)), f"{src} ({len(calls)} calls captured)")
                                 for name, calls in cap.calls.items()}
            return result
        finally:
            torch.set_num_threads(threads)


def _limit(which: str, name: str, calls: list) -> int:
    if which == "heldout":
        return HELDOUT_PER_GRAPH
    per_call = sum(a.nbytes for a in calls[0].values()) if calls else 1
    return max(4, min(CALIBRATION_PER_GRAPH.get(name, 32), CALIBRATION_BYTES // per_call))


def _spread(calls: list, limit: int) -> list:
    if len(calls) <= limit:
        return list(calls)
    idx = np.linspace(0, len(calls) - 1, limit).round().astype(int)
    return [calls[i] for i in idx]


def load(checkpoint: Path | None, options: dict, scratch: Path) -> Spark:
    """Open a checkpoint (or write the tiny demo one under `scratch`). Options not given take defaults."""
    options = {**{o.name: o.default for o in RECIPE.options}, **{k: v for k, v in options.items() if v is not None}}
    for key, lo in (("prefill-tokens", 1), ("context-length", 2), ("e2e-tokens", 0)):
        v = options.get(key)
        if not (isinstance(v, int) and v >= lo):
            raise UsageError(f"--{key} must be an integer >= {lo} (got {v})")
    if options.get("random-weights"):
        checkpoint = ck.write_real_shape(Path(scratch) / f"random-{options.get('size')}", options.get("size") or "1.7b")
    elif checkpoint is None:
        checkpoint = ck.write_checkpoint(Path(scratch) / "demo-checkpoint")
    checkpoint = Path(checkpoint)
    cfg, tensors = ck.load(checkpoint)
    if not cfg.sliding_layers or not cfg.full_layers:
        raise UsageError(f"{checkpoint}: layer_types has only {cfg.layer_types[0]} layers; the spark graphs "
                         f"take both {SLIDING} and {FULL} layers (as every released Spark-X2.5 does)")
    if options["prefill-tokens"] > options["context-length"]:
        raise UsageError(f"--prefill-tokens ({options['prefill-tokens']}) must not exceed --context-length "
                         f"({options['context-length']})")
    info = ck.demo_info(checkpoint)
    model = Spark(checkpoint, options, cfg, tensors, demo_seed=info.get("seed") if info else None)
    model.info = {
        "path": str(checkpoint.resolve()),
        "label": info.get("label", "user checkpoint"),
        "demo": bool(info),
        "model_type": "spark2_5",
        "weights": weight_files(checkpoint),
        "config": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
                   "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                   "sliding_window": cfg.sliding_window, "sliding_layers": list(cfg.sliding_layers),
                   "full_layers": list(cfg.full_layers), "rotary_dim_full": cfg.rotary_dim(FULL),
                   "vocab": cfg.vocab_size, "tied_embeddings": cfg.tie_word_embeddings},
        "options": {k: v for k, v in model.sizes().items() if k in ("N", "C", "W")},
    }
    return model
