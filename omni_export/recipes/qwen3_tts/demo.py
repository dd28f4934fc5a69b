"""Seeded Qwen3-TTS checkpoints in the official layout: the embedded demo, test fixtures and
real-shape random-weight checkpoints for measuring export cost.

Geometries: TINY_* keep every structural feature (16 code groups, the real codec ids and vocab,
GQA, q/k norms, the 1.7B projection when the talker is wider than the predictor) at small widths.
REAL_* are the published 0.6B / 1.7B shapes (config.json of Qwen3-TTS-12Hz-0.6B/1.7B-CustomVoice
and -Base, as recorded in the project's notes).
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
from pathlib import Path

from .config import ModelConfig, PredictorConfig, SpeakerEncoderConfig, TalkerConfig, to_json

CODEC_IDS = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_think_id=2154,
                 codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157)
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
            "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECT = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069}
DIALECTS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
MROPE = {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default", "type": "default"}
GENERATION_CONFIG = {"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
                     "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
                     "subtalker_temperature": 0.9, "max_new_tokens": 8192}

# Tiny tokenizer: the 256 byte symbols, merges that make the template words single tokens (as in
# Qwen2's vocab), then the special tokens. Special ids follow, so the text vocab is tiny.
TEMPLATE_WORDS = ("assistant", "user")
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
                  "<tts_text_eod>", "<tts_text_bos_single>")


def _talker(hidden: int, inter: int, layers: int, heads: int, kv: int, hd: int, text_hidden: int,
            text_vocab: int, speakers: bool, mrope: dict) -> TalkerConfig:
    langs = {**LANGUAGES, **(DIALECTS if speakers else {})}
    return TalkerConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
                        rope_theta=1_000_000.0, vocab_size=3072, num_code_groups=16, text_hidden_size=text_hidden,
                        text_vocab_size=text_vocab, spk_id=dict(SPEAKERS) if speakers else {},
                        spk_is_dialect={k: DIALECT.get(k, False) for k in SPEAKERS} if speakers else {},
                        codec_language_id=langs, rope_scaling=mrope, **CODEC_IDS)


def _predictor(hidden: int, inter: int, layers: int, heads: int, kv: int, hd: int) -> PredictorConfig:
    return PredictorConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
                           rope_theta=1_000_000.0, vocab_size=2048, num_code_groups=16)


def tiny_text_vocab() -> int:
    return 256 + sum(len(w) - 1 for w in TEMPLATE_WORDS) + len(SPECIAL_TOKENS)


def geometry(size: str, kind: str = "custom_voice") -> ModelConfig:
    """size: tiny (0.6B-style), tiny-1.7b (talker wider than predictor), 0.6b, 1.7b."""
    speakers = kind == "custom_voice"
    if size in ("tiny", "tiny-1.7b"):
        ht = 64 if size == "tiny" else 96
        tiny_mrope = {**MROPE, "mrope_section": [4, 2, 2]}
        talker = _talker(ht, 128, 2, 4, 2, 16, 48, tiny_text_vocab(), speakers, tiny_mrope)
        pred = _predictor(64, 128, 2, 4, 2, 16)
        spk = SpeakerEncoderConfig(enc_dim=ht, enc_channels=(32, 32, 32, 32, 96), enc_attention_channels=16,
                                   enc_res2net_scale=4, enc_se_channels=16)
        first = tiny_text_vocab() - len(SPECIAL_TOKENS)
        ids = {"tts_pad_token_id": first + SPECIAL_TOKENS.index("<tts_pad>"),
               "tts_bos_token_id": first + SPECIAL_TOKENS.index("<tts_text_bos>"),
               "tts_eos_token_id": first + SPECIAL_TOKENS.index("<tts_text_eod>")}
    elif size in ("0.6b", "1.7b"):
        ht, inter = (1024, 3072) if size == "0.6b" else (2048, 6144)
        talker = _talker(ht, inter, 28, 16, 8, 128, 2048, 151936, speakers, MROPE)
        pred = _predictor(1024, 3072, 5, 16, 8, 128)
        spk = SpeakerEncoderConfig(enc_dim=ht)
        ids = {"tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673}
    else:
        raise ValueError(f"unknown size {size}")
    return ModelConfig(talker, pred, spk if kind == "base" else None, kind,
                       "1b7" if "1.7" in size else "0b6", **ids)


def write_talker(directory: Path, cfg: ModelConfig, seed: int, marker: dict, real_size: bool = False,
                 decisive: bool = False) -> None:
    """config.json, model.safetensors, generation_config.json and tokenizer files. `decisive`: heads
    tied to embedding rows (see `make_decisive`)."""
    from ...weights import seeded_tensors, write_safetensors
    from .tensors import model_tensors

    (directory / "config.json").write_text(json.dumps({**to_json(cfg), **marker}, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    table = model_tensors(cfg)
    if real_size:
        _write_large(directory / "model.safetensors", table, seed)
    else:
        tensors = seeded_tensors(table, seed)
        if decisive:
            make_decisive(tensors, cfg, seed)
        write_safetensors(directory / "model.safetensors", tensors)
    # Real shapes too: the recipe tokenises its prompt set to capture real graph inputs. The tiny
    # tokenizer's ids are valid rows of any text embedding table, and ids do not change export cost.
    write_tiny_tokenizer(directory)


def make_decisive(t: dict, cfg: ModelConfig, seed: int) -> None:
    """Give random weights a trained model's confidence, in place.

    With i.i.d. random heads every greedy decision is a draw among near-equal logits (the top-2 gap
    is ~1/4 of the logits' spread), so the ~1e-3 relative error of any fp16 graph flips about one
    decision in 600, and one flipped code changes every later frame: free-running parity then
    measures the weights, not the export. Here each head row is a scaled copy of a (permuted) row of
    the embedding table that feeds that decision, so the hidden state points at one row:
      talker: codec_head[i] = codec_embedding[perm(i)] for the 2048 codes, plus the codec BOS row on
        one code (the first decision after the prompt); codec_embedding std 1.0 (0.5 otherwise) so it
        outweighs the 15 residual-code embeddings summed into each talker input;
      predictor: lm_head[0] tied to the talker codec embedding of code 0 (through
        small_to_mtp_projection when present), lm_head[j] to codec_embedding[j - 1]; the predictor's
        residual branches (o_proj, down_proj) scaled to gain 0.1 so its input embedding survives.
    The heads' scale (gain 1) keeps the top logits within ~1-2 of each other, so seeded sampling
    (calibration) still wanders from the greedy path from the first frame on.
    Measured on the tiny demos (24-40 frames, 2 held-out prompts): greedy decisions survive 2e-3
    relative noise on every graph output (random heads: 35-64 % of codes equal at 1e-3); the price
    is a demo whose greedy codes follow its embedding chain and barely depend on the text (random
    weights speak no language either way)."""
    rng = np.random.default_rng(seed + 1000)
    tk, p = cfg.talker, cfg.predictor
    v = p.vocab_size
    emb = t["talker.model.codec_embedding.weight"]
    emb *= 2.0                     # std 0.5 -> 1.0

    def tied(rows: np.ndarray) -> np.ndarray:        # rows of RMS 1 / sqrt(in): the _linear(gain=1) scale
        return rows / (np.sqrt(rows.shape[1]) * np.sqrt(np.mean(rows ** 2)))

    head = t["talker.codec_head.weight"]
    head[:v] = tied(emb[rng.permutation(v)])
    head[int(rng.integers(v))] += tied(emb[tk.codec_bos_id:tk.codec_bos_id + 1])[0]
    w = t.get("talker.code_predictor.small_to_mtp_projection.weight")
    b = t.get("talker.code_predictor.small_to_mtp_projection.bias")
    for j in range(p.num_code_groups - 1):
        src = emb[:v] if j == 0 else t[f"talker.code_predictor.model.codec_embedding.{j - 1}.weight"]
        if w is not None:
            src = src @ w.T + b
        t[f"talker.code_predictor.lm_head.{j}.weight"][:] = tied(src[rng.permutation(v)])
    for name in t:
        if name.startswith("talker.code_predictor.model.layers.") and \
                name.endswith(("o_proj.weight", "down_proj.weight")):
            t[name] *= 0.1 / 0.5


def _write_large(path: Path, table: dict, seed: int) -> None:
    """Real-shape random weights in bf16 (as the published checkpoints), generated by torch."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(table):
        decl = table[name]
        kind, *args = decl.init
        if kind == "normal":
            t = torch.randn(decl.shape, generator=g) * args[0]
        elif kind == "uniform":
            t = torch.rand(decl.shape, generator=g) * (args[1] - args[0]) + args[0]
        else:
            t = torch.ones(decl.shape) * (args[0] if kind == "const" else float(kind == "ones"))
        tensors[name] = t.to(torch.bfloat16)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level alphabet: printable bytes map to themselves, the rest to 256+."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def write_tiny_tokenizer(directory: Path) -> None:
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: i for i, b in enumerate(sorted(alphabet))}
    merges = []
    for word in TEMPLATE_WORDS:
        cur = word[0]
        for ch in word[1:]:
            merges.append(f"{cur} {ch}")
            cur += ch
            vocab[cur] = len(vocab)
    added = {str(len(vocab) + i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                   "normalized": False, "single_word": False}
             for i, t in enumerate(SPECIAL_TOKENS)}
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072, "add_bos_token": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
        "added_tokens_decoder": added}, indent=1))


def with_kind(cfg: ModelConfig, kind: str) -> ModelConfig:
    return replace(cfg, tts_model_type=kind)
