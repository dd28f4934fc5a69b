"""The 12 Hz speech tokenizer's encoder (reference audio -> codes, in-context cloning) against upstream.

Goldens (tools/golden/make_speech_encoder_goldens.py): upstream's `Qwen3TTSTokenizer.from_pretrained`
on the speech_tokenizer/ of our seeded tiny Base checkpoint, `.encode(wav, sr=24000)` of 0.5 s,
0.77 s, 0.96 s and 1.3 s voice-like references: its codes [frames, 16] and the quantizer's input.
Our module loads the same `encoder.*` tensors strictly and must give the same codes exactly. The
exported component graph (ONNX on ONNX Runtime), a zero-padded window and the valid length, gives
them for every golden length: tests/test_icl.py.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from conftest import GOLDEN
from omni_export.core import UsageError
from omni_export.recipes.qwen3_tts import checkpoint as ck
from omni_export.recipes.qwen3_tts import speech_encoder as SE
from omni_export.recipes.qwen3_tts.model import reference_voice
from omni_export.weights import write_safetensors

META = json.loads((GOLDEN / "qwen3_tts" / "speech_encoder.json").read_text())
KEYS = sorted(META["references"])


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN / "qwen3_tts" / "speech_encoder.npz")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    c = META["checkpoint"]
    return ck.write_checkpoint(tmp_path_factory.mktemp("se") / "base", seed=c["seed"], size=c["size"], kind=c["kind"])


@pytest.fixture(scope="module")
def encoder(base):
    return SE.load_speech_encoder(base)


def wav_of(key: str) -> np.ndarray:
    r = META["references"][key]
    wav = reference_voice(r["seed"], r["seconds"])
    assert hashlib.sha256(wav.tobytes()).hexdigest() == r["wav_sha256"], "not the waveform upstream encoded"
    return wav


@pytest.mark.parametrize("key", KEYS)
def test_codes_are_upstreams_exactly(encoder, golden, key):
    wav = wav_of(key)
    codes = SE.encode(encoder, wav).numpy()
    want = golden[f"{key}_codes"].astype(np.int64)
    assert codes.shape == want.shape == (encoder.config.frames(wav.size), 16)
    assert np.array_equal(codes, want), f"{int((codes != want).sum())} of {want.size} codes differ"
    # the goldens exercise every codebook (not a constant code)
    assert all(n > 1 for n in META["references"][key]["distinct_codes_per_codebook"][1:])


@pytest.mark.parametrize("key", KEYS)
def test_quantizer_input_matches_upstream(encoder, golden, key):
    with torch.no_grad():
        z = encoder.latent(torch.from_numpy(wav_of(key))[None]).numpy()
    want = golden[f"{key}_latent"]
    assert z.shape == want.shape
    assert np.abs(z - want).max() <= 1e-5 * np.abs(want).max()


def test_nearest_codeword_is_cdists(encoder):
    """The argmin runs on torch.cdist's own distances (upstream's), bit for bit."""
    x = torch.randn(9, encoder.config.codebook_dim, generator=torch.Generator().manual_seed(0))
    table = encoder.acoustic.codebooks[3]
    assert torch.equal(SE._distances(x, encoder.acoustic.aug3).argmin(-1), torch.cdist(x[None], table[None])[0].argmin(-1))
    assert torch.equal(encoder.acoustic.table3, table) and torch.equal(encoder.acoustic.aug3, SE.augment(table))


def test_mimi_default_geometry_codes_are_upstreams():
    """MimiConfig's default geometry (the released encoder's, believed): hidden 512, 64 filters, 8
    layers, head_dim 64, 32 codebooks of 2048 x 256; seeded tensors, never written to disk."""
    from omni_export.weights import seeded_tensors

    r = META["mimi_geometry"]
    m = SE.build_speech_encoder(SE.MIMI_SPEECH_ENCODER,
                                seeded_tensors(SE.speech_encoder_tensors(SE.MIMI_SPEECH_ENCODER), r["tensor_seed"]))
    wav = reference_voice(r["seed"], r["seconds"])
    assert hashlib.sha256(wav.tobytes()).hexdigest() == r["wav_sha256"]
    want = np.load(GOLDEN / "qwen3_tts" / "speech_encoder.npz")[f"{r['key']}_codes"].astype(np.int64)
    assert np.array_equal(SE.encode(m, wav).numpy(), want)


def test_config_round_trips_and_matches_the_writer(base):
    raw = json.loads((base / "speech_tokenizer" / "config.json").read_text())
    assert SE.read_speech_encoder_config(base) == SE.TINY_SPEECH_ENCODER
    assert raw["encoder_valid_num_quantizers"] == 16 and raw["encoder_config"]["model_type"] == "mimi"


def test_other_kinds_have_no_encoder_and_say_so(tmp_path):
    d = ck.write_checkpoint(tmp_path / "cv", seed=0)
    with pytest.raises(UsageError, match="missing encoder_config"):
        SE.load_speech_encoder(d)


def _rewrite(base, tmp_path, edit):
    import shutil

    from safetensors.numpy import load_file

    d = tmp_path / "ck"
    shutil.copytree(base, d)
    st = load_file(d / "speech_tokenizer" / "model.safetensors")
    edit(st)
    write_safetensors(d / "speech_tokenizer" / "model.safetensors", st)
    return d


def test_loading_is_strict(base, tmp_path):
    name = "encoder.quantizer.acoustic_residual_vector_quantizer.layers.2.codebook.embed_sum"
    d = _rewrite(base, tmp_path, lambda st: st.pop(name))
    with pytest.raises(UsageError, match="layers.2.codebook.embed_sum' is missing"):
        SE.load_speech_encoder(d)
    extra = {"encoder.encoder.layers.99.conv.weight": np.zeros(3, np.float32)}
    d = _rewrite(base, tmp_path / "b", lambda st: st.update(extra))
    with pytest.raises(UsageError, match="layers.99.conv.weight' is not part of the encoder"):
        SE.load_speech_encoder(d)
    wrong = {"encoder.downsample.conv.weight": np.zeros((32, 32, 3), np.float32)}
    d = _rewrite(base, tmp_path / "c", lambda st: st.update(wrong))
    with pytest.raises(UsageError, match="downsample.conv.weight' has shape"):
        SE.load_speech_encoder(d)


def test_unused_quantizer_levels_may_be_absent(base, tmp_path):
    """Codebooks past encoder_valid_num_quantizers (16 of 32) are never used: not required."""
    def drop(st):
        for k in [k for k in st if ".layers.20.codebook." in k]:
            st.pop(k)
    SE.load_speech_encoder(_rewrite(base, tmp_path, drop))
