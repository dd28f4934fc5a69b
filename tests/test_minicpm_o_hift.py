"""MiniCPM-o 4.5 / token2wav HiFT vocoder: the official tensor layouts, the graphs + host (NSF source, iSTFT)
against upstream's own HiFTGenerator, an fp16 build of hift_f0 / hift, and a WAV from synth."""
from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import GOLDEN, builds_by, read_manifest, run_cli
from omni_export.core import UsageError
from omni_export.recipes.minicpm_o import checkpoint as ck
from omni_export.recipes.minicpm_o import hift as H
from omni_export.recipes.minicpm_o import model as M
from omni_export.recipes.minicpm_o import vocoder as V
from omni_export.runtime.graphs import EagerGraphs

GOLDEN_MC = GOLDEN / "minicpm_o"
GEOM = ["--context-length", "64", "--prefill-tokens", "16", "--mel-frames", "32", "--flow-tokens", "32"]
OPTS = {"context-length": 64, "prefill-tokens": 16, "mel-frames": 12, "flow-tokens": 32}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return ck.write_checkpoint(tmp_path_factory.mktemp("mch") / "tiny", seed=0)


def _snr(ref: np.ndarray, out: np.ndarray) -> float:
    err = np.sum((ref - out).astype(np.float64) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / err))


# ------------------------------------------------------------------------------------------ golden

def test_hift_graphs_and_host_match_upstreams_hiftgenerator_golden(tiny, tmp_path):
    """Goldens (tools/golden/make_minicpm_o_hift_goldens.py, own venv): upstream's HiFTGenerator on this tiny
    checkpoint's hift.safetensors (loaded strict), 12 mel frames, its source noise replaced by the seeded draw
    vocoder.noise makes. Ours: hift_f0 -> host NSF source (float64 phase) -> hift -> host iSTFT."""
    g = {k: np.load(GOLDEN_MC / f"hift_{k}.npy") for k in ("mel", "f0", "source", "magnitude", "phase", "wav")}
    meta = json.loads((GOLDEN_MC / "meta.json").read_text())["hift"]
    assert 0 < meta["voiced_fraction"] < 1          # both branches of the source ran: sines and noise only
    m = M.load(tiny, OPTS, tmp_path)
    cfg, t = m.hift
    eager = EagerGraphs(m)
    f0 = eager("hift_f0", {"mel": g["mel"]})["f0"]
    assert _snr(g["f0"], f0) > 100
    w, b = t["m_source.l_linear.weight"].numpy(), t["m_source.l_linear.bias"].numpy()
    source = V.excitation(f0[0], w, b, V.noise(meta["frames"], cfg, meta["noise_seed"]), cfg)
    assert _snr(g["source"][0, 0], source) > 80    # upstream's phase is float32, ours float64
    out = eager("hift", {"mel": g["mel"], "source": V.pad_source(g["source"][0, 0], cfg)})
    assert _snr(g["magnitude"], out["magnitude"]) > 120 and _snr(g["phase"], out["phase"]) > 120   # the graph alone
    wav = m.vocode(eager, g["mel"], meta["noise_seed"])
    assert wav.shape == (meta["frames"] * 480,) and wav.dtype == np.float32
    assert _snr(g["wav"][0], wav) > 85               # the whole vocoder, upstream's own iSTFT included


def test_host_istft_equals_torch_istft_and_the_stft_conv_equals_torch_stft():
    cfg = H.HiFTConfig()
    rng = np.random.default_rng(0)
    mag, ph = np.abs(rng.standard_normal((9, 61))) * 3, rng.uniform(-4, 4, (9, 61))
    spec = torch.complex(torch.from_numpy(mag * np.cos(ph)), torch.from_numpy(mag * np.sin(ph)))
    ref = torch.istft(spec, 16, 4, 16, window=torch.hann_window(16, dtype=torch.float64)).numpy()
    assert _snr(ref, V.istft(mag, ph, cfg)) > 250
    x = rng.standard_normal(960)
    ref = torch.view_as_real(torch.stft(torch.from_numpy(x).float(), 16, 4, 16, window=torch.hann_window(16),
                                        return_complex=True))
    ours = H.SourceSTFT(cfg)(torch.from_numpy(V.pad_source(x, cfg)))[0]
    assert _snr(torch.cat([ref[..., 0], ref[..., 1]]).numpy(), ours.numpy()) > 120


def test_source_phase_is_integrated_in_float64():
    """4 s of a 9-harmonic 180 Hz source: the running phase reaches ~40,700 rad at the 9th harmonic; in
    float32 (upstream) that is 0.004 rad of rounding, here it matches the closed form to 1e-9 cycles."""
    cfg = H.HiFTConfig()
    f0 = np.full(200, 180.0)
    cycles = V.upsampled_cycles(f0, cfg)
    exact = (np.arange(200 * 480) + 0.5 - 240) / 480 * 480 * 9 * 180 / 24000 + 9 * 180 / 24000 * 480
    mid = slice(480, -480)                                      # edges are clamped by the upsampling
    assert np.abs(cycles[mid, 8] - exact[mid]).max() < 1e-9
    assert 2 * np.pi * cycles[:, 8].max() > 4e4


# ----------------------------------------------------------------------------------------- loading

def test_weight_norm_layouts_load_the_same_folded_weights(tmp_path):
    """torch's parametrisation names, the older weight_g / weight_v and a 'generator.' prefix (CosyVoice
    training checkpoints) fold to the same weights, equal to torch's own weight_norm."""
    H.write_hift(tmp_path / "a", seed=5)
    H.write_hift(tmp_path / "b", seed=5, style="gv", prefix="generator.")
    ca, ta = H.load_hift(tmp_path / "a" / "hift.safetensors")
    cb, tb = H.load_hift(tmp_path / "b" / "hift.safetensors")
    assert ca == cb == H.TINY_HIFT and set(ta) == set(tb) and len(ta) == 328 - 82
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    from safetensors.torch import load_file

    raw = load_file(str(tmp_path / "a" / "hift.safetensors"))
    up = torch.nn.utils.parametrizations.weight_norm(torch.nn.ConvTranspose1d(32, 16, 16, 8, padding=4))
    up.parametrizations.weight.original0.data = raw["ups.0.parametrizations.weight.original0"]
    up.parametrizations.weight.original1.data = raw["ups.0.parametrizations.weight.original1"]
    assert torch.allclose(up.weight, ta["ups.0.weight"], atol=1e-6)


def test_hift_pickle_is_refused_with_the_conversion_command(tmp_path, tiny):
    d = Path(shutil.copytree(tiny, tmp_path / "ckpt"))
    st = d / "assets" / "token2wav" / "hift.safetensors"
    st.rename(st.with_name("hift.pt"))
    with pytest.raises(UsageError, match=r"hift.pt is a pickle \(torch.save\); omni-export never unpickles") as e:
        M.load(d, OPTS, tmp_path)
    assert "s.save_file(torch.load('hift.pt', weights_only=True), 'hift.safetensors')" in str(e.value)
    assert "\n" not in str(e.value)
    (d / "assets" / "token2wav" / "hift.pt").unlink()
    assert "hift" not in M.load(d, OPTS, tmp_path).components()            # no vocoder: the rest still builds
    assert M.load(tiny, OPTS, tmp_path).components()[-2:] == ("hift_f0", "hift")


def test_real_shape_hift_table_is_upstreams_parameter_count():
    """HiFTGenerator() (token2wav's defaults): 328 tensors, 20,821,295 parameters."""
    t = H.hift_tensors(H.REAL_HIFT)
    assert len(t) == 328 and sum(int(np.prod(d.shape)) for d in t.values()) == 20_821_295


# ------------------------------------------------------------------------------------- build, synth

@pytest.fixture(scope="module")
def cpu_build(tmp_path_factory, tiny):
    """Every graph at fp16 in ONNX for the cpu target: end-to-end parity on ONNX Runtime, vocoder included
    (16 mel frames: the 8 end-to-end codes fill the window)."""
    out = tmp_path_factory.mktemp("mch_fp16") / "out"
    proc = run_cli("minicpm-o", "--target", "cpu", "--checkpoint", str(tiny), "--out", str(out), "-q",
                   "--precision", "fp16", "--formats", "onnx", "--no-attribution", *GEOM, "--mel-frames", "16",
                   "--flow-steps", "4", "--e2e-codes", "8")
    return proc, out


def test_hift_builds_at_fp16_within_the_gate_and_end_to_end_attributes_the_waveform(cpu_build):
    proc, out = cpu_build
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(out)
    b = builds_by(m)
    for c in ("hift_f0", "hift"):
        build = b[(c, "onnx", "fp16")]
        assert build["status"] == "accepted" and min(o["snr_db"] for o in build["parity"]["outputs"]) >= 40
    assert [o["name"] for o in b[("hift", "onnx", "fp16")]["parity"]["outputs"]] == ["magnitude", "phase"]
    assert {s["name"]: s["shape"] for s in m["components"]["hift"]["inputs"]} == \
        {"mel": [1, 80, 16], "source": [1, 1, 16 * 480 + 16]}
    row = m["end_to_end"][0]
    assert row["runner"] == "ort" and row["verdict"] == "accepted" and row["mel_snr_db"] >= 40
    # hift_f0 runs its fp32 build (Component.fp32_on_cpu) in the fp16 row; that build is the fp32 f0 (so
    # the row reuses "the fp32 mel through the built hift_f0 + hift" as "the built hift alone")
    f0_32 = b[("hift_f0", "onnx", "fp32")]
    assert row["fp32_on_cpu"] == ["hift_f0"] and f0_32["status"] == "accepted"
    assert min(o["snr_db"] for o in f0_32["parity"]["outputs"]) >= 100
    assert row["hift_wav_snr_db"] >= 40 and row["hift_graph_wav_snr_db"] == row["hift_wav_snr_db"]
    # with hift_f0 at fp16 too, its sub-Hz f0 error, integrated into the NSF source's phase, costs the
    # waveform more (the attribution the row reports, on the first utterance; the built mel's own error
    # reaches f0 either way)
    assert row["wav_snr_db_first_utterance"] > row["wav_snr_db_all_at_precision"] + 0.5
    assert 5 < row["wav_snr_db"] < row["hift_graph_wav_snr_db"] and row["wav_spectral_snr_db"] > 5
    assert "waveform" in row["reason"] and "wav SNR dB" in (out / "report.md").read_text()


def test_hift_f0_is_planned_at_fp32_on_the_cpu_beside_the_npu():
    from omni_export.core import Format, Precision
    from omni_export.pipeline import RunOptions, plan
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target, place_build

    r, t = get_recipe("minicpm-o"), get_target("s25-htp")
    p = plan(RunOptions(r, t, Path("unused"), components=("hift_f0", "hift")))
    fp32 = {(b.component, b.format.value) for b in p.builds if b.precision == Precision.FP32}
    assert fp32 == {("hift_f0", "onnx"), ("hift_f0", "pte")} and not p.skipped        # hift stays on the NPU
    assert {b.precision.value for b in p.builds if b.component == "hift_f0"} == {"fp16", "w8a16", "fp32"}
    place = place_build(t, "hift_f0", Precision.FP32, fp32_on_cpu=True)
    assert (place.unit, place.hub_runtimes[Format.ONNX], place.hub_compute_unit) == ("cpu", "onnx", "cpu")
    assert place_build(t, "hift_f0", Precision.FP16, fp32_on_cpu=True).unit == "htp"
    p = plan(RunOptions(r, t, Path("unused"), components=("hift_f0",), formats=(Format.CTX,)))
    assert {b.precision.value for b in p.builds} == {"fp16", "w8a16"}
    assert {(s["format"], s["precision"]) for s in p.skipped} == {("onnx", "fp32"), ("pte", "fp32")}
    assert all("not among --formats" in s["reason"] for s in p.skipped)


def test_place_hift_on_the_gpu_is_judged_by_proxy_and_says_so(tmp_path, tiny):
    """--place hift=gpu on the HTP-only target: HiFT's fp32 graph for the Adreno GPU, which nothing here
    runs, judged on ONNX Runtime CPU at fp32 by proxy, as its verdict says wherever it is shown."""
    out = tmp_path / "out"
    proc = run_cli("minicpm-o", "--target", "s25-htp", "--place", "hift=gpu", "--components", "hift", "--formats", "onnx",
                   "--no-attribution", "-q", *GEOM, "--mel-frames", "16", "--e2e-codes", "0",
                   "--checkpoint", str(tiny), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(out)
    b = builds_by(m)
    assert set(b) == {("hift", "onnx", "fp32")} and m["target"]["placement"] == {"hift": "gpu"}
    build = b[("hift", "onnx", "fp32")]
    assert build["status"] == "accepted" and build["placement"] == {"unit": "gpu", "by": "--place hift=gpu"}
    note = "judged on ORT CPU at fp32 by proxy for the Adreno GPU; re-judged on the device with --hub"
    assert build["parity"]["proxy"] == {"runner": "ORT CPU", "precision": "fp32", "for": "Adreno GPU", "note": note}
    assert build["parity"]["runner"]["short"] == "ort-cpu (gpu proxy)"
    assert f"✅ accepted ({note})" in (out / "report.md").read_text()
    assert f'<span class="proxy">({note})</span>' in (out / "report.html").read_text()


def test_synth_through_the_build_writes_the_wav_of_its_graphs(cpu_build, tmp_path):
    """synth --wav through the fp16 ONNX graphs on ORT: a 24 kHz 16-bit WAV of the build's mel, the waveform
    the eager vocoder makes of that mel up to the fp16 f0's phase drift (same source-noise seed)."""
    _, out = cpu_build
    wav_path = tmp_path / "out.wav"
    proc = run_cli("synth", "minicpm-o", "--build", str(out), "--runner", "ort", "--greedy", "--max-codes", "6",
                   "--mel-out", str(tmp_path / "mel.npy"), "--wav", str(wav_path), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["mel_frames"] == 12 and summary["wav_seconds"] == 0.24
    with wave.open(str(wav_path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()) == (24000, 1, 2, 12 * 480)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2") / 32767.0
    assert pcm.std() > 0.003 and np.abs(pcm).max() <= 0.99 + 1e-4           # sound, clamped like upstream
    m = M.load(Path(read_manifest(out)["checkpoint"]["path"]), {**OPTS, "mel-frames": 16}, tmp_path)
    ref = m.vocode(EagerGraphs(m), np.load(tmp_path / "mel.npy")[None], 0)  # synth's seed 0
    assert ref.shape == pcm.shape and _snr(ref, pcm) > 10


def test_synth_wav_needs_the_vocoder(tmp_path, tiny):
    d = Path(shutil.copytree(tiny, tmp_path / "ckpt"))
    (d / "assets" / "token2wav" / "hift.safetensors").unlink()
    bad = run_cli("synth", "minicpm-o", "--checkpoint", str(d), "--wav", str(tmp_path / "x.wav"))
    assert bad.returncode == 2 and "--wav needs token2wav's HiFT vocoder" in bad.stderr
    assert not (tmp_path / "x.wav").exists()


def test_snake_pow_is_what_the_htp_rewrite_replaces(tiny, tmp_path):
    """The s25-htp targets' pow_mul rewrite turns a Snake's sin(.) ** 2 into a multiply, exactly in fp32: checked
    on one ResBlock (6 Snakes); the hift graph holds 72 (the full build records "ops_replaced": 72)."""
    from omni_export.exporters import rewrites as rw

    m = M.load(tiny, OPTS, tmp_path)
    assert sum(isinstance(x, H.Snake) for x in m.graph("hift").module.modules()) == 72
    block = H.ResBlock(m.hift[1], "resblocks.1", 7, (1, 3, 5)).eval()         # stage 0: 16 channels, k 7
    x = (torch.randn(1, 16, 200, generator=torch.Generator().manual_seed(0)),)
    new, counts = rw.apply(torch.export.export(block, x), ("pow_mul",))
    assert counts == {"pow_mul": 6} and rw.count_op(new, torch.ops.aten.pow.Tensor_Scalar) == 0
    assert _snr(block(*x).detach().numpy(), new.module()(*x).detach().numpy()) > 100


def test_synth_from_the_bundle_alone_writes_the_wav_of_the_build(cpu_build, tmp_path):
    """With HiFT in the build, the bundle carries the vocoder's host data (NSF source layer, iSTFT, placement)
    and `synth --bundle --wav` writes the bytes `synth --build --runner ort --wav` writes (same seed)."""
    from omni_export.artifacts.bundle import schema_error

    _, out = cpu_build
    ship = tmp_path / "ship"
    assert run_cli("bundle", str(out), "--into", str(ship)).returncode == 0
    rt = json.loads((ship / "runtime.json").read_text())
    voc = rt["host"]["token2wav"]["vocoder"]
    assert schema_error(rt) is None and "no wav" not in rt["note"] and "campplus" in rt["note"] and rt["graphs"]["hift_f0"]["precision"] == "fp32"
    assert voc["samples_per_mel_frame"] == 480 and rt["host"]["tables"]["tensors"]["hift_source_weight"]["shape"] == \
        [1, H.TINY_HIFT.nb_harmonics + 1]
    args = ["--max-codes", "6", "--seed", "2", "--json"]
    a = run_cli("synth", "minicpm-o", "--bundle", str(ship), *args, "--wav", str(tmp_path / "a.wav"))
    b = run_cli("synth", "minicpm-o", "--build", str(out), "--runner", "ort", *args, "--wav", str(tmp_path / "b.wav"))
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-2000:], b.stderr[-2000:])
    assert json.loads(a.stdout)["wav_seconds"] == 0.24
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
