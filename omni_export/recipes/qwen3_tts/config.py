"""Qwen3-TTS `config.json`: the talker, its code predictor and the speaker encoder.

Field names and meanings are upstream's (qwen_tts 0.1.1, Qwen3TTSConfig / Qwen3TTSTalkerConfig /
Qwen3TTSTalkerCodePredictorConfig / Qwen3TTSSpeakerEncoderConfig). Upstream's class defaults are
not the published values (e.g. 20 layers, codec ids 4196+), so every field the graphs depend on is
required here and read from the file; a missing one is named in the error.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from ...core import UsageError
from ...modeling.geometry import TransformerGeometry


def _ints(obj, where: str, names: tuple[str, ...]) -> None:
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UsageError(f"{where}: {n} must be a positive integer, got {v!r}")


def _build(cls, d: dict, where: str, required: tuple[str, ...]):
    if not isinstance(d, dict):
        raise UsageError(f"{where}: expected an object")
    missing = [n for n in required if n not in d]
    if missing:
        raise UsageError(f"{where}: missing '{missing[0]}' (needed to build the graphs)")
    known = {f.name for f in fields(cls)}
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in known}
    try:
        return cls(**kw)
    except TypeError as e:
        raise UsageError(f"{where}: {e}") from None


@dataclass(frozen=True)
class DecoderGeometry(TransformerGeometry):
    """The Qwen3-style transformer shared by the talker and the code predictor."""
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    hidden_act: str = "silu"
    attention_bias: bool = False

    REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim")

    def check(self, where: str) -> None:
        _ints(self, where, self.REQUIRED)
        if self.num_attention_heads % self.num_key_value_heads:
            raise UsageError(f"{where}: num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise UsageError(f"{where}: head_dim must be even (rotary embedding)")
        if self.hidden_act != "silu":
            raise UsageError(f"{where}: hidden_act '{self.hidden_act}' unsupported (silu)")
        if self.attention_bias:
            raise UsageError(f"{where}: attention_bias=true is not supported")


@dataclass(frozen=True)
class PredictorConfig(DecoderGeometry):
    vocab_size: int = 2048
    num_code_groups: int = 16


@dataclass(frozen=True)
class TalkerConfig(DecoderGeometry):
    vocab_size: int = 3072
    num_code_groups: int = 16
    text_hidden_size: int = 2048
    text_vocab_size: int = 151936
    codec_pad_id: int = 0
    codec_bos_id: int = 0
    codec_eos_token_id: int = 0
    codec_think_id: int = 0
    codec_nothink_id: int = 0
    codec_think_bos_id: int = 0
    codec_think_eos_id: int = 0
    spk_id: dict = field(default_factory=dict)
    spk_is_dialect: dict = field(default_factory=dict)
    codec_language_id: dict = field(default_factory=dict)
    rope_scaling: dict | None = None

    REQUIRED = DecoderGeometry.REQUIRED + (
        "vocab_size", "num_code_groups", "text_hidden_size", "text_vocab_size", "codec_pad_id", "codec_bos_id",
        "codec_eos_token_id", "codec_think_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id")

    def check(self, where: str) -> None:
        super().check(where)
        if self.num_code_groups < 2:
            raise UsageError(f"{where}: num_code_groups must be >= 2")
        for name in ("spk_id", "spk_is_dialect", "codec_language_id"):
            if not isinstance(getattr(self, name) or {}, dict):
                raise UsageError(f"{where}: {name} must be an object")
        for name, cid in {**(self.spk_id or {}), **(self.codec_language_id or {})}.items():
            if not isinstance(cid, int) or not 0 <= cid < self.vocab_size:
                raise UsageError(f"{where}: codec id for '{name}' is {cid!r}, outside the codec vocab")
        sec = (self.rope_scaling or {}).get("mrope_section")
        if sec is not None and sum(sec) != self.head_dim // 2:
            raise UsageError(f"{where}: rope_scaling.mrope_section {list(sec)} does not sum to head_dim/2")


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple = (5, 3, 3, 3, 1)
    enc_dilations: tuple = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    def check(self, where: str) -> None:
        _ints(self, where, ("mel_dim", "enc_dim", "enc_attention_channels", "enc_res2net_scale", "enc_se_channels"))
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            raise UsageError(f"{where}: enc_channels, enc_kernel_sizes and enc_dilations must have equal length >= 3")
        mid = self.enc_channels[1:-1]
        if any(c % self.enc_res2net_scale for c in mid):
            raise UsageError(f"{where}: SE-Res2Net channels must divide by enc_res2net_scale")
        if any(c != self.enc_channels[0] for c in mid):
            raise UsageError(f"{where}: SE-Res2Net blocks are residual: enc_channels[:-1] must be equal")
        if sum(mid) != self.enc_channels[-1]:
            raise UsageError(f"{where}: enc_channels[-1] must equal the sum of the SE-Res2Net channels")


@dataclass(frozen=True)
class ModelConfig:
    talker: TalkerConfig
    predictor: PredictorConfig
    speaker_encoder: SpeakerEncoderConfig | None
    tts_model_type: str
    tts_model_size: str
    tts_bos_token_id: int
    tts_eos_token_id: int
    tts_pad_token_id: int

    @property
    def has_projection(self) -> bool:
        """1.7B: the predictor is narrower than the talker and projects its inputs."""
        return self.predictor.hidden_size != self.talker.hidden_size


def parse(raw: dict, path: Path) -> ModelConfig:
    where = str(path)
    t = raw.get("talker_config")
    if not isinstance(t, dict):
        raise UsageError(f"{where}: missing 'talker_config'")
    p = t.get("code_predictor_config")
    if not isinstance(p, dict):
        raise UsageError(f"{where}: missing 'talker_config.code_predictor_config'")
    talker = _build(TalkerConfig, t, f"{where} talker_config", TalkerConfig.REQUIRED)
    talker.check(f"{where} talker_config")
    pred = _build(PredictorConfig, p, f"{where} code_predictor_config", PredictorConfig.REQUIRED)
    pred.check(f"{where} code_predictor_config")
    if pred.num_code_groups != talker.num_code_groups:
        raise UsageError(f"{where}: talker and code predictor disagree on num_code_groups")
    kind = raw.get("tts_model_type") or "custom_voice"
    if kind not in ("custom_voice", "base", "voice_design"):
        raise UsageError(f"{where}: tts_model_type '{kind}' is not custom_voice, base or voice_design")
    spk = None
    if kind == "base":
        spk = _build(SpeakerEncoderConfig, raw.get("speaker_encoder_config") or {}, f"{where} speaker_encoder_config", ())
        spk.check(f"{where} speaker_encoder_config")
        if spk.enc_dim != talker.hidden_size:
            raise UsageError(f"{where}: speaker_encoder_config.enc_dim {spk.enc_dim} must equal the talker hidden "
                             f"size {talker.hidden_size}")
    ids = {}
    for name, default in (("tts_bos_token_id", 151672), ("tts_eos_token_id", 151673), ("tts_pad_token_id", 151671)):
        v = raw.get(name, default)
        if not isinstance(v, int) or not 0 <= v < talker.text_vocab_size:
            raise UsageError(f"{where}: {name} {v!r} is outside the text vocab ({talker.text_vocab_size})")
        ids[name] = v
    return ModelConfig(talker, pred, spk, kind, str(raw.get("tts_model_size") or ""), **ids)


def to_json(c: ModelConfig) -> dict:
    """The config.json content for a ModelConfig (the layout upstream's save_pretrained writes)."""
    def plain(obj, skip=()):
        return {f.name: (list(v) if isinstance(v := getattr(obj, f.name), tuple) else v)
                for f in fields(obj) if f.name not in skip}

    talker = plain(c.talker)
    talker["code_predictor_config"] = plain(c.predictor)
    out = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": c.tts_model_type,
        "tts_model_size": c.tts_model_size,
        "tts_bos_token_id": c.tts_bos_token_id,
        "tts_eos_token_id": c.tts_eos_token_id,
        "tts_pad_token_id": c.tts_pad_token_id,
        "talker_config": talker,
    }
    if c.speaker_encoder is not None:
        out["speaker_encoder_config"] = plain(c.speaker_encoder)
    return out


def talker_split(layers: int) -> int:
    """Layers in the first half of a split talker (--talker-parts 2); the second takes the rest."""
    return (layers + 1) // 2
