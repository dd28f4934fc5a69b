"""Spark-X2.5 (1.7B): the recipe page. Data only; the loader (model.py) is imported when a run starts.

Shape symbols: H hidden, V vocab, KV kv heads, HD head dim, Rf rotary dim of the full layers
(HD * partial_rotary_factor = HD / 4), Ls / Lf sliding / full layers (21 / 7 in 1.7B), W sliding
window = ring slots (512), C context slots of the full layers, N prefill tokens per call.

Why the caches look like this: a sliding layer keeps a W-slot ring buffer (position p in slot
p mod W, the host's write position) so neither graph ever hands a recomputed window back across the
graph boundary (FACTS.md: that cost a fifth of every sliding layer on device); full layers keep a
C-slot cache. Each graph outputs only its new tokens' K/V; the host writes them (host.py). Masks and
cos/sin differ per layer type and are computed on the host. The token embedding table stays on the
host for the input gather; the tied LM head is inside the graphs, logits leave in fp32.
"""
from ...core import Component, LinkGroup, Precision, Recipe, RecipeOption, TensorSpec as T

F32 = "float32"
GATES = {Precision.FP16: 40.0, Precision.W8A16: 30.0, Precision.W8A8: 30.0, Precision.W4A16: 15.0}
# 4-bit weights: a user judges an int4 LLM by the tokens it picks, not by its logits' SNR (each int4
# linear alone is ~19 dB from fp32 at best: docs/quantization.md). At w4a16 the logits must pick fp32's
# top-1 on >= 90 % of rows, beside a 15 dB SNR floor on every output that still rejects an uncorrelated
# build (the study's uncalibrated w4a16 scored -1.6 dB).
TOP1 = {Precision.W4A16: 0.9}


def _step(name: str, p, doc: str) -> Component:
    kv = lambda prefix, slots, rep, d: (  # noqa: E731
        T(f"{prefix}_key_{{i}}", (1, "KV", slots, "HD"), F32, d, repeat=rep),
        T(f"{prefix}_value_{{i}}", (1, "KV", slots, "HD"), F32, d, repeat=rep))
    return Component(
        name=name, doc=doc,
        inputs=(T("inputs_embeds", (1, p, "H"), F32, "rows of model.embedding (host gather)"),
                T("cos_full", (1, p, "Rf"), F32, "RoPE cos of the full layers (partial rotary, theta 5e6)"),
                T("sin_full", (1, p, "Rf"), F32),
                T("cos_swa", (1, p, "HD"), F32, "RoPE cos of the sliding layers (theta 1e4)"),
                T("sin_swa", (1, p, "HD"), F32),
                T("mask_full", (1, 1, p, f"C+{p}"), F32, "additive, over [C cache slots, new tokens]"),
                T("mask_swa", (1, 1, p, f"W+{p}"), F32, "additive, over [W ring slots, new tokens]: the window"),
                *kv("swa", "W", "Ls", "ring buffer of sliding layer i (slot = position mod W)"),
                *kv("full", "C", "Lf", "cache of full layer i (slot = position)")),
        outputs=(T("logits", (1, p, "V"), F32, "fp32 logits (tied LM head)"),
                 T("hidden", (1, p, "H"), F32, "final-norm hidden state"),
                 *kv("new_swa", p, "Ls", "new tokens' K/V; the host writes slot position mod W"),
                 *kv("new_full", p, "Lf", "new tokens' K/V; the host writes slot = position")),
        gates_db=GATES, top1_min=TOP1, logits=("logits",), requires=("model",),
        per_channel_linears=True, weight_rounding="gptq")


COMPONENTS = (
    _step("prefill", "N", "N prompt tokens per call (AR-N) against the caches"),
    _step("decode", 1, "one token per call (AR-1) against the caches"),
)

RECIPE = Recipe(
    name="spark",
    doc="Spark-X2.5-1.7B hybrid sliding/full-attention LLM (prefill + decode, ring-buffer KV)",
    components=COMPONENTS,
    loader="omni_export.recipes.spark.model:load",
    tiny="omni_export.recipes.spark.checkpoint:write_checkpoint",
    end_to_end="omni_export.recipes.spark.e2e:run",
    synth="omni_export.recipes.spark.synth",
    bundle="omni_export.recipes.spark.bundle:host",
    also_attempt=(Precision.W8A8, Precision.W4A16),
    links=(LinkGroup("prefill+decode", ("prefill", "decode"),
                     "one context binary, the weights stored once, both graphs in it (AI Hub link job)"),),
    random_weights_keys=("size",),
    options=(
        RecipeOption("prefill-tokens", int, 128, "prefill: tokens per call (N)", range=(1, 8192)),
        RecipeOption("context-length", int, 1024, "full layers: KV cache slots (C) = prompt + generated tokens", range=(8, 32768)),
        RecipeOption("e2e-tokens", int, 16,
                     "end-to-end parity: greedy tokens generated per held-out prompt through the built graphs "
                     "(0 skips end-to-end parity)", range=(0, 4096)),
        RecipeOption("random-weights", bool, False,
                     "ignore --checkpoint; write a seeded checkpoint at the real shapes of --size (measuring only)"),
        RecipeOption("size", str, "1.7b", "with --random-weights: 1.7b"),
    ),
    version="1",
)
