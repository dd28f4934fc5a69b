"""Golden outputs from the upstream `qwen_tts` package, for tests/golden/.

Runs in its own venv (FACTS.md): torch 2.13, transformers 4.57.3, accelerate 1.12, einops, librosa,
soundfile, sox, onnxruntime, `pip install --no-deps qwen-tts==0.1.1`; torchaudio is stubbed (only
the 25 Hz tokenizer uses it). See tools/golden/README.md.

    /path/to/refvenv/bin/python tools/golden/make_goldens.py [--omni-export .venv/bin/omni-export]

What it does, for each tiny geometry:
  1. writes a tiny seeded checkpoint with omni-export's own writer (pure numpy + safetensors; the
     same seed gives the same bytes in the tests);
  2. builds upstream's Qwen3TTSTokenizerV2Decoder from that speech_tokenizer/config.json and loads
     the decoder.* tensors with strict=True (proves our layout is upstream's);
  3. saves upstream's decode(codes) and chunked_decode(codes, N, L) outputs as goldens;
  4. saves the checkpoint again with upstream's save_pretrained (Qwen3TTSTokenizerV2Model +
     Qwen3TTSConfig) and keeps the config.json files it wrote (small; committed) plus the tensor
     names/shapes of its safetensors;
  5. with --omni-export, runs `omni-export qwen3-tts` on the upstream-saved directory itself and
     records the exit code and verdicts.
Only small arrays and JSON are written to tests/golden/qwen3_tts/.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "qwen3_tts"
sys.path.insert(0, str(ROOT))


def stub_torchaudio() -> None:
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi",
                 "torchaudio.transforms", "torchaudio.functional"):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        m.__path__ = []
        sys.modules[name] = m
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


# Goldens: (name, seed, codes seed, frames, chunk N, left context L)
CODE2WAV_CASES = [("code2wav_tiny", 0, 1, 50, 12, 25), ("code2wav_tiny_short", 7, 3, 9, 4, 2)]


def code2wav_goldens(tmp: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2DecoderConfig)
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    summary = {}
    for name, seed, code_seed, frames, chunk, left in CODE2WAV_CASES:
        d = ck.write_checkpoint(tmp / name, seed=seed)
        cfg = json.loads((d / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
        c = Qwen3TTSTokenizerV2DecoderConfig(**cfg)
        c._attn_implementation = "eager"
        dec = Qwen3TTSTokenizerV2Decoder(c).eval()
        sd = {k.removeprefix("decoder."): v for k, v in
              load_file(d / "speech_tokenizer" / "model.safetensors").items() if k.startswith("decoder.")}
        missing, unexpected = dec.load_state_dict(sd, strict=False)
        missing = [m for m in missing if "rotary_emb" not in m]
        assert not missing and not unexpected, (missing, unexpected)
        rng = np.random.default_rng(code_seed)
        codes = rng.integers(0, c.codebook_size, (1, c.num_quantizers, frames))
        with torch.no_grad():
            full = dec(torch.from_numpy(codes)).numpy()
            chunked = dec.chunked_decode(torch.from_numpy(codes), chunk_size=chunk,
                                         left_context_size=left).numpy()
        np.savez_compressed(OUT / f"{name}.npz", codes=codes.astype(np.int32), full=full.astype(np.float32),
                            chunked=chunked.astype(np.float32), seed=seed, chunk=chunk, left=left)
        summary[name] = {"seed": seed, "frames": frames, "chunk": chunk, "left": left,
                         "full_rms": float(np.sqrt((full ** 2).mean()))}
    return summary


def upstream_saved(tmp: Path, omni_export: str | None) -> dict:
    """A whole tiny checkpoint saved by upstream's save_pretrained (talker model + speech tokenizer)."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    ours = ck.write_checkpoint(tmp / "ours", seed=11)
    saved = tmp / "upstream_saved"
    # Talker + predictor: upstream's model class, our seeded weights loaded strictly, then saved.
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig.from_pretrained(ours)).eval()
    st = load_file(ours / "model.safetensors")
    missing, unexpected = model.load_state_dict(st, strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)
    model.save_pretrained(saved)
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(ours / f, saved / f)
    # Speech tokenizer: a small Mimi encoder so the saved file stays tiny (the encoder is not exported).
    dec_cfg = json.loads((ours / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    enc_cfg = {"hidden_size": 32, "num_filters": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 2, "intermediate_size": 32, "codebook_dim": 16,
               "vector_quantization_hidden_dimension": 16, "head_dim": 16, "upsampling_ratios": [8, 6, 5, 4],
               "num_quantizers": 32, "sliding_window": 250, "frame_rate": 12.5, "upsample_groups": 32}
    torch.manual_seed(0)
    tok_model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(encoder_config=enc_cfg, decoder_config=dec_cfg)).eval()
    sst = load_file(ours / "speech_tokenizer" / "model.safetensors")
    missing, unexpected = tok_model.load_state_dict(sst, strict=False)
    assert not unexpected and not [m for m in missing if m.startswith("decoder.") and "rotary_emb" not in m], missing
    tok_model.save_pretrained(saved / "speech_tokenizer")
    (saved / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps(ck.PREPROCESSOR_CONFIG, indent=2))
    keep = OUT / "upstream_saved"
    shutil.rmtree(keep, ignore_errors=True)
    (keep / "speech_tokenizer").mkdir(parents=True)
    for rel in ("config.json", "speech_tokenizer/config.json"):
        (keep / rel).write_text((saved / rel).read_text())
    names = {}
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        names[rel] = {k: list(v.shape) for k, v in sorted(load_file(saved / rel).items())}
    (keep / "tensors.json").write_text(json.dumps(names, indent=1))
    saved_st = load_file(saved / "model.safetensors")
    record = {"seed": 11, "tensors": {k: len(v) for k, v in names.items()},
              "talker_tensors_equal_ours": all(torch.equal(saved_st[k], st[k]) for k in st),
              "decoder_tensors_equal_ours": all(torch.equal(load_file(saved / "speech_tokenizer/model.safetensors")[k], sst[k])
                                                for k in sst if k.startswith("decoder."))}
    if omni_export:
        out = tmp / "build"
        cmd = [omni_export, "qwen3-tts", "--target", "s25-htp", "--checkpoint", str(saved), "--out", str(out),
               "--chunk-frames", "2", "--left-context", "2", "--formats", "onnx,ctx", "--precision", "fp16",
               "--no-attribution", "--json", "-q"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        record["omni_export_run"] = {"cmd": " ".join(cmd[1:]), "exit_code": proc.returncode,
                                     "result": json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else proc.stderr[-2000:]}
    return record


# Talker + predictor greedy goldens: (name, size, kind, seed, requests)
TALKER_CASES = [
    ("talker_cv_tiny", "tiny", "custom_voice", 20, [
        {"text": "Hello there, friend.", "language": "english", "speaker": "ryan", "non_streaming": True},
        {"text": "Hello there, friend.", "language": "english", "speaker": "ryan", "non_streaming": False},
        {"text": "你好", "language": "auto", "speaker": "eric", "non_streaming": True},
    ]),
    ("talker_base_tiny17", "tiny-1.7b", "base", 21, [
        {"text": "Testing one two.", "language": "english", "non_streaming": True},
        {"text": "Testing one two.", "language": "english", "non_streaming": False},
    ]),
    ("talker_vd_tiny", "tiny", "voice_design", 22, [
        {"text": "A short line.", "language": "auto", "instruct": "A deep calm voice.", "non_streaming": True},
    ]),
]
MAX_NEW_TOKENS = 12


def bias_eos(tensors: dict, row: int) -> None:
    """Make EOS reachable in a random-weight talker: its codec_head row copies another's, scaled."""
    w = tensors["talker.codec_head.weight"]
    w[2150] = w[row] * 1.3


def talker_goldens(tmp: Path) -> dict:
    import torch
    from safetensors.numpy import load_file, save_file

    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from omni_export.recipes.qwen3_tts.model import reference_voice
    from omni_export.recipes.qwen3_tts.speaker import log_mel
    from omni_export.text_tokenizer import load as load_tok
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration, mel_spectrogram

    summary = {}
    for name, size, kind, seed, requests in TALKER_CASES:
        d = ck.write_checkpoint(tmp / name, seed=seed, size=size, kind=kind)
        st = load_file(d / "model.safetensors")
        cfg = Qwen3TTSConfig.from_pretrained(d)
        for c in (cfg, cfg.talker_config, cfg.talker_config.code_predictor_config):
            c._attn_implementation = "eager"
        model = Qwen3TTSForConditionalGeneration(cfg).eval()

        def load(tensors):
            missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()},
                                                        strict=False)
            assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)

        load(st)
        tok = load_tok(d)
        # Pass 1: the first request's greedy tokens; make EOS win where its 6th frame's c0 did.
        first = requests[0]
        probe = torch.tensor([tok.encode(f"<|im_start|>assistant\n{first['text']}<|im_end|>\n<|im_start|>assistant\n")])
        with torch.no_grad():
            pk = dict(input_ids=[probe], languages=[first["language"]], non_streaming_mode=first["non_streaming"],
                      max_new_tokens=MAX_NEW_TOKENS, do_sample=False, subtalker_dosample=False)
            if first.get("speaker"):
                pk["speakers"] = [first["speaker"]]
            if kind == "base":
                pk["voice_clone_prompt"] = dict(ref_code=[None], ref_spk_embedding=[torch.zeros(cfg.talker_config.hidden_size)],
                                                x_vector_only_mode=[True], icl_mode=[False])
            if first.get("instruct"):
                pk["instruct_ids"] = [torch.tensor([tok.encode(f"<|im_start|>user\n{first['instruct']}<|im_end|>\n")])]
            row = int(model.generate(**pk)[0][0][5, 0])
        bias_eos(st, row)
        load(st)
        out = {"eos_row": np.array(row)}
        spk_emb = None
        if kind == "base":
            wav = reference_voice(5)
            mel = mel_spectrogram(torch.from_numpy(wav)[None], n_fft=1024, num_mels=128, sampling_rate=24000,
                                  hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)
            with torch.no_grad():
                spk_emb = model.speaker_encoder(mel)[0]
            out["ref_wav_seed"] = np.array(5)
            out["mel"] = mel[0].numpy()
            out["ours_mel"] = log_mel(wav)
            out["spk_embedding"] = spk_emb.numpy()
        for i, r in enumerate(requests):
            ids = torch.tensor([tok.encode(f"<|im_start|>assistant\n{r['text']}<|im_end|>\n<|im_start|>assistant\n")])
            kw = dict(input_ids=[ids], languages=[r["language"]], non_streaming_mode=r["non_streaming"],
                      max_new_tokens=MAX_NEW_TOKENS, do_sample=False, subtalker_dosample=False, repetition_penalty=1.05)
            if r.get("speaker"):
                kw["speakers"] = [r["speaker"]]
            if r.get("instruct"):
                ins = torch.tensor([tok.encode(f"<|im_start|>user\n{r['instruct']}<|im_end|>\n")])
                kw["instruct_ids"] = [ins]
                out[f"instruct_ids_{i}"] = ins[0].numpy()
            if spk_emb is not None:
                kw["voice_clone_prompt"] = dict(ref_code=[None], ref_spk_embedding=[spk_emb], x_vector_only_mode=[True],
                                                icl_mode=[False])
            with torch.no_grad():
                codes, _ = model.generate(**kw)
            out[f"text_ids_{i}"] = ids[0].numpy()
            out[f"codes_{i}"] = codes[0].numpy()
        np.savez_compressed(OUT / f"{name}.npz", **out)
        summary[name] = {"size": size, "kind": kind, "seed": seed, "requests": requests,
                         "frames": [int(out[f"codes_{i}"].shape[0]) for i in range(len(requests))],
                         "max_new_tokens": MAX_NEW_TOKENS, "eos_bias": f"codec_head[2150] = 1.3 * codec_head[{row}]"}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--omni-export", help="omni-export executable to run on the upstream-saved checkpoint")
    args = ap.parse_args()
    stub_torchaudio()
    import qwen_tts
    import torch
    import transformers

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        meta = {
            "generated_by": "tools/golden/make_goldens.py",
            "upstream": {"qwen-tts": getattr(qwen_tts, "__version__", "0.1.1"), "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "code2wav": code2wav_goldens(tmp),
            "upstream_saved": upstream_saved(tmp, args.omni_export),
            "talker": talker_goldens(tmp),
        }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
