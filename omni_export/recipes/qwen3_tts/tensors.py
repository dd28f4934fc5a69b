"""Official tensor names and shapes in `model.safetensors` (talker, code predictor, speaker encoder).

One table per part, as functions of the config: it drives loading (missing / wrong-shape tensors are
named) and the seeded checkpoints. Init values only matter for the demo: they keep activations in
a realistic range (unit-variance projections, norms near 1).
"""
from __future__ import annotations

from ...weights import TensorDecl
from .config import DecoderGeometry, ModelConfig, SpeakerEncoderConfig


def _linear(t: dict, name: str, out_f: int, in_f: int, bias: bool = False, gain: float = 1.0) -> None:
    t[name + ".weight"] = TensorDecl((out_f, in_f), ("normal", gain * in_f ** -0.5))
    if bias:
        t[name + ".bias"] = TensorDecl((out_f,), ("normal", 0.02))


def _norm(t: dict, name: str, dim: int) -> None:
    t[name + ".weight"] = TensorDecl((dim,), ("uniform", 0.8, 1.2))


def decoder_layers(t: dict, prefix: str, g: DecoderGeometry) -> None:
    """`{prefix}layers.{i}.*` and `{prefix}norm.weight` of a Qwen3-style decoder."""
    h, hd = g.hidden_size, g.head_dim
    for i in range(g.num_hidden_layers):
        p = f"{prefix}layers.{i}."
        _linear(t, p + "self_attn.q_proj", g.num_attention_heads * hd, h)
        _linear(t, p + "self_attn.k_proj", g.num_key_value_heads * hd, h)
        _linear(t, p + "self_attn.v_proj", g.num_key_value_heads * hd, h)
        _linear(t, p + "self_attn.o_proj", h, g.num_attention_heads * hd, gain=0.5)
        _norm(t, p + "self_attn.q_norm", hd)
        _norm(t, p + "self_attn.k_norm", hd)
        _norm(t, p + "input_layernorm", h)
        _norm(t, p + "post_attention_layernorm", h)
        _linear(t, p + "mlp.gate_proj", g.intermediate_size, h)
        _linear(t, p + "mlp.up_proj", g.intermediate_size, h)
        _linear(t, p + "mlp.down_proj", h, g.intermediate_size, gain=0.5)
    _norm(t, prefix + "norm", h)


def talker_tensors(c: ModelConfig) -> dict[str, TensorDecl]:
    """`talker.*` without the code predictor."""
    tk = c.talker
    t: dict[str, TensorDecl] = {}
    decoder_layers(t, "talker.model.", tk)
    t["talker.model.codec_embedding.weight"] = TensorDecl((tk.vocab_size, tk.hidden_size), ("normal", 0.5))
    t["talker.model.text_embedding.weight"] = TensorDecl((tk.text_vocab_size, tk.text_hidden_size), ("normal", 1.0))
    _linear(t, "talker.text_projection.linear_fc1", tk.text_hidden_size, tk.text_hidden_size, bias=True)
    _linear(t, "talker.text_projection.linear_fc2", tk.hidden_size, tk.text_hidden_size, bias=True, gain=0.5)
    _linear(t, "talker.codec_head", tk.vocab_size, tk.hidden_size, gain=3.0)
    return t


def predictor_tensors(c: ModelConfig) -> dict[str, TensorDecl]:
    """`talker.code_predictor.*`: its decoder, Q-1 embeddings (talker width) and Q-1 heads."""
    p, ht = c.predictor, c.talker.hidden_size
    t: dict[str, TensorDecl] = {}
    decoder_layers(t, "talker.code_predictor.model.", p)
    for j in range(p.num_code_groups - 1):
        t[f"talker.code_predictor.model.codec_embedding.{j}.weight"] = TensorDecl((p.vocab_size, ht), ("normal", 0.25))
        _linear(t, f"talker.code_predictor.lm_head.{j}", p.vocab_size, p.hidden_size, gain=3.0)
    if c.has_projection:
        _linear(t, "talker.code_predictor.small_to_mtp_projection", p.hidden_size, ht, bias=True)
    return t


def speaker_encoder_tensors(s: SpeakerEncoderConfig) -> dict[str, TensorDecl]:
    """ECAPA-TDNN (`speaker_encoder.*`): every layer a Conv1d with bias; no BatchNorm."""
    t: dict[str, TensorDecl] = {}

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        t[name + ".weight"] = TensorDecl((cout, cin, k), ("normal", (cin * k) ** -0.5))
        t[name + ".bias"] = TensorDecl((cout,), ("normal", 0.02))

    ch, ks, scale = s.enc_channels, s.enc_kernel_sizes, s.enc_res2net_scale
    conv("speaker_encoder.blocks.0.conv", ch[0], s.mel_dim, ks[0])
    for b in range(1, len(ch) - 1):
        p = f"speaker_encoder.blocks.{b}."
        conv(p + "tdnn1.conv", ch[b], ch[b - 1], 1)
        for r in range(scale - 1):
            conv(f"{p}res2net_block.blocks.{r}.conv", ch[b] // scale, ch[b] // scale, ks[b])
        conv(p + "tdnn2.conv", ch[b], ch[b], 1)
        conv(p + "se_block.conv1", s.enc_se_channels, ch[b], 1)
        conv(p + "se_block.conv2", ch[b], s.enc_se_channels, 1)
    conv("speaker_encoder.mfa.conv", ch[-1], ch[-1], ks[-1])
    conv("speaker_encoder.asp.tdnn.conv", s.enc_attention_channels, ch[-1] * 3, 1)
    conv("speaker_encoder.asp.conv", ch[-1], s.enc_attention_channels, 1)
    conv("speaker_encoder.fc", s.enc_dim, ch[-1] * 2, 1)
    return t


def model_tensors(c: ModelConfig) -> dict[str, TensorDecl]:
    t = {**talker_tensors(c), **predictor_tensors(c)}
    if c.speaker_encoder is not None:
        t.update(speaker_encoder_tensors(c.speaker_encoder))
    return t
