"""Spark-X2.5 `config.json` -> a validated SparkConfig. Data only: no remote code is executed.

Keys and semantics as the released checkpoint's configuration (model_type `spark2_5`,
architecture `Spark2_5ForCausalLM`), checked against its modeling file and the MLX port:
  layer_types        "sliding_attention" | "full_attention" per layer ([s, s, s, f] x 7 in 1.7B)
  sliding_window     a sliding layer's query at position q sees keys at q-W+1 .. q (W tokens, itself included)
  rope_parameters    {layer type: {rope_theta, partial_rotary_factor}}; missing -> theta 1e4, factor 1.0;
                     NeoX (rotate-half) RoPE on the first int(head_dim * factor) features of each head
  headwise_attn_output_gate / gate_attn_act_mode   out *= act(g_proj(x)) per head (sigmoid or silu)
  hidden_act         "gelu" (exact, erf) in the gate/up/down MLP; upstream refuses anything else
  tie_word_embeddings  logits = norm(h) @ model.embedding.weight^T
A key missing from config.json takes the default of the released Spark2_5Config class (no gate, untied
embeddings, kv heads = heads, theta 1e4); the released checkpoints set all of them explicitly.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...core import UsageError
from ...modeling.checkpoint import read_json
from ...modeling.geometry import TransformerGeometry

MODEL_TYPE = "spark2_5"
ARCHITECTURE = "Spark2_5ForCausalLM"
SLIDING, FULL = "sliding_attention", "full_attention"
_MAX_DIM = 1 << 18


@dataclass(frozen=True)
class SparkConfig(TransformerGeometry):
    vocab_size: int
    layer_types: tuple[str, ...]
    sliding_window: int
    rope_parameters: dict = field(default_factory=dict)
    rms_norm_eps: float = 1e-6
    hidden_act: str = "gelu"
    attention_bias: bool = False
    mlp_bias: bool = False
    headwise_attn_output_gate: bool = True
    gate_attn_act_mode: str = "sigmoid"
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 1048576
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None

    def rope_theta(self, layer_type: str) -> float:
        return float(self.rope_parameters.get(layer_type, {}).get("rope_theta", 10000.0))

    def rotary_dim(self, layer_type: str) -> int:
        f = float(self.rope_parameters.get(layer_type, {}).get("partial_rotary_factor", 1.0))
        return int(self.head_dim * f)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    def to_json(self) -> dict:
        d = asdict(self)
        d = {"vocab_size": d.pop("vocab_size"), **d}          # the order config.json has always had
        d["layer_types"] = list(self.layer_types)
        return {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, **d}


def read_config(checkpoint: Path) -> SparkConfig:
    path = checkpoint / "config.json"
    raw = read_json(path, "model config", "a Spark-X2.5 checkpoint directory holds config.json, model.safetensors "
                                          "and the tokenizer files")
    return parse(raw, path)


def _int(raw: dict, key: str, path: Path, lo: int = 1, hi: int = _MAX_DIM) -> int:
    v = raw.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise UsageError(f"{path}: '{key}' must be an integer in [{lo}, {hi}], got {json.dumps(v)[:40]}")
    return v


def parse(raw: dict, path: Path) -> SparkConfig:
    mt = raw.get("model_type")
    if mt != MODEL_TYPE:
        shown = mt if isinstance(mt, str) else json.dumps(mt)
        raise UsageError(f"{path}: model_type is '{str(shown)[:60]}', expected '{MODEL_TYPE}'; point "
                         f"--checkpoint at a Spark-X2.5 checkpoint (e.g. Spark-X2.5-1.7B)")
    n = _int(raw, "num_hidden_layers", path, hi=1024)
    heads = _int(raw, "num_attention_heads", path, hi=1024)
    kv = _int({**raw, "num_key_value_heads": raw.get("num_key_value_heads") or heads}, "num_key_value_heads",
              path, hi=1024)
    if heads % kv:
        raise UsageError(f"{path}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
    hidden = _int(raw, "hidden_size", path)
    head_dim = raw.get("head_dim") or hidden // heads
    if type(head_dim) is not int or head_dim < 2 or head_dim % 2:
        raise UsageError(f"{path}: head_dim must be an even positive integer, got {json.dumps(head_dim)[:40]}")
    types = raw.get("layer_types") or [FULL] * n
    if not isinstance(types, list) or len(types) != n or any(t not in (SLIDING, FULL) for t in types):
        raise UsageError(f"{path}: layer_types must list '{SLIDING}' or '{FULL}' for each of the {n} layers")
    window = raw.get("sliding_window")
    if SLIDING in types and (type(window) is not int or window < 1):
        raise UsageError(f"{path}: sliding layers need a positive integer sliding_window, got {json.dumps(window)[:40]}")
    act = raw.get("hidden_act", "gelu")
    if act != "gelu":
        raise UsageError(f"{path}: hidden_act '{str(act)[:40]}' is not supported; Spark-X2.5 uses 'gelu' "
                         f"(the released modeling file refuses anything else)")
    mode = raw.get("gate_attn_act_mode", "sigmoid")
    if mode not in ("sigmoid", "silu"):
        raise UsageError(f"{path}: gate_attn_act_mode must be 'sigmoid' or 'silu', got {str(mode)[:40]}")
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, dict) or any(not isinstance(v, dict) for v in rope.values()):
        raise UsageError(f"{path}: rope_parameters must map a layer type to {{rope_theta, partial_rotary_factor}}")
    cfg = SparkConfig(
        vocab_size=_int(raw, "vocab_size", path, hi=1 << 22), hidden_size=hidden,
        intermediate_size=_int(raw, "intermediate_size", path), num_hidden_layers=n,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, layer_types=tuple(types),
        sliding_window=int(window or 0), rope_parameters={k: dict(v) for k, v in rope.items()},
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), hidden_act=act,
        attention_bias=bool(raw.get("attention_bias", False)), mlp_bias=bool(raw.get("mlp_bias", False)),
        headwise_attn_output_gate=bool(raw.get("headwise_attn_output_gate", False)), gate_attn_act_mode=mode,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        max_position_embeddings=int(raw.get("max_position_embeddings") or 1048576),
        bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"))
    for t in set(types):
        r = cfg.rotary_dim(t)
        if not 2 <= r <= head_dim or r % 2:
            raise UsageError(f"{path}: rope_parameters['{t}'] gives a rotary dim of {r}; it must be even "
                             f"and within head_dim {head_dim}")
    return cfg
