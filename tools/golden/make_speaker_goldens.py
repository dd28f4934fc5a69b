"""Goldens for x-vector cloning at several reference lengths, from the upstream `qwen_tts` package.

Runs in the venv of make_goldens.py (tools/golden/README.md):

    /tmp/refvenv/bin/python tools/golden/make_speaker_goldens.py

The checkpoint is the Base case of make_goldens.py (`talker_base_tiny17`: omni-export's seeded tiny
writer, seed 21, size tiny-1.7b, its EOS row biased as recorded in talker_base_tiny17.npz), saved again
by upstream's `save_pretrained`, and upstream runs on the tensors it wrote: the goldens are upstream's
outputs on an upstream-written checkpoint. Its config.json is kept (the tests load it; upstream's own
Qwen3TTSConfig cannot read it back: save_pretrained adds `model_type` to speaker_encoder_config, which
Qwen3TTSSpeakerEncoderConfig rejects, so the model is built from our config.json); its tensors are
checked equal to ours, so the tests regenerate exactly the weights upstream ran on.

For each reference (omni-export's `reference_voice(seed, seconds)`, 24 kHz) it records upstream's
`mel_spectrogram` (frame count, first and last 8 frames: the full mel of the 3 s one is in
talker_base_tiny17.npz), the x-vector `model.speaker_encoder(mel)`, and the greedy codes of
`model.generate` in x-vector-only mode (the settings of make_goldens.py's Base case). Also the
shortest reference upstream's encoder takes (its largest reflect pad + 1 frames) and that one
frame less fails there. Writes tests/golden/qwen3_tts/speaker_lengths.npz and .json, and
speaker_lengths_config.json.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_goldens import MAX_NEW_TOKENS, OUT, ROOT, TALKER_CASES, bias_eos, stub_torchaudio  # noqa: E402

NAME = "talker_base_tiny17"
# (key, reference seed, seconds); 10 s is 938 frames, the recipe's default maximum
REFERENCES = [("ref_0p5s", 31, 0.5), ("ref_3s", 32, 3.0), ("ref_6s", 33, 6.0), ("ref_10s", 34, 10.0)]
EDGE = 8


def _mel(wav):
    import torch
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    return mel_spectrogram(torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                           hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)


def upstream_model(config_dir: Path, tensors: dict):
    """Upstream's Qwen3TTSForConditionalGeneration from a config.json directory (eager attention), the
    tensors loaded; only the rotary tables it computes itself may be missing."""
    import torch

    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration

    cfg = Qwen3TTSConfig.from_pretrained(config_dir)
    for c in (cfg, cfg.talker_config, cfg.talker_config.code_predictor_config):
        c._attn_implementation = "eager"
    m = Qwen3TTSForConditionalGeneration(cfg).eval()
    missing, unexpected = m.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    assert not unexpected and not [x for x in missing if "rotary" not in x], (missing, unexpected)
    return m


def upstream_written(tmp: Path):
    """Our seeded Base checkpoint through upstream's model class and save_pretrained, read back."""
    from safetensors.numpy import load_file
    from safetensors.torch import load_file as load_torch

    from omni_export.recipes.qwen3_tts import checkpoint as ck

    _, size, kind, seed, requests = next(c for c in TALKER_CASES if c[0] == NAME)
    d = ck.write_checkpoint(tmp / "ours", seed=seed, size=size, kind=kind)
    st = load_file(d / "model.safetensors")
    row = int(np.load(OUT / f"{NAME}.npz")["eos_row"])
    bias_eos(st, row)

    saved = tmp / "upstream_saved"
    upstream_model(d, st).save_pretrained(saved)
    written = load_torch(saved / "model.safetensors")
    assert set(written) == set(st), sorted(set(written) ^ set(st))
    equal = all(np.array_equal(written[k].numpy(), st[k]) for k in st)
    try:        # upstream's own config class cannot read the config.json its save_pretrained wrote
        upstream_model(saved, written)
        reread = "read back with upstream's Qwen3TTSConfig"
    except TypeError as e:
        reread = f"upstream's Qwen3TTSConfig.from_pretrained fails on it ({e}); tensors read into the model built from ours"
    return upstream_model(d, written), d, saved, {"seed": seed, "size": size, "kind": kind, "eos_row": row,
                                                  "tensors_equal_ours": equal, "upstream_config_json": reread,
                                                  "requests": requests}


def main() -> None:
    stub_torchaudio()
    import qwen_tts
    import torch
    import transformers

    from omni_export.recipes.qwen3_tts.model import reference_voice
    from omni_export.recipes.qwen3_tts.speaker import log_mel
    from omni_export.text_tokenizer import load as load_tok

    out, meta = {}, {"generated_by": "tools/golden/make_speaker_goldens.py",
                     "upstream": {"qwen-tts": getattr(qwen_tts, "__version__", "0.1.1"), "torch": torch.__version__,
                                  "transformers": transformers.__version__}}
    with tempfile.TemporaryDirectory() as t:
        model, ours_dir, saved, info = upstream_written(Path(t))
        meta["checkpoint"] = info
        (OUT / "speaker_lengths_config.json").write_text((saved / "config.json").read_text())
        tok = load_tok(ours_dir)
        enc = model.speaker_encoder
        pads = sorted({m.dilation[0] * (m.kernel_size[0] - 1) // 2 for m in enc.modules()
                       if isinstance(m, torch.nn.Conv1d)})
        meta["largest_reflect_pad"] = pads[-1]
        refs = []
        for key, seed, seconds in REFERENCES:
            wav = reference_voice(seed, seconds)
            mel = _mel(wav)
            with torch.no_grad():
                xvec = enc(mel)[0].numpy()
            frames = mel.shape[1]
            out[f"{key}_mel_head"] = mel[0, :EDGE].numpy()
            out[f"{key}_mel_tail"] = mel[0, -EDGE:].numpy()
            out[f"{key}_xvec"] = xvec
            ours = log_mel(wav)
            refs.append({"key": key, "seed": seed, "seconds": seconds, "samples": len(wav), "frames": frames,
                         "ours_log_mel_max_abs_diff": float(np.abs(ours - mel[0].numpy()).max()) if ours.shape == mel[0].shape else None})
            for i, r in enumerate(info["requests"]):
                ids = torch.tensor([tok.encode(f"<|im_start|>assistant\n{r['text']}<|im_end|>\n<|im_start|>assistant\n")])
                kw = dict(input_ids=[ids], languages=[r["language"]], non_streaming_mode=r["non_streaming"],
                          max_new_tokens=MAX_NEW_TOKENS, do_sample=False, subtalker_dosample=False,
                          repetition_penalty=1.05,
                          voice_clone_prompt=dict(ref_code=[None], ref_spk_embedding=[torch.from_numpy(xvec)],
                                                  x_vector_only_mode=[True], icl_mode=[False]))
                with torch.no_grad():
                    codes, _ = model.generate(**kw)
                out[f"text_ids_{i}"] = ids[0].numpy()
                out[f"{key}_codes_{i}"] = codes[0].numpy()
            refs[-1]["frames_generated"] = [int(out[f"{key}_codes_{i}"].shape[0]) for i in range(len(info["requests"]))]
        meta["references"] = refs
        # the shortest reference upstream's encoder takes: largest pad + 1 frames (torch's reflect pad
        # needs pad < length); one frame less raises there
        shortest = pads[-1] + 1
        rng = np.random.default_rng(35)
        mel = torch.from_numpy(rng.normal(-4.0, 2.0, (1, shortest, 128)).astype(np.float32))
        with torch.no_grad():
            out["shortest_mel"] = mel[0].numpy()
            out["shortest_xvec"] = enc(mel)[0].numpy()
            try:
                enc(mel[:, :-1])
                meta["one_frame_shorter"] = "accepted"
            except RuntimeError as e:
                meta["one_frame_shorter"] = f"RuntimeError: {str(e).splitlines()[0]}"
        meta["shortest_frames"] = shortest
    np.savez_compressed(OUT / "speaker_lengths.npz", **out)
    (OUT / "speaker_lengths.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
