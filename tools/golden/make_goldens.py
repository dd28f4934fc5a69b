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
    """Save a tiny checkpoint with upstream's save_pretrained; keep its configs."""
    import torch
    from safetensors.torch import load_file

    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    ours = ck.write_checkpoint(tmp / "ours", seed=11)
    dec_cfg = json.loads((ours / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    # A small Mimi encoder so the upstream-saved file stays tiny (the encoder is not exported).
    enc_cfg = {"hidden_size": 32, "num_filters": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
               "num_key_value_heads": 2, "intermediate_size": 32, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
               "head_dim": 16, "upsampling_ratios": [8, 6, 5, 4], "num_quantizers": 32, "sliding_window": 250,
               "frame_rate": 12.5, "upsample_groups": 32}
    torch.manual_seed(0)
    tok_cfg = Qwen3TTSTokenizerV2Config(encoder_config=enc_cfg, decoder_config=dec_cfg)
    model = Qwen3TTSTokenizerV2Model(tok_cfg).eval()
    st = load_file(ours / "speech_tokenizer" / "model.safetensors")
    missing, unexpected = model.load_state_dict(st, strict=False)
    assert not unexpected, unexpected
    assert not [m for m in missing if m.startswith("decoder.") and "rotary_emb" not in m], missing
    saved = tmp / "upstream_saved"
    model.save_pretrained(saved / "speech_tokenizer")
    (saved / "speech_tokenizer" / "preprocessor_config.json").write_text(
        json.dumps(ck.PREPROCESSOR_CONFIG, indent=2))
    Qwen3TTSConfig(tts_model_type="custom_voice", tts_model_size="0b6").save_pretrained(saved)
    keep = OUT / "upstream_saved"
    (keep / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    for rel in ("config.json", "speech_tokenizer/config.json"):
        (keep / rel).write_text((saved / rel).read_text())
    header = load_file(saved / "speech_tokenizer" / "model.safetensors")
    names = {k: list(v.shape) for k, v in sorted(header.items())}
    (keep / "speech_tokenizer_tensors.json").write_text(json.dumps(names, indent=1))
    record = {"seed": 11, "tensors": len(names),
              "decoder_tensors_equal_ours": all(torch.equal(header[k], st[k]) for k in st if k.startswith("decoder."))}
    if omni_export:
        out = tmp / "build"
        cmd = [omni_export, "qwen3-tts", "--target", "s25-htp", "--checkpoint", str(saved), "--out", str(out),
               "--chunk-frames", "2", "--left-context", "2", "--formats", "onnx,ctx", "--json", "-q"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        record["omni_export_run"] = {"cmd": " ".join(cmd[1:]), "exit_code": proc.returncode,
                                     "result": json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else proc.stderr[-2000:]}
    return record


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
        }
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
