"""Spark-X2.5 checkpoints in the official Hugging Face layout: config.json, model.safetensors,
tokenizer.json + tokenizer_config.json (+ generation_config.json). Safetensors only, never pickles,
no remote code (the released repo's modeling_spark.py is not imported).

Tensor names (modeling_spark.py `Spark2_5ForCausalLM`, confirmed by the MLX port's `sanitize`):
  model.embedding.weight                              [V, H]   (tied: also the LM head)
  model.layers.{i}.self_attn.q_k_v_proj.weight        [(h + 2 kv) * hd, H]   fused, rows q | k | v
  model.layers.{i}.self_attn.g_proj.weight            [h, H]   per-head output gate (headwise gate)
  model.layers.{i}.self_attn.out_proj.weight          [H, h * hd]
  model.layers.{i}.mlp.{gate,up,down}_proj.weight
  model.layers.{i}.{input,post_attention}_layernorm.weight
  model.norm.weight;  lm_head.weight only when tie_word_embeddings is false
(+ .bias of the attention linears with attention_bias, of the MLP with mlp_bias).
"""
from __future__ import annotations

import json
from pathlib import Path

from ...core import UsageError
from ...modeling.checkpoint import DEMO_MARKER, demo_info
from ...modeling.checkpoint import check_directory as _check_directory
from ...weights import TensorDecl, load_tensors, refuse_pickles
from .config import FULL, SLIDING, SparkConfig, read_config


def tensor_table(c: SparkConfig) -> dict[str, TensorDecl]:
    """Official names and shapes for a config. Init values only matter for seeded checkpoints: they are
    chosen so the tiny demo generates varied tokens (not a copy of its input) with clear top-1 margins."""
    t: dict[str, TensorDecl] = {}
    h, hd = c.hidden_size, c.head_dim

    def linear(name, out_f, in_f, bias, gain=1.0):
        t[name + ".weight"] = TensorDecl((out_f, in_f), ("normal", gain * in_f ** -0.5))
        if bias:
            t[name + ".bias"] = TensorDecl((out_f,), ("normal", 0.02))

    t["model.embedding.weight"] = TensorDecl((c.vocab_size, h), ("normal", 0.3))
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        linear(p + "self_attn.q_k_v_proj", (c.num_attention_heads + 2 * c.num_key_value_heads) * hd, h,
               c.attention_bias)
        if c.headwise_attn_output_gate:
            linear(p + "self_attn.g_proj", c.num_attention_heads, h, c.attention_bias)
        linear(p + "self_attn.out_proj", h, c.num_attention_heads * hd, c.attention_bias, gain=1.5)
        linear(p + "mlp.gate_proj", c.intermediate_size, h, c.mlp_bias)
        linear(p + "mlp.up_proj", c.intermediate_size, h, c.mlp_bias)
        linear(p + "mlp.down_proj", h, c.intermediate_size, c.mlp_bias, gain=1.5)
        t[p + "input_layernorm.weight"] = TensorDecl((h,), ("uniform", 0.8, 1.2))
        t[p + "post_attention_layernorm.weight"] = TensorDecl((h,), ("uniform", 0.8, 1.2))
    t["model.norm.weight"] = TensorDecl((h,), ("uniform", 0.8, 1.2))
    if not c.tie_word_embeddings:
        linear("lm_head", c.vocab_size, h, False)
    return t


def check_directory(checkpoint: Path) -> None:
    _check_directory(checkpoint, "config.json and model.safetensors")
    refuse_pickles(checkpoint)


def load(checkpoint: Path) -> tuple[SparkConfig, dict]:
    """(config, {official name: fp32 torch tensor}); every missing or misshapen tensor is named."""
    check_directory(checkpoint)
    cfg = read_config(checkpoint)
    weights = checkpoint / "model.safetensors"
    if not weights.exists() and (checkpoint / "model.safetensors.index.json").exists():
        raise UsageError(f"{checkpoint}: sharded safetensors (model.safetensors.index.json) are not supported "
                         f"yet; merge the shards into model.safetensors")
    return cfg, load_tensors(weights, tensor_table(cfg))


# ---------------------------------------------------------------------------------------------
# Seeded checkpoints in the official layout
# ---------------------------------------------------------------------------------------------

def _pattern(n: int) -> list[str]:
    return [FULL if i % 4 == 3 else SLIDING for i in range(n)]


ROPE = {FULL: {"rope_theta": 5000000, "partial_rotary_factor": 0.25},
        SLIDING: {"rope_theta": 10000, "partial_rotary_factor": 1.0}}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def geometry(size: str) -> SparkConfig:
    """tiny: small widths, the real structure ([sliding x3, full], 8 q / 2 kv heads, sigmoid head gate,
    partial rotary 0.25 on full layers, tied embeddings) and a 16-token window tests can cross.
    1.7b: Spark-X2.5-1.7B's published shape (28 layers, H 2048, 8 x 256 q / 2 kv, window 512;
    intermediate 6656 from the released configuration's defaults -- verify against a real config.json)."""
    if size == "tiny":
        return SparkConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=32, layer_types=tuple(_pattern(4)),
                           sliding_window=16, rope_parameters=ROPE, max_position_embeddings=4096,
                           bos_token_id=None, eos_token_id=_eos_id(), pad_token_id=_eos_id() - 2)
    if size == "1.7b":
        return SparkConfig(vocab_size=131072, hidden_size=2048, intermediate_size=6656, num_hidden_layers=28,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                           layer_types=tuple(_pattern(28)), sliding_window=512, rope_parameters=ROPE,
                           eos_token_id=_eos_id(), pad_token_id=_eos_id() - 2)
    raise UsageError(f"--size must be 1.7b (or tiny), got '{size}'")


def _eos_id() -> int:
    return len(_byte_alphabet()) + len(_merges()) + 2        # <|im_end|>


def write_checkpoint(directory: Path, *, size: str = "tiny", seed: int = 0,
                     label: str = "demo, random weights") -> Path:
    """A seeded checkpoint in the official layout. Returns the directory."""
    from ...weights import seeded_tensors, write_safetensors

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = geometry(size)
    marker = {DEMO_MARKER: {"seed": seed, "label": label, "size": size}}
    (directory / "config.json").write_text(json.dumps({**cfg.to_json(), "dtype": "bfloat16", **marker}, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id, "do_sample": False}, indent=2))
    table = tensor_table(cfg)
    if size == "tiny":
        write_safetensors(directory / "model.safetensors", seeded_tensors(table, seed))
    else:
        _write_large(directory / "model.safetensors", table, seed)
    write_tokenizer(directory)
    return directory


def write_real_shape(directory: Path, size: str, seed: int = 0) -> Path:
    geometry(size)
    if (directory / "model.safetensors").exists() and demo_info(directory).get("size") == size:
        return directory                      # 3.4 GB: written once per output directory
    return write_checkpoint(directory, size=size, seed=seed, label=f"random weights at real {size} shapes")


def _write_large(path: Path, table: dict, seed: int) -> None:
    """Real-shape random weights in bf16 (as released), generated by torch."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(table):
        kind, *args = table[name].init
        shape = table[name].shape
        if kind == "normal":
            x = torch.randn(shape, generator=g) * args[0]
        else:
            x = torch.rand(shape, generator=g) * (args[1] - args[0]) + args[0]
        tensors[name] = x.to(torch.bfloat16)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


# ---- tokenizer (byte-level BPE, stored as tokenizer.json: the fast-tokenizer file, pure data)

def _byte_alphabet() -> list[str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


_WORDS = ("Ġthe", "Ġand", "Ġof", "Ġto", "Ġis", "ing", "tion", "Ġa", "er", "Ġin")


def _merges() -> list[tuple[str, str]]:
    merges, seen = [], set()
    for w in _WORDS:
        cur = w[0]
        for ch in w[1:]:
            if cur + ch not in seen:
                merges.append((cur, ch))
                seen.add(cur + ch)
            cur += ch
    return merges


def write_tokenizer(directory: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    merges = _merges()
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1048576, "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False},
        indent=1))
