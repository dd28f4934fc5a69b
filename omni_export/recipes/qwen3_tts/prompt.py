"""Talker prompt construction, as upstream `Qwen3TTSForConditionalGeneration.generate` builds it.

Inputs are the templated assistant text ids, exactly what upstream's generate receives:
`<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`, so ids[:3] are the role tokens,
ids[3:-5] the text and ids[-5:] the tail (dropped). Rows of the prompt (each [Ht]):
  (instruct)  text_proj(instruct ids)                                  (VoiceDesign / CustomVoice 1.7B)
  role        text_proj(ids[:3])
  codec       [tts_pad]*(n-2) + [tts_bos]  +  codec_emb(prefix[:-1])   prefix = think/nothink, think_bos,
                                                                       (language), think_eos, (speaker),
                                                                       codec_pad, codec_bos
  text        non-streaming: text_proj(t_i) + codec_emb(pad) for every token, then tts_eos + pad, then
              tts_pad + codec_emb(bos); trailing text = [tts_pad]
              streaming: text_proj(t_0) + codec_emb(bos); trailing = text_proj(t_1..) + [tts_eos]
The speaker row is codec_emb(spk_id) (CustomVoice) or the x-vector (Base).

In-context cloning (Base, `ref_ids` and `ref_codes` given; upstream's `generate_icl_prompt`): the codec
rows are the same, and the text rows are replaced by the reference's transcript and codes:
  text rows   T = text_proj(ref_ids[3:-2] + ids[3:-5]) + [tts_eos]      (transcript, then the text)
  codec rows  C = codec_emb(bos) + [sum of the 16 codebook embeddings of each reference frame]
  non-streaming: T + codec_emb(pad) for every row, then C + tts_pad; trailing = [tts_pad]
  streaming: len(T) > len(C): T[:len(C)] + C, trailing = T[len(C):]; else (T padded with tts_pad to
  len(C)) + C, trailing = [tts_pad]
`ref_ids` are the templated reference text `<|im_start|>assistant\\n{ref_text}<|im_end|>\\n`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...core import UsageError
from .config import ModelConfig

ASSISTANT_TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
INSTRUCT_TEMPLATE = "<|im_start|>user\n{text}<|im_end|>\n"
REF_TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n"


@dataclass
class Request:
    text_ids: list[int]
    speaker: str | None = None
    language: str = "auto"
    instruct_ids: list[int] | None = None
    non_streaming: bool = True
    speaker_embedding: np.ndarray | None = None   # Base: x-vector [Ht]
    name: str = ""
    ref_ids: list[int] | None = None               # in-context cloning: templated reference transcript
    ref_codes: np.ndarray | None = None            # ... and the reference's codes [frames, Q]


@dataclass
class Prompt:
    embeds: np.ndarray      # [P, Ht]
    trailing: np.ndarray    # [N, Ht]
    pad: np.ndarray         # [Ht]
    ids_used: dict = field(default_factory=dict)


def language_id(cfg: ModelConfig, req: Request) -> int | None:
    t = cfg.talker
    lang = (req.language or "auto").lower()
    valid = ["auto"] + sorted(k for k in t.codec_language_id if "dialect" not in k)
    if lang != "auto" and lang not in t.codec_language_id:
        raise UsageError(f"unknown language '{req.language}'; valid: {', '.join(valid)}")
    lid = None if lang == "auto" else t.codec_language_id[lang]
    spk = (req.speaker or "").lower()
    if spk and lang in ("chinese", "auto") and t.spk_is_dialect.get(spk):
        lid = t.codec_language_id[t.spk_is_dialect[spk]]
    return lid


def codec_prefix(cfg: ModelConfig, req: Request) -> tuple[list[int], int | None]:
    """Codec ids of the prefix (without the speaker) and the speaker's codec id, if any."""
    t = cfg.talker
    lid = language_id(cfg, req)
    ids = ([t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id] if lid is None else
           [t.codec_think_id, t.codec_think_bos_id, lid, t.codec_think_eos_id])
    spk = None
    if req.speaker:
        key = req.speaker.lower()
        if key not in t.spk_id:
            valid = ", ".join(sorted(t.spk_id)) or "none (this checkpoint has no built-in speakers)"
            raise UsageError(f"unknown speaker '{req.speaker}'; valid: {valid}")
        spk = t.spk_id[key]
    return ids, spk


def build(cfg: ModelConfig, req: Request, text_proj: Callable[[list[int]], np.ndarray],
          codec_emb: Callable[[list[int]], np.ndarray],
          frame_emb: Callable[[np.ndarray], np.ndarray] | None = None) -> Prompt:
    """text_proj(ids) -> [n, Ht] through the text projection; codec_emb(ids) -> [n, Ht];
    frame_emb(codes [n, Q]) -> [n, Ht], each frame's summed codebook embeddings (in-context cloning)."""
    t = cfg.talker
    ids = list(req.text_ids)
    if len(ids) < 9:
        raise UsageError("text ids must be the templated assistant text: "
                         "<|im_start|>assistant\\n ... <|im_end|>\\n<|im_start|>assistant\\n (>= 9 ids)")
    if cfg.tts_model_type == "base" and req.speaker_embedding is None:
        raise UsageError("a Base checkpoint needs a reference voice (--ref-audio)")
    if req.speaker and cfg.tts_model_type != "custom_voice":
        raise UsageError(f"--speaker needs a CustomVoice checkpoint; this one is {cfg.tts_model_type}")
    special = text_proj([cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id])
    bos, eos, pad = special[0], special[1], special[2]
    prefix, spk = codec_prefix(cfg, req)
    codec = list(codec_emb(prefix))
    if spk is not None:
        codec.append(codec_emb([spk])[0])
    if req.speaker_embedding is not None:
        codec.append(np.asarray(req.speaker_embedding, np.float32).reshape(-1))
    codec += list(codec_emb([t.codec_pad_id, t.codec_bos_id]))
    n = len(codec)
    rows = []
    if req.instruct_ids:
        rows.append(text_proj(list(req.instruct_ids)))
    rows.append(text_proj(ids[:3]))
    rows.append(np.stack([pad] * (n - 2) + [bos]) + np.stack(codec[:-1]))
    text = ids[3:-5]
    if req.ref_codes is not None:
        rows_icl, trailing = _in_context(cfg, req, text, text_proj, codec_emb, frame_emb, eos, pad)
        rows += rows_icl
    elif req.non_streaming or not text:
        body = np.concatenate([text_proj(text), eos[None]]) if text else eos[None]
        rows.append(body + codec_emb([t.codec_pad_id] * len(body)))
        rows.append((pad + codec_emb([t.codec_bos_id])[0])[None])
        trailing = pad[None]
    else:
        rows.append(text_proj(text[:1]) + codec[-1][None])
        rest = text_proj(text[1:]) if len(text) > 1 else np.zeros((0, pad.shape[0]), np.float32)
        trailing = np.concatenate([rest, eos[None]])
    return Prompt(np.concatenate(rows).astype(np.float32), trailing.astype(np.float32), pad.astype(np.float32),
                  {"codec_prefix": prefix, "speaker": spk})


def _in_context(cfg: ModelConfig, req: Request, text: list[int], text_proj, codec_emb, frame_emb, eos, pad):
    """The rows after the codec prefix and the trailing text of in-context cloning (module docstring)."""
    t = cfg.talker
    if cfg.tts_model_type != "base":
        raise UsageError(f"in-context cloning (--ref-text) needs a Base checkpoint; this one is {cfg.tts_model_type}")
    ref = list(req.ref_ids or [])
    if len(ref) < 6:
        raise UsageError("reference text ids must be the templated reference transcript: "
                         "<|im_start|>assistant\\n ... <|im_end|>\\n (>= 6 ids)")
    codes = np.asarray(req.ref_codes)
    if codes.ndim != 2 or len(codes) < 1:
        raise UsageError(f"reference codes must be [frames >= 1, codebooks], got shape {list(codes.shape)}")
    tx = np.concatenate([text_proj(ref[3:-2] + text), eos[None]])
    cx = np.concatenate([codec_emb([t.codec_bos_id]), frame_emb(codes)])
    if req.non_streaming:
        return [tx + codec_emb([t.codec_pad_id] * len(tx)), cx + pad], pad[None]
    if len(tx) > len(cx):
        return [tx[:len(cx)] + cx], tx[len(cx):]
    return [np.concatenate([tx, np.repeat(pad[None], len(cx) - len(tx), 0)]) + cx], pad[None]


def template_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(ASSISTANT_TEMPLATE.format(text=text))


def instruct_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(INSTRUCT_TEMPLATE.format(text=text))


def ref_ids(tokenizer, text: str) -> list[int]:
    """The reference transcript as upstream's `_build_ref_text` templates it."""
    return tokenizer.encode(REF_TEMPLATE.format(text=text))
