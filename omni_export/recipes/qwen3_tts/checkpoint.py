"""Qwen3-TTS checkpoint layout: configs, the official tensor names, loading, tiny seeded writers.

Official layout (FACTS.md): <dir>/config.json (model_type qwen3_tts), <dir>/model.safetensors,
tokenizer files, <dir>/speech_tokenizer/config.json (model_type qwen3_tts_tokenizer_12hz) and
<dir>/speech_tokenizer/model.safetensors (encoder.* Mimi-style, decoder.* Code2Wav).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

from ...core import UsageError
from ...modeling.checkpoint import DEMO_MARKER, demo_label, demo_seed  # noqa: F401 (the recipe's names)
from ...modeling.checkpoint import check_directory, read_json as _read_json
from ...weights import TensorDecl, load_tensors, refuse_pickles

MODEL_TYPE = "qwen3_tts"
TOKENIZER_MODEL_TYPE = "qwen3_tts_tokenizer_12hz"


def read_json(path: Path, what: str) -> dict:
    return _read_json(path, what, "a Qwen3-TTS checkpoint has config.json and speech_tokenizer/config.json")


def _require_type(cfg: dict, path: Path, expected: str) -> None:
    found = cfg.get("model_type")
    if found != expected:
        shown = found if isinstance(found, str) else json.dumps(found)
        raise UsageError(f"{path}: model_type is '{shown[:60]}', expected '{expected}'; this is not a Qwen3-TTS "
                         f"12Hz checkpoint: point --checkpoint at one (e.g. Qwen3-TTS-12Hz-0.6B-CustomVoice)")


# ---------------------------------------------------------------------------------------------
# Code2Wav (speech tokenizer decoder)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Code2WavConfig:
    """`speech_tokenizer/config.json` -> decoder_config; defaults are upstream's."""
    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    head_dim: int = 0                 # 0: hidden_size // num_attention_heads (upstream's fallback)
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    @property
    def attn_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for r in (*self.upsample_rates, *self.upsampling_ratios):
            n *= r
        return n

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "Code2WavConfig":
        known = {f.name: f for f in fields(cls)}
        kw = {}
        for k, v in d.items():
            if k in known:
                kw[k] = _typed(k, v, type(getattr(cls, k)), where)
        cfg = cls(**kw)
        cfg.validate(where)
        return cfg

    def validate(self, where: str) -> None:
        ints = ("codebook_size", "codebook_dim", "hidden_size", "latent_dim", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "num_hidden_layers", "num_quantizers",
                "decoder_dim", "sliding_window")
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise UsageError(f"{where}: decoder_config.{name} must be a positive integer, got {v!r}")
            if v > _MAX_DIM:
                raise UsageError(f"{where}: decoder_config.{name} = {v} is beyond any real model "
                                 f"(limit {_MAX_DIM}); the config is corrupt")
        for name in ("num_hidden_layers", "num_quantizers"):
            if getattr(self, name) > _MAX_COUNT:
                raise UsageError(f"{where}: decoder_config.{name} = {getattr(self, name)} is beyond any real "
                                 f"model (limit {_MAX_COUNT}); the config is corrupt")
        if not 0 <= self.head_dim <= _MAX_DIM:
            raise UsageError(f"{where}: decoder_config.head_dim must be in [0, {_MAX_DIM}], got {self.head_dim}")
        if not (0 < len(self.upsample_rates) <= 8 and len(self.upsampling_ratios) <= 8):
            raise UsageError(f"{where}: decoder_config.upsample_rates / upsampling_ratios: 1 to 8 entries each")
        for name in ("rms_norm_eps", "rope_theta", "layer_scale_initial_scale"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise UsageError(f"{where}: decoder_config.{name} must be a positive finite number, got {v!r}")
        if self.hidden_act != "silu":
            raise UsageError(f"{where}: decoder_config.hidden_act '{self.hidden_act}' unsupported (silu)")
        if self.codebook_dim % 2:
            raise UsageError(f"{where}: decoder_config.codebook_dim must be even")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UsageError(f"{where}: num_attention_heads must be a multiple of num_key_value_heads")
        if self.decoder_dim % (2 ** len(self.upsample_rates)):
            raise UsageError(f"{where}: decoder_dim must divide by 2**len(upsample_rates)")
        if self.num_quantizers < 2:
            raise UsageError(f"{where}: num_quantizers must be >= 2 (1 semantic + acoustic)")
        for r in (*self.upsample_rates, *self.upsampling_ratios):
            if not isinstance(r, int) or isinstance(r, bool) or not 0 < r <= 64:
                raise UsageError(f"{where}: upsample rates must be integers in [1, 64], got {r!r}")

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["upsample_rates"] = list(self.upsample_rates)
        d["upsampling_ratios"] = list(self.upsampling_ratios)
        if not self.head_dim:
            d.pop("head_dim")
        return d


_MAX_DIM = 1 << 16        # widths: the released decoder's largest is 3072
_MAX_COUNT = 256          # layers, quantizers


def _typed(name: str, v, kind: type, where: str):
    """A decoder_config value of the type the field's default has; our error otherwise."""
    if v is None and name == "head_dim":
        return 0                      # upstream's fallback: hidden_size // num_attention_heads
    ok = {int: lambda x: type(x) is int, bool: lambda x: type(x) is bool, str: lambda x: isinstance(x, str),
          float: lambda x: type(x) in (int, float),
          tuple: lambda x: isinstance(x, list) and all(type(r) is int for r in x)}[kind](v)
    if not ok:
        expected = {int: "an integer", bool: "true or false", str: "a string", float: "a number",
                    tuple: "a list of integers"}[kind]
        raise UsageError(f"{where}: decoder_config.{name} must be {expected}, got {json.dumps(v)[:60]}")
    return tuple(v) if kind is tuple else (float(v) if kind is float else v)


def code2wav_tensors(c: Code2WavConfig) -> dict[str, TensorDecl]:
    """The official `decoder.*` tensor names (without the prefix), shapes and demo init."""
    t: dict[str, TensorDecl] = {}
    half = c.codebook_dim // 2

    def rvq(name: str, n: int) -> None:
        for i in range(n):
            base = f"quantizer.{name}.vq.layers.{i}._codebook."
            t[base + "cluster_usage"] = TensorDecl((c.codebook_size,), ("uniform", 0.5, 2.0))
            t[base + "embedding_sum"] = TensorDecl((c.codebook_size, half), ("normal", 0.25))
        # input_proj belongs to the encoder side of the quantizer: present, unused by decode.
        t[f"quantizer.{name}.input_proj.weight"] = TensorDecl((half, c.codebook_dim, 1), ("normal", 0.1), False)
        t[f"quantizer.{name}.output_proj.weight"] = TensorDecl((c.codebook_dim, half, 1), ("normal", half ** -0.5))

    rvq("rvq_first", 1)
    rvq("rvq_rest", c.num_quantizers - 1)
    conv(t, "pre_conv.conv", c.latent_dim, c.codebook_dim, 3)

    h, hd = c.hidden_size, c.attn_head_dim
    pt = "pre_transformer."
    linear(t, pt + "input_proj", h, c.latent_dim, bias=True)
    linear(t, pt + "output_proj", c.latent_dim, h, bias=True)
    t[pt + "norm.weight"] = TensorDecl((h,), ("uniform", 0.8, 1.2))
    for i in range(c.num_hidden_layers):
        p = f"{pt}layers.{i}."
        linear(t, p + "self_attn.q_proj", c.num_attention_heads * hd, h, bias=c.attention_bias)
        linear(t, p + "self_attn.k_proj", c.num_key_value_heads * hd, h, bias=c.attention_bias)
        linear(t, p + "self_attn.v_proj", c.num_key_value_heads * hd, h, bias=c.attention_bias)
        linear(t, p + "self_attn.o_proj", h, c.num_attention_heads * hd, bias=c.attention_bias)
        linear(t, p + "mlp.gate_proj", c.intermediate_size, h)
        linear(t, p + "mlp.up_proj", c.intermediate_size, h)
        linear(t, p + "mlp.down_proj", h, c.intermediate_size)
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[p + n + ".weight"] = TensorDecl((h,), ("uniform", 0.8, 1.2))
        for n in ("self_attn_layer_scale", "mlp_layer_scale"):
            t[p + n + ".scale"] = TensorDecl((h,), ("uniform", 0.01, 0.1))

    lat = c.latent_dim
    for j, factor in enumerate(c.upsampling_ratios):
        p = f"upsample.{j}."
        tconv(t, p + "0.conv", lat, lat, factor)
        conv(t, p + "1.dwconv.conv", lat, 1, 7)
        t[p + "1.norm.weight"] = TensorDecl((lat,), ("uniform", 0.8, 1.2))
        t[p + "1.norm.bias"] = TensorDecl((lat,), ("normal", 0.02))
        linear(t, p + "1.pwconv1", 4 * lat, lat, bias=True)
        linear(t, p + "1.pwconv2", lat, 4 * lat, bias=True)
        t[p + "1.gamma"] = TensorDecl((lat,), ("uniform", 0.1, 0.5))

    conv(t, "decoder.0.conv", c.decoder_dim, lat, 7)
    for i, rate in enumerate(c.upsample_rates):
        cin, cout = c.decoder_dim // 2 ** i, c.decoder_dim // 2 ** (i + 1)
        p = f"decoder.{i + 1}.block."
        snake(t, p + "0", cin)
        tconv(t, p + "1.conv", cin, cout, 2 * rate)
        for u in range(3):
            q = f"{p}{u + 2}."
            snake(t, q + "act1", cout)
            conv(t, q + "conv1.conv", cout, cout, 7)
            snake(t, q + "act2", cout)
            conv(t, q + "conv2.conv", cout, cout, 1, gain=0.3)
    out_dim = c.decoder_dim // 2 ** len(c.upsample_rates)
    n = len(c.upsample_rates) + 1
    snake(t, f"decoder.{n}", out_dim)
    conv(t, f"decoder.{n + 1}.conv", 1, out_dim, 7, gain=0.1)
    return t


def linear(t: dict, name: str, out_f: int, in_f: int, bias: bool = False) -> None:
    t[name + ".weight"] = TensorDecl((out_f, in_f), ("normal", in_f ** -0.5))
    if bias:
        t[name + ".bias"] = TensorDecl((out_f,), ("normal", 0.02))


def conv(t: dict, name: str, cout: int, cin_per_group: int, k: int, gain: float = 1.0) -> None:
    t[name + ".weight"] = TensorDecl((cout, cin_per_group, k), ("normal", gain * (cin_per_group * k) ** -0.5))
    t[name + ".bias"] = TensorDecl((cout,), ("normal", 0.02))


def tconv(t: dict, name: str, cin: int, cout: int, k: int) -> None:
    # ConvTranspose1d weight is [in, out, k]; each output sums about cin * 2 taps.
    t[name + ".weight"] = TensorDecl((cin, cout, k), ("normal", (cin * 2) ** -0.5))
    t[name + ".bias"] = TensorDecl((cout,), ("normal", 0.02))


def snake(t: dict, name: str, ch: int) -> None:
    # log-scale parameters: alpha = exp(a) sets the frequency, 1/exp(b) the magnitude; upstream
    # initialises both at 0 (alpha = beta = 1), the demo adds a little spread.
    t[name + ".alpha"] = TensorDecl((ch,), ("normal", 0.1))
    t[name + ".beta"] = TensorDecl((ch,), ("normal", 0.1))


@dataclass
class SpeechTokenizer:
    path: Path
    config: Code2WavConfig
    sample_rate: int
    tensors: dict          # decoder.* tensors without prefix, fp32 torch


def speech_tokenizer_dir(checkpoint: Path) -> Path:
    d = checkpoint / "speech_tokenizer"
    if not d.is_dir():
        raise UsageError(f"{checkpoint}: missing speech_tokenizer/ (the Code2Wav vocoder); "
                         f"download the whole Qwen3-TTS checkpoint")
    return d


def read_code2wav_config(checkpoint: Path) -> tuple[Code2WavConfig, dict]:
    d = speech_tokenizer_dir(checkpoint)
    path = d / "config.json"
    raw = read_json(path, "speech tokenizer config")
    _require_type(raw, path, TOKENIZER_MODEL_TYPE)
    dec = raw.get("decoder_config")
    if not isinstance(dec, dict):
        raise UsageError(f"{path}: missing decoder_config")
    return Code2WavConfig.from_dict(dec, str(path)), raw


def load_speech_tokenizer(checkpoint: Path) -> SpeechTokenizer:
    cfg, raw = read_code2wav_config(checkpoint)
    d = checkpoint / "speech_tokenizer"
    refuse_pickles(d)
    expected_hop = raw.get("decode_upsample_rate", cfg.samples_per_frame)
    if expected_hop != cfg.samples_per_frame:
        raise UsageError(f"{d / 'config.json'}: decode_upsample_rate {json.dumps(expected_hop)[:40]} does not "
                         f"match the product of the upsample rates ({cfg.samples_per_frame})")
    rate = raw.get("output_sample_rate", 24000)
    if type(rate) is not int or not 0 < rate <= 384000:
        raise UsageError(f"{d / 'config.json'}: output_sample_rate must be a positive integer (Hz), "
                         f"got {json.dumps(rate)[:40]}")
    tensors = load_tensors(d / "model.safetensors", code2wav_tensors(cfg), prefix="decoder.", lazy=True)
    return SpeechTokenizer(d, cfg, rate, tensors)


def check_root_config(checkpoint: Path) -> dict:
    check_directory(checkpoint, "config.json and speech_tokenizer/")
    path = checkpoint / "config.json"
    raw = read_json(path, "model config")
    _require_type(raw, path, MODEL_TYPE)
    refuse_pickles(checkpoint)
    return raw


# ---------------------------------------------------------------------------------------------
# Seeded checkpoints in the official layout (the embedded demo, the tests, real-shape benchmarks)
# ---------------------------------------------------------------------------------------------

# Small widths, real structure: 16 quantizers, 2048-entry codebooks, real upsample rates (1920 x).
TINY_CODE2WAV = Code2WavConfig(
    codebook_size=2048, codebook_dim=16, hidden_size=32, latent_dim=24, head_dim=16,
    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, num_hidden_layers=2,
    decoder_dim=48, sliding_window=72,
)
# The released 12 Hz speech tokenizer decoder (published speech_tokenizer/config.json).
REAL_CODE2WAV = Code2WavConfig(
    codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024, head_dim=64,
    num_attention_heads=16, num_key_value_heads=16, intermediate_size=1024, num_hidden_layers=8,
    decoder_dim=1536, sliding_window=72,
)


PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
    "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000,
}


def speech_tokenizer_config(c: Code2WavConfig) -> dict:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": TOKENIZER_MODEL_TYPE,
        "encoder_valid_num_quantizers": c.num_quantizers,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": c.samples_per_frame,
        "encode_downsample_rate": c.samples_per_frame,
        "decoder_config": c.to_json(),
    }


def write_checkpoint(directory: Path, *, code2wav: Code2WavConfig = TINY_CODE2WAV, seed: int = 0,
                     label: str = "demo, random weights", size: str = "tiny",
                     kind: str = "custom_voice", decisive: bool = False) -> Path:
    """Write a seeded checkpoint in the official layout (talker, predictor, speaker encoder for
    Base, tokenizer files, speech tokenizer). Returns the directory. `decisive` (the embedded demo):
    heads tied to embedding rows so greedy decisions have clear winners (demo.make_decisive); the
    golden fixtures keep i.i.d. heads, whose near-tie decisions test exactness harder."""
    from ...weights import prefixed, seeded_tensors, write_safetensors
    from . import demo

    directory.mkdir(parents=True, exist_ok=True)
    marker = {DEMO_MARKER: {"seed": seed, "label": label, "size": size, "kind": kind,
                            "heads": "decisive" if decisive else "random"}}
    st = directory / "speech_tokenizer"
    st.mkdir(exist_ok=True)
    st_config = speech_tokenizer_config(code2wav)
    tensors = prefixed(seeded_tensors(code2wav_tensors(code2wav), seed), "decoder.")
    if kind == "base" and code2wav in (TINY_CODE2WAV, REAL_CODE2WAV):
        # The speech tokenizer's encoder (reference audio -> codes, in-context cloning). Base only, so
        # the other kinds' files keep their bytes; MimiConfig's geometry beside the real decoder.
        from .speech_encoder import MIMI_SPEECH_ENCODER, TINY_SPEECH_ENCODER, speech_encoder_tensors

        enc = TINY_SPEECH_ENCODER if code2wav == TINY_CODE2WAV else MIMI_SPEECH_ENCODER
        st_config["encoder_config"] = enc.to_json()
        tensors.update(prefixed(seeded_tensors(speech_encoder_tensors(enc), seed + 3), "encoder."))
    (st / "config.json").write_text(json.dumps({**st_config, **marker}, indent=2))
    write_safetensors(st / "model.safetensors", tensors)
    (st / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    demo.write_talker(directory, demo.geometry(size, kind), seed + 1, marker,
                      real_size=size in ("0.6b", "1.7b"), decisive=decisive)
    return directory


def write_real_shape(directory: Path, size: str, kind: str = "custom_voice", seed: int = 0) -> Path:
    """Random weights at the published shapes (for measuring export cost, not for listening)."""
    return write_checkpoint(directory, code2wav=REAL_CODE2WAV, seed=seed, size=size, kind=kind,
                            label=f"random weights at real {size} shapes")


def read_model_config(checkpoint: Path):
    from .config import parse

    path = checkpoint / "config.json"
    return parse(read_json(path, "model config"), path)


def load_model_tensors(checkpoint: Path, cfg, parts: tuple[str, ...]) -> dict:
    """Load `model.safetensors` tensors of the given parts: talker, predictor, speaker_encoder."""
    from .tensors import predictor_tensors, speaker_encoder_tensors, talker_tensors

    table = {}
    if "talker" in parts:
        table.update(talker_tensors(cfg))
    if "predictor" in parts:
        table.update(predictor_tensors(cfg))
    if "speaker_encoder" in parts and cfg.speaker_encoder is not None:
        table.update(speaker_encoder_tensors(cfg.speaker_encoder))
    refuse_pickles(checkpoint)
    return load_tensors(checkpoint / "model.safetensors", table, lazy=True)
