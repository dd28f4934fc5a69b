"""Goldens for the 12 Hz speech tokenizer's encoder (reference audio -> codes, in-context cloning).

Runs in the venv of make_goldens.py (tools/golden/README.md):

    /tmp/refvenv/bin/python tools/golden/make_speech_encoder_goldens.py

The checkpoint is omni-export's seeded tiny Base writer (the `talker_base_tiny17` case of
make_goldens.py: seed 21, size tiny-1.7b, kind base), whose speech_tokenizer/ holds a tiny Mimi
encoder (`encoder.*`, `encoder_config`). Upstream loads that directory exactly as its in-context
cloning does: `qwen_tts.Qwen3TTSTokenizer.from_pretrained(<ckpt>/speech_tokenizer)` (transformers'
AutoFeatureExtractor + AutoModel, default attention), then `.encode(wav, sr=24000)`. Every `encoder.*`
tensor upstream's model holds is checked equal to the file's, and every file tensor was loaded.

For each reference (`reference_voice(seed, seconds)`, 24 kHz) it records upstream's codes
[frames, 16] and the quantizer's input (the downsample conv's output, [1, H, frames], caught by a
forward hook) for debugging, plus the waveform's sha256 so the test knows it regenerated the same
samples. Writes tests/golden/qwen3_tts/speech_encoder.npz and speech_encoder.json.

Also one case at MimiConfig's default geometry (`MIMI_SPEECH_ENCODER`: hidden 512, 64 filters, 8
layers, head_dim 64, 32 codebooks of 2048 x 256, as the released encoder is believed to be): our
seeded tensors (seed MIMI_SEED, never written to disk) loaded strictly into upstream's
`Qwen3TTSTokenizerV2Model` built with `encoder_config={}` (MimiConfig defaults), `.encode` of one
1.3 s reference; its codes are recorded.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_goldens import OUT, ROOT, stub_torchaudio  # noqa: E402

SEED, SIZE, KIND = 21, "tiny-1.7b", "base"
# (key, reference seed, seconds): 7 frames, a fractional 9.6 frames, exactly 12 frames (23040
# samples, no right padding anywhere), 17 frames
REFERENCES = [("ref_0p5s", 41, 0.5), ("ref_0p77s", 42, 0.77), ("ref_0p96s", 43, 0.96), ("ref_1p3s", 44, 1.3)]
MIMI_SEED, MIMI_REFERENCE = 5, ("mimi_ref_1p3s", 45, 1.3)


def mimi_geometry() -> tuple[np.ndarray, dict]:
    import torch

    from omni_export.recipes.qwen3_tts.checkpoint import REAL_CODE2WAV
    from omni_export.recipes.qwen3_tts.model import reference_voice
    from omni_export.recipes.qwen3_tts.speech_encoder import MIMI_SPEECH_ENCODER, speech_encoder_tensors
    from omni_export.weights import seeded_tensors
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    cfg = Qwen3TTSTokenizerV2Config(encoder_config={}, decoder_config=REAL_CODE2WAV.to_json())
    model = Qwen3TTSTokenizerV2Model(cfg).eval()
    tensors = {"encoder." + k: torch.from_numpy(v)
               for k, v in seeded_tensors(speech_encoder_tensors(MIMI_SPEECH_ENCODER), MIMI_SEED).items()}
    held = {k for k in model.state_dict() if k.startswith("encoder.")}
    assert held == set(tensors), sorted(held ^ set(tensors))
    model.load_state_dict(tensors, strict=False)
    key, seed, seconds = MIMI_REFERENCE
    wav = reference_voice(seed, seconds)
    with torch.no_grad():
        codes = model.encode(torch.from_numpy(wav)[None], torch.ones(1, wav.size, dtype=torch.long)).audio_codes[0]
    codes = codes.numpy()
    return codes, {"key": key, "seed": seed, "seconds": seconds, "tensor_seed": MIMI_SEED,
                   "frames": int(codes.shape[0]), "wav_sha256": hashlib.sha256(wav.tobytes()).hexdigest(),
                   "encoder_config": "MimiConfig defaults",
                   "encoder_attention": cfg.encoder_config._attn_implementation,
                   "distinct_codes_per_codebook": [int(len(set(c))) for c in codes.T]}


def main() -> None:
    stub_torchaudio()
    import qwen_tts
    import torch
    import transformers
    from safetensors.torch import load_file

    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from omni_export.recipes.qwen3_tts.model import reference_voice
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        d = ck.write_checkpoint(Path(tmp) / "base", seed=SEED, size=SIZE, kind=KIND)
        tok = Qwen3TTSTokenizer.from_pretrained(str(d / "speech_tokenizer"))
        model = tok.model.eval()
        file_tensors = {k: v for k, v in load_file(d / "speech_tokenizer" / "model.safetensors").items()
                        if k.startswith("encoder.")}
        held = {k: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
        assert set(held) == set(file_tensors), sorted(set(held) ^ set(file_tensors))
        assert all(torch.equal(held[k], file_tensors[k]) for k in held)

        caught = {}
        model.encoder.downsample.register_forward_hook(lambda m, i, o: caught.__setitem__("latent", o.detach()))
        arrays, summary = {}, {}
        for key, seed, seconds in REFERENCES:
            wav = reference_voice(seed, seconds)
            out = tok.encode(wav, sr=24000)
            codes = out.audio_codes[0].numpy()
            latent = caught.pop("latent").float().numpy()
            assert codes.shape[0] == latent.shape[-1] == -(-wav.size // 1920), (codes.shape, latent.shape)
            arrays[f"{key}_codes"] = codes.astype(np.int16)
            arrays[f"{key}_latent"] = latent.astype(np.float32)
            summary[key] = {"seed": seed, "seconds": seconds, "samples": int(wav.size), "frames": int(codes.shape[0]),
                            "wav_sha256": hashlib.sha256(wav.tobytes()).hexdigest(),
                            "distinct_codes_per_codebook": [int(len(set(c))) for c in codes.T]}
        attn = model.config.encoder_config._attn_implementation
    mimi_codes, mimi = mimi_geometry()
    arrays[f"{mimi['key']}_codes"] = mimi_codes.astype(np.int16)
    np.savez_compressed(OUT / "speech_encoder.npz", **arrays)
    meta = {"generated_by": "tools/golden/make_speech_encoder_goldens.py",
            "upstream": {"qwen-tts": getattr(qwen_tts, "__version__", "0.1.1"), "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "checkpoint": {"seed": SEED, "size": SIZE, "kind": KIND}, "encoder_attention": attn,
            "references": summary, "mimi_geometry": mimi}
    (OUT / "speech_encoder.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))
    print("npz bytes:", (OUT / "speech_encoder.npz").stat().st_size)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
