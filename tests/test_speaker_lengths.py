"""x-vector cloning at any reference length up to --speaker-frames, against upstream qwen_tts.

Goldens (tools/golden/make_speaker_goldens.py): upstream's log-mel, x-vector and greedy codes for
0.5 s, 3 s, 6 s and 10 s references on the tiny Base checkpoint of test_talker.py as upstream's
save_pretrained wrote it (its config.json is the golden's; its tensors equal our seeded writer's),
and upstream's encoder on the shortest mel its reflect pads take. The graph takes a zero-padded
window of F frames and the valid length L: the x-vector is upstream's over L frames, eager and as
exported to ONNX; a reference past F frames, or shorter than the reflect pads, is a one-line error.
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
from omni_export.recipes.qwen3_tts import speaker as S
from omni_export.runtime.graphs import EagerGraphs
from omni_export.recipes.qwen3_tts.prompt import Request

META = json.loads((GOLDEN / "qwen3_tts" / "speaker_lengths.json").read_text())
REFS = {r["key"]: r for r in META["references"]}


@pytest.fixture(scope="module")
def golden():
    return np.load(GOLDEN / "qwen3_tts" / "speaker_lengths.npz")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The upstream-written tiny Base checkpoint: our seeded tensors (upstream's save_pretrained wrote
    the same bytes, META['checkpoint']['tensors_equal_ours']), its EOS row biased as the golden's,
    and the config.json upstream wrote."""
    tmp = tmp_path_factory.mktemp("speaker")
    d = upstream_base_checkpoint(tmp, META["checkpoint"], GOLDEN / "qwen3_tts" / "speaker_lengths_config.json")
    return d, M.load(d, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a).reshape(-1) - b) / np.linalg.norm(b))


def _voice(key):
    r = REFS[key]
    return M.reference_voice(r["seed"], r["seconds"])


def test_the_references_span_the_window(base):
    """0.5 s to 10 s: from far below the old fixed 282-frame window to past it, the longest within
    the default maximum (938 frames); the shortest mel is the reflect pads' limit, here and upstream."""
    _, model = base
    frames = [r["frames"] for r in META["references"]]
    assert frames[0] < 60 and 500 < frames[2] < model.speaker_frames and frames[-1] <= model.speaker_frames
    assert META["shortest_frames"] == S.shortest(model.cfg.speaker_encoder) == 5
    assert META["one_frame_shorter"].startswith("RuntimeError: Argument #4: Padding size")


@pytest.mark.parametrize("key", sorted(REFS))
def test_log_mel_frames_and_edges_match_upstream(golden, key):
    mel = S.log_mel(_voice(key))
    assert len(mel) == REFS[key]["frames"] == S.mel_frames(len(_voice(key)))
    assert np.abs(mel[:8] - golden[f"{key}_mel_head"]).max() < 1e-5
    assert np.abs(mel[-8:] - golden[f"{key}_mel_tail"]).max() < 1e-5


def test_eager_x_vector_is_upstreams_at_every_length(base, golden):
    _, model = base
    graphs = EagerGraphs(model)
    for key in REFS:
        assert _rel(model.speaker_embedding(graphs, _voice(key)), golden[f"{key}_xvec"]) < 1e-5, key
    out = graphs("speaker_encoder", S.window(golden["shortest_mel"], model.speaker_frames))["embedding"]
    assert _rel(out, golden["shortest_xvec"]) < 1e-5


def test_exported_onnx_x_vector_is_upstreams_at_every_length(base, golden, tmp_path):
    """The graph as exported (torch.export -> ONNX, the pipeline's exporter) on ONNX Runtime: the
    reflect gathers and masks are computed in the graph from the length input."""
    import onnxruntime as ort

    from omni_export.exporters.onnx import export

    _, model = base
    g = model.graph("speaker_encoder")
    ex = S.window(golden["shortest_mel"], model.speaker_frames)
    with torch.no_grad():
        prog = torch.export.export(g.module, tuple(torch.from_numpy(ex[n]) for n in ("mel", "length")), strict=False)
    path = export(prog, tmp_path / "speaker_encoder.onnx", ["mel", "length"], ["embedding"])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for key in REFS:
        out = sess.run(None, S.window(S.log_mel(_voice(key)), model.speaker_frames))[0]
        assert _rel(out, golden[f"{key}_xvec"]) < 1e-5, key
    assert _rel(sess.run(None, ex)[0], golden["shortest_xvec"]) < 1e-5
    # the frames past L are never read: garbage there changes nothing
    w = S.window(S.log_mel(_voice("ref_0p5s")), model.speaker_frames)
    w["mel"][0, REFS["ref_0p5s"]["frames"]:] = np.random.default_rng(0).normal(0, 5, w["mel"][0, REFS["ref_0p5s"]["frames"]:].shape)
    assert _rel(sess.run(None, w)[0], golden["ref_0p5s_xvec"]) < 1e-5


@pytest.mark.parametrize("key", sorted(REFS))
def test_greedy_codes_from_each_reference_are_upstreams(base, golden, key):
    """x-vector-only cloning from the reference itself (log-mel, encoder, prompt, host loop)."""
    _, model = base
    graphs = EagerGraphs(model)
    xvec = model.speaker_embedding(graphs, _voice(key))
    for i, r in enumerate(META["checkpoint"]["requests"]):
        req = Request(text_ids=golden[f"text_ids_{i}"].tolist(), language=r["language"],
                      non_streaming=r["non_streaming"], speaker_embedding=xvec)
        gen, _ = model.synthesize(graphs, req, model.gen_options(greedy=True, predictor="frame", max_frames=11),
                                  with_audio=False)
        np.testing.assert_array_equal(gen.codes, golden[f"{key}_codes_{i}"], err_msg=f"{key} request {i}")


def test_a_reference_outside_the_window_is_refused(base):
    _, model = base
    graphs = EagerGraphs(model)
    most = model.speaker_frames
    longest = M.reference_voice(1, seconds=(most * 256 + 255) / 24000)
    assert S.mel_frames(len(longest)) == most
    model.speaker_embedding(graphs, longest)                 # exactly F frames: taken whole
    with pytest.raises(UsageError, match=rf"^the reference audio is 10.02 s \({most + 1} log-mel frames\); the "
                                         rf"speaker encoder takes at most {most} frames \(10.01 s, --speaker-frames\)"):
        model.speaker_embedding(graphs, np.zeros(len(longest) + 1, np.float32))
    with pytest.raises(UsageError, match=r"is 0.05 s \(4 log-mel frames\); the speaker encoder needs at least 5 "
                                         r"frames \(0.05 s: its largest reflect pad is 4 frames\)"):
        model.speaker_embedding(graphs, np.zeros(5 * 256 - 1, np.float32))
    model.speaker_embedding(graphs, np.zeros(5 * 256, np.float32))


def test_synth_refuses_a_too_long_ref_audio_in_one_line(base, tmp_path):
    from omni_export.modeling.audio import write_wav

    d, _ = base
    wav = tmp_path / "long.wav"
    write_wav(wav, M.reference_voice(3, seconds=10.5), 24000)
    proc = run_cli("synth", "qwen3-tts", "--checkpoint", str(d), "--text-ids", "1,2,3", "--ref-audio", str(wav),
                   "--max-frames", "1", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (f"omni-export: error: --ref-audio {wav} is 10.50 s (984 log-mel frames); the speaker "
                         f"encoder takes at most 938 frames (10.01 s, --speaker-frames): trim it, or build with a "
                         f"larger --speaker-frames (at most 6000) and synth --build it"), lines[-1]
    assert all("omni-export" not in line for line in lines[:-1])


def test_calibration_references_cover_short_and_full_windows(base):
    """The speaker encoder is calibrated and scored on references from 0.5 s to the whole window."""
    _, model = base
    n = 18
    frames = [S.mel_frames(len(model.calibration_voice(i, n, False))) for i in range(n)]
    assert frames[0] == 46 and frames[-1] == model.speaker_frames and frames == sorted(frames)
    held = [S.mel_frames(len(model.calibration_voice(i, 2, True))) for i in range(2)]
    assert held == [46, model.speaker_frames]


def test_a_window_shorter_than_the_reflect_pads_is_refused_at_load(base, tmp_path):
    """--speaker-frames below the encoder's shortest input (its largest reflect pad + 1: 17 frames
    with a dilation of 16) could never be run; said when the checkpoint loads."""
    import shutil

    d, _ = base
    work = tmp_path / "dilated"
    shutil.copytree(d, work)
    cfg = json.loads((work / "config.json").read_text())
    cfg["speaker_encoder_config"]["enc_dilations"] = [1, 2, 3, 16, 1]
    (work / "config.json").write_text(json.dumps(cfg))
    opts = {o.name: o.default for o in get_recipe("qwen3-tts").options}
    with pytest.raises(UsageError, match=r"^--speaker-frames 16 is below the 17 frames this speaker encoder's "
                                         r"reflect pads need$"):
        M.load(work, {**opts, "speaker-frames": 16}, tmp_path)
    assert M.load(work, {**opts, "speaker-frames": 17}, tmp_path).speaker_frames == 17


def test_synth_refuses_a_build_whose_speaker_encoder_has_no_length_input():
    """A build made before the length input (recipe version < 4) pools its whole fixed window."""
    from types import SimpleNamespace

    from omni_export.runtime.runners import RunnerSpec
    from omni_export.recipes.qwen3_tts.synth import _check_window

    old = SimpleNamespace(specs={"speaker_encoder": RunnerSpec("ort-cpu", "x.onnx", ("mel",), ("embedding",))})
    with pytest.raises(UsageError, match=r"^--build out: its speaker_encoder pools a fixed window of frames"):
        _check_window(old, "out")
    _check_window(SimpleNamespace(specs={"speaker_encoder": RunnerSpec("ort-cpu", "x.onnx", ("mel", "length"),
                                                                       ("embedding",))}), "out")
    _check_window(EagerGraphs(None), None)           # eager graphs are this code's
