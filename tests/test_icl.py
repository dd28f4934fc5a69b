"""In-context (ICL) voice cloning against upstream qwen_tts: `synth --ref-audio WAV --ref-text "..."`.

Goldens (tools/golden/make_icl_goldens.py): on the tiny Base checkpoint as upstream's save_pretrained
wrote it (make_speaker_goldens.py's), what upstream's `generate_voice_clone(text, ref_audio, ref_text)`
runs: the reference's codes from its speech tokenizer's encoder, its x-vector, `generate` with the
reference transcript and codes in the prompt (greedy), and the decode of reference + new codes with the
reference's share cut. Three cases cover the prompt's branches: streaming with more text rows than
codec rows, streaming with fewer, and non-streaming. The exported `speech_encoder` graph (ONNX on ONNX
Runtime) must give the same codes for every golden reference, and ICL through it the same codes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import GOLDEN, run_cli, upstream_base_checkpoint
from omni_export.core import UsageError
from omni_export.recipes import get_recipe
from omni_export.recipes.qwen3_tts import model as M
from omni_export.recipes.qwen3_tts import speech_encoder as SE
from omni_export.runtime.graphs import EagerGraphs
from omni_export.recipes.qwen3_tts.prompt import Request

META = json.loads((GOLDEN / "qwen3_tts" / "icl.json").read_text())
CASES = {c["key"]: c for c in META["cases"]}
ENCODER = json.loads((GOLDEN / "qwen3_tts" / "speech_encoder.json").read_text())
# 20 frames (1.6 s) hold every golden reference; 32 frames of left context decode the longest case's
# 28 frames (reference + new) with all of them in view, as upstream's one-shot decode does
OPTIONS = {**{o.name: o.default for o in get_recipe("qwen3-tts").options}, "encoder-frames": 20, "left-context": 32}


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN / "qwen3_tts" / "icl.npz")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The upstream-written tiny Base checkpoint (our seeded tensors, upstream's save_pretrained wrote the
    same bytes; its EOS row biased as the golden's; the config.json upstream wrote)."""
    tmp = tmp_path_factory.mktemp("icl")
    d = upstream_base_checkpoint(tmp, META["checkpoint"], GOLDEN / "qwen3_tts" / META["config_json"])
    return d, M.load(d, OPTIONS, tmp)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _voice(case: dict) -> np.ndarray:
    import hashlib

    wav = M.reference_voice(case["seed"], case["seconds"])
    assert hashlib.sha256(wav.tobytes()).hexdigest() == case["wav_sha256"], "not the waveform upstream encoded"
    return wav


def _request(model, graphs, golden, key: str, ref_codes) -> Request:
    case = CASES[key]
    return Request(text_ids=golden[f"{key}_text_ids"].tolist(), language=case["language"],
                   non_streaming=case["non_streaming"], speaker_embedding=model.speaker_embedding(graphs, _voice(case)),
                   ref_ids=golden[f"{key}_ref_ids"].tolist(), ref_codes=ref_codes)


def _greedy(model):
    return model.gen_options(greedy=True, predictor="frame", max_frames=META["max_new_tokens"] - 1)


def test_the_cases_cover_each_prompt_branch():
    streaming = [c for c in META["cases"] if not c["non_streaming"]]
    assert {c["text_rows"] > c["codec_rows"] for c in streaming} == {True, False}
    assert any(c["non_streaming"] for c in META["cases"])


@pytest.mark.parametrize("key", sorted(CASES))
def test_eager_in_context_generate_is_upstreams(base, golden, key):
    """Ids templated as upstream's, the reference's codes from the encoder graph (a zero-padded window
    and the length), then greedy in-context generation: upstream's codes exactly."""
    _, model = base
    case, graphs = CASES[key], EagerGraphs(model)
    assert model.template(case["text"]) == golden[f"{key}_text_ids"].tolist()
    assert model.ref_template(case["ref_text"]) == golden[f"{key}_ref_ids"].tolist()
    ref = model.reference_codes(graphs, _voice(case))
    np.testing.assert_array_equal(ref, golden[f"{key}_ref_codes"])
    gen, _ = model.synthesize(graphs, _request(model, graphs, golden, key, ref), _greedy(model), with_audio=False)
    assert gen.prompt_tokens > len(ref)
    np.testing.assert_array_equal(gen.codes, golden[f"{key}_codes"])


def test_the_waveform_is_the_continuation_upstream_cuts(base, golden):
    """Reference + new codes decoded as one stream and the reference's share cut with upstream's
    float rounding (one sample of the reference's last frame is kept in this case)."""
    _, model = base
    key = "long_ref_non_streaming"
    case = CASES[key]
    wav = model.decode_continuation(EagerGraphs(model), golden[f"{key}_ref_codes"].astype(np.int64),
                                    golden[f"{key}_codes"].astype(np.int64))
    assert case["cut"] % 1920 and len(wav) == case["out_samples"]
    assert np.abs(wav[:64] - golden[f"{key}_wav_head"]).max() < 1e-4
    assert np.abs(wav[-64:] - golden[f"{key}_wav_tail"]).max() < 1e-4


@pytest.fixture(scope="module")
def exported(base, tmp_path_factory):
    """The speech_encoder component as the pipeline exports it (torch.export -> ONNX), on ONNX Runtime."""
    import onnxruntime as ort

    from omni_export.exporters.onnx import export

    _, model = base
    g = model.graph("speech_encoder")
    ex = SE.window(np.zeros(1, np.float32), model.encoder_frames * 1920)
    with torch.no_grad():
        prog = torch.export.export(g.module, tuple(torch.from_numpy(ex[s.name]) for s in g.inputs), strict=False)
    path = export(prog, tmp_path_factory.mktemp("icl-onnx") / "speech_encoder.onnx",
                  [s.name for s in g.inputs], [s.name for s in g.outputs])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda inputs: dict(zip((s.name for s in g.outputs), sess.run(None, inputs)))


def test_exported_encoder_gives_upstreams_codes_for_every_length(base, exported, golden):
    """One static graph (a window of E frames and the valid length) for 0.5-1.3 s references: the
    speech-encoder goldens (7, 9.6, 12 and 17 frames) and the ICL ones; margins as eager's."""
    _, model = base
    enc = np.load(GOLDEN / "qwen3_tts" / "speech_encoder.npz")
    refs = [(M.reference_voice(r["seed"], r["seconds"]), enc[f"{k}_codes"]) for k, r in ENCODER["references"].items()]
    refs += [(_voice(c), golden[f"{k}_ref_codes"]) for k, c in CASES.items()]
    for wav, want in refs:
        out = exported(SE.window(wav, model.encoder_frames * 1920))
        assert out["codes"].dtype == np.int32 and out["codes"].shape == (1, 20, 16)
        np.testing.assert_array_equal(out["codes"][0, :len(want)], want)
    eager = EagerGraphs(model)("speech_encoder", SE.window(wav, model.encoder_frames * 1920))
    np.testing.assert_allclose(out["margins"], eager["margins"], rtol=1e-4, atol=1e-5)
    assert (eager["margins"] >= 0).all() and np.array_equal(out["codes"], eager["codes"])


def test_in_context_generate_through_the_exported_encoder_equals_eager(base, exported, golden):
    _, model = base
    eager = EagerGraphs(model)

    def graphs(name, inputs):
        return exported(inputs) if name == "speech_encoder" else eager(name, inputs)

    key = "short_ref_streaming"
    ref = model.reference_codes(graphs, _voice(CASES[key]))
    gen, _ = model.synthesize(graphs, _request(model, graphs, golden, key, ref), _greedy(model), with_audio=False)
    np.testing.assert_array_equal(gen.codes, golden[f"{key}_codes"])


def test_synth_clones_in_context(base, golden, tmp_path):
    """The command as users run it: --ref-audio and --ref-text give upstream's codes; --json says how."""
    from omni_export.modeling.audio import write_wav

    d, _ = base
    key = "long_ref_streaming"
    case = CASES[key]
    write_wav(tmp_path / "ref.wav", _voice(case), 24000)
    ref = _voice(case)
    # the WAV holds 16-bit samples: its codes are those of that audio, so the check is eager on it
    proc = run_cli("synth", "qwen3-tts", "--checkpoint", str(d), "--ref-audio", str(tmp_path / "ref.wav"),
                   "--ref-text", case["ref_text"], "--text", case["text"], "--language", case["language"], "--greedy",
                   "--max-frames", str(META["max_new_tokens"] - 1), "--codes-out", str(tmp_path / "c.npy"), "--json",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["voice_clone"] == "in-context" and summary["ref_ids"] == golden[f"{key}_ref_ids"].tolist()
    assert summary["ref_frames"] == case["ref_frames"]
    _, model = base
    graphs = EagerGraphs(model)
    pcm = (np.round(np.clip(ref, -1, 1) * 32767) / 32768).astype(np.float32)       # what the WAV holds
    req = Request(text_ids=golden[f"{key}_text_ids"].tolist(), language=case["language"], non_streaming=False,
                  speaker_embedding=model.speaker_embedding(graphs, pcm), ref_ids=golden[f"{key}_ref_ids"].tolist(),
                  ref_codes=model.reference_codes(graphs, pcm))
    want, _ = model.synthesize(graphs, req, _greedy(model), with_audio=False)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), want.codes)


def _synth(**kw):
    from omni_export.recipes.qwen3_tts import synth

    args = {o.name: o.default for o in synth.options()}
    args.update(kw)
    return synth.run(**args)


def test_ref_text_errors_are_one_line(base, tiny_checkpoint, tmp_path):
    from omni_export.modeling.audio import write_wav

    d, _ = base
    wav = tmp_path / "ref.wav"
    write_wav(wav, M.reference_voice(1, 0.5), 24000)
    with pytest.raises(UsageError, match=r"^--ref-text is the transcript of --ref-audio: give the reference WAV too$"):
        _synth(checkpoint=str(d), text="Hi.", ref_text="Hello.")
    with pytest.raises(UsageError, match=r"^--ref-text \(in-context cloning\) needs a Base checkpoint; this one is "
                                         r"custom_voice$"):
        _synth(checkpoint=str(tiny_checkpoint), text="Hi.", ref_text="Hello.", ref_audio=str(wav))
    with pytest.raises(UsageError, match=r"^--ref-text is empty"):
        _synth(checkpoint=str(d), text="Hi.", ref_text=" ", ref_audio=str(wav))
    long = tmp_path / "long.wav"          # within the speaker encoder's 938 log-mel frames, past 125 codec frames
    write_wav(long, M.reference_voice(2, seconds=240120 / 24000), 24000)
    with pytest.raises(UsageError, match=rf"^--ref-audio {long} is 10.01 s \(126 codec frames\); the speech encoder "
                                         r"\(in-context cloning\) takes at most 125 frames \(10.00 s, --encoder-frames\): "
                                         r"trim it, or build with a larger --encoder-frames \(at most 750\) and synth "
                                         r"--build it$"):
        _synth(checkpoint=str(d), text="Hi.", ref_text="Hello.", ref_audio=str(long))


def test_speaker_calibration_clones_real_wavs(base, tiny_checkpoint, tmp_path):
    """--speaker-calibration DIR: the calibration prompts clone its WAVs (name order, read as --ref-audio
    reads one: resampled to 24 kHz, cut to the window) instead of synthetic voices; the held-out ones
    stay synthetic; the capture key follows the files' samples."""
    from omni_export.modeling.audio import read_wav, write_wav

    d, model = base
    voices = tmp_path / "voices"
    voices.mkdir()
    write_wav(voices / "a.wav", M.reference_voice(7, 1.0), 24000)
    write_wav(voices / "b.wav", M.reference_voice(8, 1.0)[::3], 8000)       # another rate: resampled
    write_wav(voices / "c.wav", M.reference_voice(9, 12.0), 24000)          # past the speaker window: cut
    (voices / "notes.txt").write_text("not audio")
    opts = {**OPTIONS, "speaker-calibration": str(voices)}
    m = M.load(d, opts, tmp_path)
    wavs = [read_wav(voices / f"{n}.wav", 24000) for n in "abc"]
    for i in range(4):
        got = m.calibration_voice(i, 18, False)
        want = wavs[i % 3][:len(got)]
        assert len(got) == min(len(wavs[i % 3]), m.speaker_frames * 256 + 128) and np.array_equal(got, want)
    np.testing.assert_array_equal(m.calibration_voice(1, 2, True), model.calibration_voice(1, 2, True))
    assert m.capture_key() != model.capture_key() and m.seeds["speaker_calibration"] == str(voices)
    write_wav(voices / "a.wav", M.reference_voice(10, 1.0), 24000)
    assert M.load(d, opts, tmp_path).capture_key() != m.capture_key()
    with pytest.raises(UsageError, match=rf"^--speaker-calibration {tmp_path}: no .wav files in the directory$"):
        M.load(d, {**OPTIONS, "speaker-calibration": str(tmp_path)}, tmp_path / "x")
    write_wav(voices / "0.wav", np.zeros(1000, np.float32), 24000)
    with pytest.raises(UsageError, match=rf"^--speaker-calibration {voices / '0.wav'} is 0.042 s; a reference needs "
                                         r"at least 5 log-mel frames \(0.05 s\)$"):
        M.load(d, opts, tmp_path)
    with pytest.raises(UsageError, match=r"^--speaker-calibration calibrates a Base checkpoint's speaker and speech "
                                         r"encoders; this one is custom_voice$"):
        M.load(tiny_checkpoint, opts, tmp_path)
