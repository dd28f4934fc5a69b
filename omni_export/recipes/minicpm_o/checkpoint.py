"""MiniCPM-o 4.5 checkpoint layout for the voice path's TTS head: config, tensor table, loading,
seeded writers (tiny demo / tests, random weights at the real shapes).

Official layout (openbmb/MiniCPM-o-4_5): <dir>/config.json (model_type "minicpmo", the TTS head's
config under "tts_config"), weights as safetensors, either one model.safetensors or shards named by
model.safetensors.index.json ("weight_map": tensor -> shard file). The TTS head's tensors are the
"tts." ones (names in `tts_tensors`); the LLM ("llm."), vision ("vpm.", "resampler.") and audio
encoder ("apm.", "audio_projection_layer.") tensors are never read. Pickled weights are refused.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from ...core import UsageError
from ...modeling.checkpoint import DEMO_MARKER, demo_label, demo_seed  # noqa: F401 (the recipe's names)
from ...modeling.checkpoint import check_directory, read_json as _read_json
from ...weights import TensorDecl, load_tensors, read_header, refuse_pickles

MODEL_TYPE = "minicpmo"
INDEX = "model.safetensors.index.json"
_MAX_DIM, _MAX_COUNT, _MAX_VOCAB = 65536, 256, 1 << 22


@dataclass(frozen=True)
class TTSConfig:
    """config.json -> tts_config (MiniCPMTTSConfig). Defaults are upstream's; rms_norm_eps and
    rope_theta are not in MiniCPMTTSConfig, so LlamaConfig's defaults (1e-6, 10000) apply."""
    llm_dim: int = 4096
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    num_hidden_layers: int = 20
    max_position_embeddings: int = 4096
    num_audio_tokens: int = 6562
    num_text_tokens: int = 152064
    num_vq: int = 1
    audio_bos_token_id: int = 151687
    text_eos_token_id: int = 151692
    normalize_projected_hidden: bool = True
    projector_type: str = "mlp"
    condition_type: str = "hidden_text_merge"
    backbone_model: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    top_k: int = 25
    top_p: float = 0.85
    repetition_penalty: float = 1.05
    temperature: float = 0.8

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_code(self) -> int:
        """Non-streaming generation stops on the last code (num_audio_tokens - 1)."""
        return self.num_audio_tokens - 1

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "TTSConfig":
        kw = {}
        for f in fields(cls):
            if f.name in d:
                kw[f.name] = _typed(f"tts_config.{f.name}", d[f.name], type(getattr(cls, f.name)), where)
        cfg = cls(**kw)
        cfg.validate(where)
        return cfg

    def validate(self, where: str) -> None:
        for name in ("llm_dim", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "num_hidden_layers", "max_position_embeddings", "num_audio_tokens", "num_text_tokens"):
            v = getattr(self, name)
            limit = _MAX_VOCAB if name in ("num_text_tokens", "num_audio_tokens") else \
                _MAX_COUNT if name == "num_hidden_layers" else _MAX_DIM
            if v <= 0 or v > limit:
                raise UsageError(f"{where}: tts_config.{name} = {v} must be in [1, {limit}]; the config is corrupt")
        if self.backbone_model != "llama" or self.condition_type != "hidden_text_merge":
            raise UsageError(f"{where}: tts_config backbone_model '{self.backbone_model}' / condition_type "
                             f"'{self.condition_type}' unsupported; MiniCPM-o 4.5 uses llama / hidden_text_merge")
        if self.num_vq != 1:
            raise UsageError(f"{where}: tts_config.num_vq = {self.num_vq}; MiniCPM-o 4.5 has one codebook "
                             f"(num_vq 1): is this a MiniCPM-o 2.6 checkpoint?")
        if self.projector_type != "mlp":
            raise UsageError(f"{where}: tts_config.projector_type '{self.projector_type}' unsupported (mlp)")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise UsageError(f"{where}: tts_config.hidden_size must divide by num_attention_heads, and "
                             f"num_attention_heads by num_key_value_heads")
        if self.head_dim % 2:
            raise UsageError(f"{where}: tts_config head dim {self.head_dim} must be even (RoPE)")
        for tok in ("audio_bos_token_id", "text_eos_token_id"):
            if not 0 <= getattr(self, tok) < self.num_text_tokens:
                raise UsageError(f"{where}: tts_config.{tok} = {getattr(self, tok)} is outside emb_text "
                                 f"({self.num_text_tokens} rows)")
        for name in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise UsageError(f"{where}: tts_config.{name} must be a positive finite number, got {v!r}")

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _typed(name: str, v, kind: type, where: str):
    if kind is bool:
        if not isinstance(v, bool):
            raise UsageError(f"{where}: {name} must be true or false, got {json.dumps(v)[:40]}")
        return v
    if kind is int:
        if type(v) is not int:
            raise UsageError(f"{where}: {name} must be an integer, got {json.dumps(v)[:40]}")
        return v
    if kind is float:
        if type(v) not in (int, float):
            raise UsageError(f"{where}: {name} must be a number, got {json.dumps(v)[:40]}")
        return float(v)
    if not isinstance(v, str):
        raise UsageError(f"{where}: {name} must be a string, got {json.dumps(v)[:40]}")
    return v


# ------------------------------------------------------------------------------------- tensors

def tts_tensors(c: TTSConfig) -> dict[str, TensorDecl]:
    """The TTS head's official tensor names (prefix "tts.") and shapes. The head's Linear is a
    torch weight_norm parametrisation: original0 = g [V, 1], original1 = v [V, H] (folded at load).
    tts.model.embed_tokens (the Llama's unused 32000-row table) and tts.projector_spk (voice cloning)
    are not needed for generation and are not read."""
    h, hl, i, v = c.hidden_size, c.llm_dim, c.intermediate_size, c.num_audio_tokens
    hd, kv = c.head_dim, c.num_key_value_heads
    t = {
        "tts.emb_text.weight": TensorDecl((c.num_text_tokens, h)),
        "tts.projector_semantic.linear1.weight": TensorDecl((h, hl), ("normal", 1.0 / math.sqrt(hl))),
        "tts.projector_semantic.linear1.bias": TensorDecl((h,), ("normal", 0.02)),
        "tts.projector_semantic.linear2.weight": TensorDecl((h, h), ("normal", 1.0 / math.sqrt(h))),
        "tts.projector_semantic.linear2.bias": TensorDecl((h,), ("normal", 0.02)),
        "tts.emb_code.0.weight": TensorDecl((v, h), ("normal", 0.5)),
        "tts.head_code.0.parametrizations.weight.original0": TensorDecl((v, 1), ("uniform", 0.5, 1.5)),
        "tts.head_code.0.parametrizations.weight.original1": TensorDecl((v, h), ("normal", 0.05)),
        "tts.model.norm.weight": TensorDecl((h,), ("uniform", 0.8, 1.2)),
    }
    std = 1.0 / math.sqrt(h)
    for n in range(c.num_hidden_layers):
        p = f"tts.model.layers.{n}."
        t.update({
            p + "input_layernorm.weight": TensorDecl((h,), ("uniform", 0.8, 1.2)),
            p + "post_attention_layernorm.weight": TensorDecl((h,), ("uniform", 0.8, 1.2)),
            p + "self_attn.q_proj.weight": TensorDecl((c.num_attention_heads * hd, h), ("normal", std)),
            p + "self_attn.k_proj.weight": TensorDecl((kv * hd, h), ("normal", std)),
            p + "self_attn.v_proj.weight": TensorDecl((kv * hd, h), ("normal", std)),
            p + "self_attn.o_proj.weight": TensorDecl((h, c.num_attention_heads * hd), ("normal", std / 2)),
            p + "mlp.gate_proj.weight": TensorDecl((i, h), ("normal", std)),
            p + "mlp.up_proj.weight": TensorDecl((i, h), ("normal", std)),
            p + "mlp.down_proj.weight": TensorDecl((h, i), ("normal", 1.0 / math.sqrt(i) / 2)),
        })
    return t


# ------------------------------------------------------------------------------------- reading

def read_json(path: Path, what: str) -> dict:
    return _read_json(path, what, "a MiniCPM-o 4.5 checkpoint directory holds config.json and safetensors weights")


def read_config(checkpoint: Path) -> TTSConfig:
    check_directory(checkpoint, "config.json and the safetensors weights of a MiniCPM-o 4.5 download")
    path = checkpoint / "config.json"
    raw = read_json(path, "model config")
    found = raw.get("model_type")
    if found != MODEL_TYPE:
        shown = found if isinstance(found, str) else json.dumps(found)
        raise UsageError(f"{path}: model_type is '{shown[:60]}', expected '{MODEL_TYPE}'; point --checkpoint "
                         f"at a MiniCPM-o 4.5 checkpoint (openbmb/MiniCPM-o-4_5)")
    tts = raw.get("tts_config")
    if not isinstance(tts, dict):
        raise UsageError(f"{path}: no tts_config object; this MiniCPM-o checkpoint has no TTS head "
                         f"(init_tts false?)")
    return TTSConfig.from_dict(tts, str(path))


def load_tts_tensors(checkpoint: Path, cfg: TTSConfig) -> dict:
    """The TTS head's tensors as fp32 torch tensors, from one model.safetensors or the shards an
    index names; the head's weight norm is folded: W = g * v / ||v|| (norm over each output row)."""
    table = tts_tensors(cfg)
    single, index = checkpoint / "model.safetensors", checkpoint / INDEX
    if index.exists():
        out = {}
        for shard, names in _shards(index, checkpoint, table).items():
            out.update(load_tensors(checkpoint / shard, {n: table[n] for n in names}))
    elif single.exists() or single.is_symlink():
        out = load_tensors(single, table)
    else:
        refuse_pickles(checkpoint)          # pytorch_model.bin & co: named, never opened
        raise UsageError(f"{checkpoint}: no model.safetensors or {INDEX}; MiniCPM-o weights must be safetensors")
    g = out.pop("tts.head_code.0.parametrizations.weight.original0")
    v = out.pop("tts.head_code.0.parametrizations.weight.original1")
    norm = v.norm(dim=1, keepdim=True)
    if bool((norm == 0).any()):
        raise UsageError(f"{checkpoint}: tts.head_code.0 has an all-zero weight-norm direction row; "
                         f"the checkpoint is corrupt")
    out["tts.head_code.0.weight"] = g * v / norm
    return out


def _shards(index: Path, checkpoint: Path, table: dict) -> dict[str, list[str]]:
    raw = read_json(index, "weight index")
    wm = raw.get("weight_map")
    if not isinstance(wm, dict):
        raise UsageError(f"{index}: no weight_map object; re-download the checkpoint's index")
    by_file: dict[str, list[str]] = {}
    for name, decl in table.items():
        f = wm.get(name)
        if f is None:
            if decl.required:
                raise UsageError(f"{index}: tensor '{name}' is not in the weight_map; is this a MiniCPM-o 4.5 "
                                 f"checkpoint with its TTS head?")
            continue
        if not isinstance(f, str) or "/" in f or "\\" in f or f.startswith("."):
            raise UsageError(f"{index}: weight_map entry for '{name}' is not a file name in the checkpoint")
        if Path(f).suffix != ".safetensors":
            raise UsageError(f"{index}: '{name}' is stored in {f}, not safetensors; omni-export never unpickles")
        by_file.setdefault(f, []).append(name)
    for f in by_file:
        read_header(checkpoint / f) if (checkpoint / f).exists() else None
    return by_file


# ------------------------------------------------------------------------- seeded checkpoints

TINY = TTSConfig(llm_dim=96, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                 num_hidden_layers=2, max_position_embeddings=4096)
REAL = TTSConfig()      # MiniCPM-o 4.5's published tts_config (hidden 768, 20 layers, 12 heads, 6562 codes)


def write_checkpoint(directory: Path, *, cfg: TTSConfig = TINY, seed: int = 0, label: str = "demo, random weights",
                     shards: int = 1) -> Path:
    """A seeded checkpoint in the official layout: config.json (model_type minicpmo, tts_config) and the
    TTS head's tensors in model.safetensors, or in `shards` files named by model.safetensors.index.json."""
    from ...weights import seeded_tensors, write_safetensors

    directory.mkdir(parents=True, exist_ok=True)
    tts = {k: v for k, v in cfg.to_json().items() if k not in ("rms_norm_eps", "rope_theta")}
    config = {"architectures": ["MiniCPMO"], "model_type": MODEL_TYPE, "version": "4.5", "init_tts": True,
              "tts_config": {**tts, "model_type": "minicpmtts"},
              DEMO_MARKER: {"seed": seed, "label": label}}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    from . import token2wav as t2w

    from .flow_encoder import REAL_ENCODER, TINY_ENCODER

    from .hift import REAL_HIFT, TINY_HIFT, write_hift

    tiny = cfg == TINY
    t2w.write_flow(directory / "assets" / "token2wav", t2w.TINY_DIT if tiny else t2w.REAL_DIT, seed + 1,
                   TINY_ENCODER if tiny else REAL_ENCODER)
    write_hift(directory / "assets" / "token2wav", TINY_HIFT if tiny else REAL_HIFT, seed + 3)
    tensors = seeded_tensors(tts_tensors(cfg), seed)
    if shards <= 1:
        write_safetensors(directory / "model.safetensors", tensors)
        return directory
    names = sorted(tensors)
    files = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    wm = {}
    for k, f in enumerate(files):
        part = names[k::shards]
        write_safetensors(directory / f, {n: tensors[n] for n in part})
        wm.update({n: f for n in part})
    (directory / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": wm}, indent=2))
    return directory


def write_real_shape(directory: Path, seed: int = 0) -> Path:
    """Random weights at MiniCPM-o 4.5's TTS-head shapes (measuring export cost, not for listening)."""
    return write_checkpoint(directory, cfg=REAL, seed=seed, label="random weights at MiniCPM-o 4.5 TTS shapes")
