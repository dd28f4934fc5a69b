"""MiniCPM-o 4.5 TTS head: loading the official layout, the graphs against transformers' LlamaModel
(the backbone MiniCPMTTS instantiates), the CLI build, synth, and the gate on a broken int8 code head."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import GOLDEN, builds_by, read_manifest, run_cli
from omni_export.core import UsageError
from omni_export.recipes.minicpm_o import checkpoint as ck
from omni_export.recipes.minicpm_o import host
from omni_export.recipes.minicpm_o import model as M
from omni_export.weights import write_safetensors

# Tiny geometry: the longest synthetic utterance (37 tokens + text_eos + audio_bos) and 24 codes fit.
GEOM = ["--context-length", "64", "--prefill-tokens", "16", "--mel-frames", "32", "--flow-tokens", "32"]
FAST = [*GEOM, "--flow-steps", "4", "--e2e-codes", "8"]      # end-to-end on the HTP simulator costs seconds per call
OPTS = {"context-length": 64, "prefill-tokens": 16, "mel-frames": 64, "flow-tokens": 32}
GOLDEN_MC = GOLDEN / "minicpm_o"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return ck.write_checkpoint(tmp_path_factory.mktemp("mc") / "tiny", seed=0)


def _config(d: Path) -> dict:
    return json.loads((d / "config.json").read_text())


def _edit_config(d: Path, **tts) -> None:
    c = _config(d)
    c["tts_config"].update(tts)
    (d / "config.json").write_text(json.dumps(c))


# ----------------------------------------------------------------------------------------- loading

def _copy(tiny: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny, tmp_path / "ckpt"))


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "config.json").write_text(json.dumps({**_config(d), "model_type": "qwen3_tts"})),
     "model_type is 'qwen3_tts', expected 'minicpmo'"),
    (lambda d: (d / "config.json").write_text(json.dumps({k: v for k, v in _config(d).items() if k != "tts_config"})),
     "no tts_config object"),
    (lambda d: _edit_config(d, num_vq=4), "num_vq = 4; MiniCPM-o 4.5 has one codebook"),
    (lambda d: _edit_config(d, hidden_size="64"), "tts_config.hidden_size must be an integer"),
    (lambda d: _edit_config(d, projector_type="minicpm"), "projector_type 'minicpm' unsupported"),
    (lambda d: ((d / "model.safetensors").rename(d / "pytorch_model.bin")), "is a pickle checkpoint; omni-export never unpickles"),
    (lambda d: _drop(d, "tts.model.layers.1.mlp.up_proj.weight"), "tensor 'tts.model.layers.1.mlp.up_proj.weight' is missing"),
    (lambda d: _edit_config(d, num_audio_tokens=6000), "tensor 'tts.emb_code.0.weight' has shape [6562, 64], expected [6000, 64]"),
])
def test_loading_errors_name_the_cause(tmp_path, tiny, breakage, message):
    d = _copy(tiny, tmp_path)
    breakage(d)
    with pytest.raises(UsageError, match=None) as e:
        M.load(d, OPTS, tmp_path)
    assert message in str(e.value) and "\n" not in str(e.value)


def _drop(d: Path, name: str) -> None:
    from safetensors.numpy import load_file

    t = load_file(d / "model.safetensors")
    del t[name]
    write_safetensors(d / "model.safetensors", t)


def test_sharded_layout_loads_the_same_weights_and_refuses_a_pickled_shard(tmp_path, tiny):
    single = M.load(tiny, OPTS, tmp_path)
    sharded = ck.write_checkpoint(tmp_path / "sharded", seed=0, shards=3)
    assert not (sharded / "model.safetensors").exists() and (sharded / ck.INDEX).exists()
    two = M.load(sharded, OPTS, tmp_path)
    assert set(single.tensors) == set(two.tensors)
    assert all(torch.equal(single.tensors[k], two.tensors[k]) for k in single.tensors)
    idx = json.loads((sharded / ck.INDEX).read_text())
    idx["weight_map"]["tts.model.norm.weight"] = "pytorch_model-00001-of-00002.bin"
    (sharded / ck.INDEX).write_text(json.dumps(idx))
    with pytest.raises(UsageError, match="not safetensors; omni-export never unpickles"):
        M.load(sharded, OPTS, tmp_path)


def test_bad_calibration_hidden_states_fail_at_load(tmp_path, tiny):
    d = tmp_path / "cal"
    d.mkdir()
    np.save(d / "a.npy", np.zeros((5, 7), np.float32))
    with pytest.raises(UsageError, match=r"expected LLM hidden states \[tokens, 96\], got \[5, 7\]"):
        M.load(tiny, {**OPTS, "calibration-hidden": str(d)}, tmp_path)
    np.save(d / "a.npy", np.zeros((5, 96), np.float32))
    with pytest.raises(UsageError, match="has no a.ids.npy beside it"):
        M.load(tiny, {**OPTS, "calibration-hidden": str(d)}, tmp_path)


def test_calibration_from_the_users_hidden_states(tmp_path, tiny):
    d = tmp_path / "cal"
    d.mkdir()
    rng = np.random.default_rng(3)
    for name, n in (("a", 9), ("b", 14)):
        np.save(d / f"{name}.npy", rng.standard_normal((n, 96)).astype(np.float32))
        np.save(d / f"{name}.ids.npy", rng.integers(0, 151643, n))
    m = M.load(tiny, {**OPTS, "calibration-hidden": str(d)}, tmp_path)
    cal = m.samples("tts_condition", "calibration")
    assert "the user's LLM hidden states" in cal.source and len(cal.inputs) == 2
    assert np.array_equal(cal.inputs[0]["llm_hidden"][0, :9], np.load(d / "a.npy"))
    assert "synthetic" in m.samples("tts_condition", "heldout").source


# --------------------------------------------------------------------------------- graph fidelity

def test_code_head_fold_equals_torch_weight_norm_and_normalize_survives_fp16(tiny, tmp_path):
    from safetensors.torch import load_file

    from omni_export.recipes.minicpm_o.modules import safe_l2_normalize

    m = M.load(tiny, OPTS, tmp_path)
    raw = load_file(str(tiny / "model.safetensors"))
    lin = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(64, 6562, bias=False))
    lin.parametrizations.weight.original0.data = raw["tts.head_code.0.parametrizations.weight.original0"]
    lin.parametrizations.weight.original1.data = raw["tts.head_code.0.parametrizations.weight.original1"]
    assert torch.allclose(lin.weight, m.tensors["tts.head_code.0.weight"], atol=1e-6)
    x = torch.randn(4, 768) * 40           # a projector output whose squares overflow fp16
    ref = torch.nn.functional.normalize(x, dim=-1)
    xh = x.half()                          # op by op in fp16, as an fp16 graph runs it: the sum of squares overflows
    assert torch.isinf((xh * xh).sum(-1)).all()
    assert (xh / torch.sqrt((xh * xh).sum(-1, keepdim=True))).abs().max() == 0     # the naive form collapses to 0
    assert torch.allclose(safe_l2_normalize(x.half()).float(), ref, atol=2e-3)


def test_tts_head_matches_the_upstream_classes_golden(tiny, tmp_path):
    """Goldens (tools/golden/make_minicpm_o_goldens.py, own venv): transformers' LlamaModel, torch's
    weight_norm Linear and the hidden_text_merge condition, run as MiniCPMTTS.generate runs them, greedy,
    on this tiny checkpoint (seed 0). Our tts_condition + host rows, and our graphs + host loop, match."""
    from omni_export.runtime.graphs import EagerGraphs

    m = M.load(tiny, OPTS, tmp_path)
    g = {k: np.load(GOLDEN_MC / f"tts_{k}.npy") for k in ("hidden", "ids", "condition", "codes", "logits")}
    utt = M.Utterance(g["hidden"], g["ids"], "golden")
    eager = EagerGraphs(m)
    cond = m.condition(eager, utt)
    assert _snr(g["condition"], cond) > 100
    cos, sin = m.rope                      # step 0: the last condition row's logits out of chunked prefill
    logits = [host.prefill(eager, cond, host.Cache(m.cfg, 64), cos, sin, 16)]
    graphs = lambda name, x: _keep(logits, name, eager(name, x))    # noqa: E731
    n = len(g["codes"])
    gen = m.synthesize(graphs, utt, m.gen_options(greedy=True, max_codes=n, min_new_tokens=n))
    assert gen.codes.tolist() == g["codes"].tolist()
    assert _snr(g["logits"], np.stack(logits[:len(g["logits"])])) > 100      # fp32 vs fp32: rounding only


def _keep(seen: list, name: str, out: dict) -> dict:
    if name == "tts_decode":
        seen.append(out["logits"][0, 0].copy())
    return out


def test_dit_step_and_the_host_solver_match_upstreams_dit_golden(tiny, tmp_path):
    """Goldens (tools/golden/make_minicpm_o_dit_goldens.py): Step-Audio2's own DiT class on the tiny flow,
    CFG pair in the batch, 10 Euler steps as CausalConditionalCFM.solve_euler; padded tail masked."""
    from omni_export.recipes.minicpm_o import token2wav as t2w
    from omni_export.runtime.graphs import EagerGraphs

    m = M.load(tiny, OPTS, tmp_path)
    g = {k: np.load(GOLDEN_MC / f"dit_{k}.npy") for k in ("noise", "mu", "cond", "spks", "mask", "velocity0", "mel")}
    eager = EagerGraphs(m)
    v0 = eager("dit_step", {"x": g["noise"], "mu": g["mu"], "spks": g["spks"], "cond": g["cond"], "mask": g["mask"],
                            "t_freq": t2w.time_features(0.0)})["velocity"]
    assert _snr(g["velocity0"], v0) > 100
    mel = m.flow(eager, {k: g[k] for k in ("noise", "mu", "cond", "spks", "mask")})
    assert _snr(g["mel"], mel) > 100


def test_flow_encoder_window_matches_upstreams_encoder_golden(tiny, tmp_path):
    """Goldens (tools/golden/make_minicpm_o_flow_goldens.py): Step-Audio2's UpsampleConformerEncoderV2 with
    the flow's input_embedding and encoder_proj on one unpadded 20-token utterance; ours encodes it in a
    32-token window (12 padded) and in a window of exactly 20."""
    from omni_export.runtime.graphs import EagerGraphs

    ref, tokens = np.load(GOLDEN_MC / "flow_mu.npy"), np.load(GOLDEN_MC / "flow_tokens.npy")
    for n in (32, 20):
        m = M.load(tiny, {**OPTS, "flow-tokens": n}, tmp_path)
        assert _snr(ref, m.encode(EagerGraphs(m), tokens)) > 100


def test_token2wav_pickle_is_refused_and_a_missing_flow_drops_dit_step(tmp_path, tiny):
    d = _copy(tiny, tmp_path)
    flow = d / "assets" / "token2wav" / "flow.safetensors"
    flow.rename(flow.with_name("flow.pt"))
    with pytest.raises(UsageError, match=r"flow.pt is a pickle \(torch.save\); omni-export never unpickles"):
        M.load(d, OPTS, tmp_path)
    (d / "assets" / "token2wav" / "flow.pt").unlink()
    assert M.load(d, OPTS, tmp_path).components() == ("tts_condition", "tts_prefill", "tts_decode")
    assert "flow_encoder_chunk" in M.load(tiny, OPTS, tmp_path).components()
    with pytest.raises(UsageError, match="no flow.safetensors"):
        M.load(d, {**OPTS, "token2wav": str(d / "assets" / "token2wav")}, tmp_path)


def _snr(ref: np.ndarray, out: np.ndarray) -> float:
    err = np.sum((ref - out).astype(np.float64) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / err))


# ------------------------------------------------------------------------------------ CLI builds

COMPONENTS = ("tts_condition", "tts_prefill", "tts_decode", "flow_encoder_chunk", "dit_step")
VOCODER = ("hift_f0", "hift")     # built here by the slow acceptance test; test_minicpm_o_hift.py builds them fast


@pytest.fixture(scope="module")
def fp16_build(tmp_path_factory, tiny):
    """fp16 in ONNX (for synth on ORT) and context binaries (HTP simulator, end-to-end parity). The HiFT
    graphs are left out: the HTP simulator takes ~20 s per hift call at this geometry (its fp16 sin)."""
    out = tmp_path_factory.mktemp("mc_fp16") / "out"
    proc = run_cli("minicpm-o", "--target", "s25-htp", "--checkpoint", str(tiny), "--out", str(out),
                   "--precision", "fp16", "--formats", "onnx,ctx", "--no-attribution", "-q",
                   "--components", ",".join(COMPONENTS), *FAST)
    return proc, out


def test_cli_builds_every_graph_at_fp16_within_the_gate_on_the_htp_simulator(fp16_build):
    proc, out = fp16_build
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(out)
    b = builds_by(m)
    assert set(b) == {(c, f, "fp16") for c in COMPONENTS for f in ("onnx", "ctx")}
    for c in COMPONENTS:
        assert b[(c, "ctx", "fp16")]["parity"]["runner"]["kind"] == "qnn-htp"
        for f in ("onnx", "ctx"):
            build = b[(c, f, "fp16")]
            assert build["status"] == "accepted" and min(o["snr_db"] for o in build["parity"]["outputs"]) >= 40
    e2e = {r["runner"]: r for r in m["end_to_end"]}
    assert e2e["htp"]["verdict"] == "accepted" and e2e["htp"]["code_agreement"] >= 0.99
    assert e2e["htp"]["mel_snr_db"] >= 40
    assert "dit_step" in (out / "report.md").read_text()


@pytest.mark.slow
def test_the_acceptance_command_builds_every_graph_in_every_format_at_fp16_and_w8a16(tmp_path, tiny):
    out = tmp_path / "out"
    proc = run_cli("minicpm-o", "--target", "s25-htp", "--checkpoint", str(tiny), "--out", str(out), "-q",
                   "--no-attribution", "--e2e-codes", "0", *GEOM)
    b = builds_by(read_manifest(out))
    assert set(b) == {(c, f, p) for c in COMPONENTS + VOCODER for f in ("onnx", "dlc", "ctx", "pte")
                      for p in ("fp16", "w8a16")} | {("hift_f0", f, "fp32") for f in ("onnx", "pte")}   # fp32 on the CPU
    for (c, f, p), build in b.items():
        assert build["files"] and build["parity"]["outputs"], (c, f, p, build.get("error"))
        if p == "fp16":
            assert build["status"] == "accepted", (c, f, build["parity"]["reason"])
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_synth_through_the_built_graphs_gives_the_eager_codes(fp16_build, tmp_path):
    _, out = fp16_build
    eager = run_cli("synth", "minicpm-o", "--checkpoint", str(read_manifest(out)["checkpoint"]["path"]), "--greedy",
                    "--max-codes", "20", "--codes-out", str(tmp_path / "e.npy"), "--json")
    built = run_cli("synth", "minicpm-o", "--build", str(out), "--runner", "ort", "--greedy", "--max-codes", "20",
                    "--codes-out", str(tmp_path / "b.npy"), "--mel-out", str(tmp_path / "mel.npy"), "--json")
    assert eager.returncode == 0 and built.returncode == 0, (eager.stderr[-2000:], built.stderr[-2000:])
    summary = json.loads(built.stdout)
    assert summary["codes"] == 20 and summary["mel_frames"] == 32      # one DiT window: --mel-frames 32
    mel = np.load(tmp_path / "mel.npy")
    assert mel.shape == (80, 32) and np.isfinite(mel).all() and mel.std() > 0
    assert np.array_equal(np.load(tmp_path / "e.npy"), np.load(tmp_path / "b.npy"))
    bad = run_cli("synth", "minicpm-o", "--text-ids", "1,2,3")
    assert bad.returncode == 2 and "--text-ids needs --hidden-states" in bad.stderr


# ------------------------------------------------------------------------ the gate on int8 breakage

def plant_outlier_in_code_head(src: Path, dst: Path, channel: int = 5, gain: float = 400.0) -> Path:
    """Copy the checkpoint and give the code head an outlier input channel: the final norm's weight for
    `channel` is divided by `gain` and the head's column for it multiplied by `gain` (re-expressed as
    weight_norm g and v). fp32's function is unchanged up to rounding and fp16 holds it, but each
    head row's int8 scale is now set by the outlier, so its other weights round to zero."""
    from safetensors.numpy import load_file

    shutil.copytree(src, dst)
    t = load_file(dst / "model.safetensors")
    g, v = t["tts.head_code.0.parametrizations.weight.original0"], t["tts.head_code.0.parametrizations.weight.original1"]
    w = g * v / np.linalg.norm(v, axis=1, keepdims=True)
    w[:, channel] *= gain
    t["tts.head_code.0.parametrizations.weight.original1"] = w.astype(np.float32)
    t["tts.head_code.0.parametrizations.weight.original0"] = np.linalg.norm(w, axis=1, keepdims=True).astype(np.float32)
    t["tts.model.norm.weight"][channel] /= gain
    write_safetensors(dst / "model.safetensors", t)
    return dst


def _int8_run(tmp: Path, ckpt: Path):
    out = tmp / "out"
    proc = run_cli("minicpm-o", "--target", "s25-htp", "--checkpoint", str(ckpt), "--out", str(out),
                   "--components", "tts_decode", "--precision", "fp16,w8a16", "--formats", "onnx,ctx,pte",
                   "--gate", "w8a16=20", "--e2e-codes", "0", *GEOM)
    return proc, {(b["format"], b["precision"]): b for b in read_manifest(out)["builds"]}, read_manifest(out)


@pytest.mark.slow
def test_int8_code_head_with_an_outlier_channel_is_rejected_by_the_gate(tmp_path, tiny):
    clean_proc, clean, _ = _int8_run(tmp_path / "clean", tiny)
    assert clean_proc.returncode == 0, clean_proc.stderr[-3000:]
    for fmt in ("onnx", "ctx", "pte"):                            # control: the same gate passes a clean head
        assert clean[(fmt, "w8a16")]["status"] == "accepted"
    broken = plant_outlier_in_code_head(tiny, tmp_path / "outlier")
    proc, v, m = _int8_run(tmp_path / "broken", broken)
    assert proc.returncode == 0                                   # fp16 still gives an accepted build
    for fmt in ("onnx", "ctx", "pte"):
        assert v[(fmt, "fp16")]["status"] == "accepted"
        bad = v[(fmt, "w8a16")]
        assert bad["status"] == "rejected" and bad["files"][0]["path"].startswith("rejected/")
        logits = lambda b: next(o for o in b["parity"]["outputs"] if o["name"] == "logits")   # noqa: E731
        assert logits(bad)["snr_db"] < logits(clean[(fmt, "w8a16")])["snr_db"] - 10
    blocks = {r["block"]: r for r in m["components"]["tts_decode"]["attribution"]["w8a16"]}
    others = min(r["snr_db"] for name, r in blocks.items() if name != "code_head")
    assert blocks["code_head"]["snr_db"] < others - 20          # attribution names the head, not the layers


def test_a_repair_that_passes_only_with_every_weight_in_float_is_no_repair(tmp_path):
    """The demo's tts_condition at w8a16 on the HTP simulator passes only once both of its linears are back in
    float: 0 % of its weight bytes still quantized, the fp16 build again. That is reported as no quantized
    variant passing; no w8a16-mixed build is made (it was 'w8a16-mixed accepted, 0.0 % quantized')."""
    out = tmp_path / "out"
    run_cli("minicpm-o", "--target", "s25-htp", "--components", "tts_condition", "-p", "w8a16", "-f", "ctx",
            "--repair", "auto", "--e2e-codes", "0", "--out", str(out), "-q")
    m = read_manifest(out)
    search = m["components"]["tts_condition"]["repair"]["w8a16"]
    last = search["steps"][-1]
    assert last["verdict"] == "accepted" and last["integer_share"] == 0 and last["note"] == "passes with no weight quantized"
    assert all(s["verdict"] == "rejected" for s in search["steps"][:-1])
    assert search["result"] is None and "not a quantized build" in search["stopped"]
    assert {b["precision"] for b in m["builds"]} == {"w8a16"}
    assert "repair found no passing variant: step 2 passes only with every weight back in float" in \
        (out / "report.md").read_text()


# ------------------------------------------------------------------------------------- the bundle

def test_synth_from_the_bundle_alone_gives_the_codes_and_mel_of_the_build_on_the_htp(fp16_build, tiny, tmp_path):
    """The build's bundle (context binaries) carries the voice path's host data under the published
    schema, and `synth minicpm-o --bundle` with neither the build nor the checkpoint left samples the
    codes (seeded) and solves the mel `synth --build --runner htp` does, byte for byte."""
    from omni_export.artifacts.bundle import schema_error

    _, built_out = fp16_build
    out, ckpt, ship = tmp_path / "out", tmp_path / "ckpt", tmp_path / "elsewhere" / "ship"
    shutil.copytree(built_out, out)
    shutil.copytree(tiny, ckpt)
    m = json.loads((out / "manifest.json").read_text())
    m["checkpoint"]["path"] = str(ckpt)
    m["checkpoint"]["config"]["token2wav"] = str(ckpt / "assets" / "token2wav" / "flow.safetensors")
    (out / "manifest.json").write_text(json.dumps(m))
    assert run_cli("bundle", str(out), "--into", str(ship)).returncode == 0
    rt = json.loads((ship / "runtime.json").read_text())
    assert schema_error(rt) is None and set(rt["graphs"]) == set(COMPONENTS)
    h, cfg = rt["host"], ck.read_config(tiny)
    assert h["special_ids"] == {"text_eos": cfg.text_eos_token_id, "audio_bos": cfg.audio_bos_token_id,
                                "eos_code": cfg.num_audio_tokens - 1}
    assert h["tables"]["tensors"]["text_embedding"]["shape"] == [cfg.num_text_tokens, cfg.hidden_size]
    assert h["token2wav"]["dit"]["steps"] == 4 and len(h["token2wav"]["dit"]["t_span"]) == 5
    assert h["token2wav"]["vocoder"] is None and "no wav" in rt["note"]       # the fixture leaves HiFT out
    assert schema_error({**rt, "host": {**h, "sampling": {**h["sampling"], "seed": 1}}})   # strict
    args = ["--max-codes", "10", "--seed", "3", "--json"]
    built = run_cli("synth", "minicpm-o", "--build", str(out), "--runner", "htp", *args,
                    "--codes-out", str(tmp_path / "b.npy"), "--mel-out", str(tmp_path / "b_mel.npy"))
    shutil.rmtree(out)
    shutil.rmtree(ckpt)
    alone = run_cli("synth", "minicpm-o", "--bundle", str(ship), *args,
                    "--codes-out", str(tmp_path / "a.npy"), "--mel-out", str(tmp_path / "a_mel.npy"))
    assert built.returncode == 0 and alone.returncode == 0, (built.stderr[-2000:], alone.stderr[-2000:])
    assert json.loads(alone.stdout)["graphs"] == f"{ship} on bundle (fp16)"
    assert json.loads(alone.stdout)["codes"] == 10
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    assert np.load(tmp_path / "a_mel.npy").tobytes() == np.load(tmp_path / "b_mel.npy").tobytes()
