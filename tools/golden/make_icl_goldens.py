"""Goldens for in-context (ICL) voice cloning, from the upstream `qwen_tts` package.

Runs in the venv of make_goldens.py (tools/golden/README.md):

    /tmp/refvenv/bin/python tools/golden/make_icl_goldens.py

The checkpoint is make_speaker_goldens.py's: the tiny Base checkpoint of `talker_base_tiny17` (seed 21,
size tiny-1.7b, its EOS row biased) saved by upstream's `save_pretrained`, upstream running on the
tensors it wrote; the speech tokenizer (with its tiny Mimi encoder) loaded by
`Qwen3TTSTokenizer.from_pretrained(<ckpt>/speech_tokenizer)` as upstream's ICL mode loads it.

For each case it runs what `Qwen3TTSModel.generate_voice_clone(text, ref_audio, ref_text)` runs
(x_vector_only_mode False, i.e. icl_mode True): `create_voice_clone_prompt` (the reference's codes from
the speech tokenizer's `.encode(wav, sr=24000)`, its x-vector from `extract_speaker_embedding`), the
assistant text and `_build_ref_text(ref_text)` tokenized, then `model.generate(input_ids, ref_ids,
voice_clone_prompt, ...)` greedily (do_sample False, subtalker_dosample False, repetition penalty
1.05, make_goldens.py's MAX_NEW_TOKENS), and the wrapper's decode: the reference's codes and the
generated ones decoded together, the reference's share of the samples cut. Recorded: text and ref
ids, the reference's codes, the generated codes, and the decoded waveform's length, cut and its first
and last 64 samples. Writes tests/golden/qwen3_tts/icl.npz and icl.json (a few KB).
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_goldens import MAX_NEW_TOKENS, OUT, ROOT, stub_torchaudio  # noqa: E402
from make_speaker_goldens import upstream_written  # noqa: E402

# (key, reference seed, seconds, ref text, text, language, non_streaming). Streaming ICL has two
# branches (text rows longer than the reference's codec rows, or not); non-streaming one.
CASES = [
    ("short_ref_streaming", 51, 0.5, "Hi there.", "Testing one two, and three four five six.", "english", False),
    ("long_ref_streaming", 52, 1.3, "Hi.", "Ok.", "english", False),
    ("long_ref_non_streaming", 52, 1.3, "The weather is fine today.", "Testing one two.", "english", True),
]
EDGE = 64


def main() -> None:
    stub_torchaudio()
    import qwen_tts
    import torch
    import transformers

    from omni_export.recipes.qwen3_tts.model import reference_voice
    from omni_export.text_tokenizer import load as load_tok
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    out, cases = {}, []
    with tempfile.TemporaryDirectory() as t:
        model, ours_dir, _, info = upstream_written(Path(t))
        speech = Qwen3TTSTokenizer.from_pretrained(str(ours_dir / "speech_tokenizer"))
        tok = load_tok(ours_dir)
        for key, seed, seconds, ref_text, text, language, non_streaming in CASES:
            wav = reference_voice(seed, seconds)
            with torch.no_grad():
                ref_code = speech.encode(wav, sr=24000).audio_codes[0]          # create_voice_clone_prompt
                xvec = model.extract_speaker_embedding(audio=wav, sr=24000)
            ids = torch.tensor([tok.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")])
            ref_ids = torch.tensor([tok.encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")])
            kw = dict(input_ids=[ids], ref_ids=[ref_ids], languages=[language], non_streaming_mode=non_streaming,
                      max_new_tokens=MAX_NEW_TOKENS, do_sample=False, subtalker_dosample=False,
                      repetition_penalty=1.05,
                      voice_clone_prompt=dict(ref_code=[ref_code], ref_spk_embedding=[xvec],
                                              x_vector_only_mode=[False], icl_mode=[True]))
            with torch.no_grad():
                codes, _ = model.generate(**kw)
                codes = codes[0]
                both = torch.cat([ref_code.to(codes.device), codes], dim=0)          # generate_voice_clone's decode
                wavs, sr = speech.decode([{"audio_codes": both}])
            full = wavs[0]
            cut = int(int(ref_code.shape[0]) / max(int(both.shape[0]), 1) * full.shape[0])
            wav_out = full[cut:]
            out[f"{key}_text_ids"] = ids[0].numpy().astype(np.int32)
            out[f"{key}_ref_ids"] = ref_ids[0].numpy().astype(np.int32)
            out[f"{key}_ref_codes"] = ref_code.numpy().astype(np.int16)
            out[f"{key}_codes"] = codes.numpy().astype(np.int16)
            out[f"{key}_wav_head"] = wav_out[:EDGE].astype(np.float32)
            out[f"{key}_wav_tail"] = wav_out[-EDGE:].astype(np.float32)
            text_rows = ref_ids.shape[1] - 5 + ids.shape[1] - 8 + 1
            cases.append({"key": key, "seed": seed, "seconds": seconds, "samples": int(wav.size),
                          "wav_sha256": hashlib.sha256(wav.tobytes()).hexdigest(), "ref_text": ref_text,
                          "text": text, "language": language, "non_streaming": non_streaming,
                          "ref_frames": int(ref_code.shape[0]), "frames_generated": int(codes.shape[0]),
                          "text_rows": int(text_rows), "codec_rows": int(ref_code.shape[0]) + 1,
                          "decoded_samples": int(full.shape[0]), "cut": cut, "sample_rate": int(sr),
                          "out_samples": int(wav_out.shape[0])})
    meta = {"generated_by": "tools/golden/make_icl_goldens.py",
            "upstream": {"qwen-tts": getattr(qwen_tts, "__version__", "0.1.1"), "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "checkpoint": {k: info[k] for k in ("seed", "size", "kind", "eos_row", "tensors_equal_ours")},
            "config_json": "speaker_lengths_config.json", "max_new_tokens": MAX_NEW_TOKENS, "cases": cases}
    np.savez_compressed(OUT / "icl.npz", **out)
    (OUT / "icl.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))
    print("npz bytes:", (OUT / "icl.npz").stat().st_size)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
