"""Golden outputs of token2wav's HiFT vocoder on omni-export's tiny seeded checkpoint
(assets/token2wav/hift.safetensors), computed with upstream's own HiFTGenerator (Step-Audio2 as
MiniCPM-o ships it: PyPI stepaudio2-minicpmo 0.1.1, flashcosyvoice/modules/hifigan.py and
hifigan_components/layers.py), in a venv of its own. The package's __init__ imports the whole
token2wav stack (onnxruntime, s3tokenizer, torchaudio); its packages are stubbed with their real
paths so only hifigan.py and layers.py run.

Upstream draws its source noise with torch.randn_like on every call: here that call returns the
float32 cast of numpy's default_rng(SEED).standard_normal((frames * 480, 9)), which the test draws
again (vocoder.noise), so nothing random needs committing. The iSTFT's inputs are recorded by
wrapping HiFTGenerator._istft (magnitude after exp, phase after sin).

  /tmp/mcref/bin/pip install scipy      # hifigan.py imports scipy.signal.get_window
  /tmp/mcref/bin/python tools/golden/make_minicpm_o_hift_goldens.py /tmp/mc-golden-ckpt tests/golden/minicpm_o
"""
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

FRAMES, SEED, MEL_SEED = 12, 17, 19


def upstream_hifigan():
    root = Path(importlib.util.find_spec("stepaudio2").submodule_search_locations[0])
    for name, sub in (("stepaudio2", ""), ("stepaudio2.flashcosyvoice", "flashcosyvoice"),
                      ("stepaudio2.flashcosyvoice.modules", "flashcosyvoice/modules")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(root / sub)]
        sys.modules[name] = pkg
    import stepaudio2.flashcosyvoice.modules.hifigan as hifigan

    return hifigan


def main(ckpt: Path, dest: Path) -> None:
    hifigan = upstream_hifigan()
    state = load_file(str(ckpt / "assets" / "token2wav" / "hift.safetensors"))
    base = state["conv_pre.parametrizations.weight.original1"].shape[0]
    cond = state["f0_predictor.condnet.0.parametrizations.weight.original1"].shape[0]
    model = hifigan.HiFTGenerator(base_channels=base,
                                  f0_predictor=hifigan.ConvRNNF0Predictor(cond_channels=cond)).eval()
    model.load_state_dict(state, strict=True)           # token2wav.py: strict, after stripping "generator."

    rng = np.random.default_rng(MEL_SEED)
    mel = np.linspace(-2.0, -8.0, 80)[:, None] + rng.standard_normal((80, FRAMES))
    for _ in range(3):
        mel = (np.roll(mel, 1, -1) + mel + np.roll(mel, -1, -1)) / 3.0
    mel = mel[None].astype(np.float32)
    noise = torch.from_numpy(np.random.default_rng(SEED).standard_normal((FRAMES * 480, 9)).astype(np.float32))[None]

    original = torch.randn_like
    torch.randn_like = lambda x, *a, **k: noise.clone() if tuple(x.shape) == tuple(noise.shape) else original(x, *a, **k)
    seen = {}
    istft = model._istft

    def record(magnitude, phase):
        seen["magnitude"], seen["phase"] = magnitude.clone(), phase.clone()
        return istft(magnitude, phase)

    model._istft = record
    try:
        f0 = model.f0_predictor(torch.from_numpy(mel))
        wav, source = model(torch.from_numpy(mel))
    finally:
        torch.randn_like = original
    dest.mkdir(parents=True, exist_ok=True)
    arrays = {"mel": mel, "f0": f0.detach().numpy(), "source": source.numpy(), "magnitude": seen["magnitude"].numpy(),
              "phase": seen["phase"].numpy(), "wav": wav.numpy()}
    for name, a in arrays.items():
        np.save(dest / f"hift_{name}.npy", a.astype(np.float32))
    meta = json.loads((dest / "meta.json").read_text()) if (dest / "meta.json").exists() else {}
    from importlib.metadata import version

    voiced = float((arrays["f0"] > 10).mean())
    meta["hift"] = {"upstream": f"stepaudio2-minicpmo {version('stepaudio2-minicpmo')} flashcosyvoice/modules/hifigan.py "
                                f"HiFTGenerator (SourceModuleHnNSF2, 24 kHz)", "frames": FRAMES, "noise_seed": SEED,
                    "mel_seed": MEL_SEED, "voiced_fraction": round(voiced, 3), "torch": torch.__version__}
    (dest / "meta.json").write_text(json.dumps(meta, indent=2))
    print(f"f0 {arrays['f0'].round(1).tolist()} voiced {voiced:.2f}; wav {arrays['wav'].shape}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
