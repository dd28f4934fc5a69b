"""Spark-X2.5 recipe on the tiny seeded checkpoint: loading errors, the ring buffer against a plain
sliding-window reference (eager and through an exported ONNX decode graph on ORT CPU), the CLI build
(fp16 onnx + HTP context binaries, manifest, greedy end-to-end agreement) and `synth spark`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import spark_reference as ref
from conftest import builds_by, read_manifest, run_cli
from omni_export.core import UsageError
from omni_export.recipes.spark import checkpoint as ck
from omni_export.recipes.spark import host
from omni_export.recipes.spark import model as sm

FAST = ["--prefill-tokens", "8", "--context-length", "64", "--e2e-tokens", "5"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return ck.write_checkpoint(tmp_path_factory.mktemp("spark") / "tiny")


@pytest.fixture(scope="module")
def model(tiny, tmp_path_factory):
    return sm.load(tiny, {"prefill-tokens": 8, "context-length": 64}, tmp_path_factory.mktemp("scratch"))


@pytest.fixture(scope="module")
def fp16_build(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("spark_build") / "out"
    run_cli("spark", "--target", "s25-htp", "--checkpoint", str(tiny), "--out", str(out), "-p", "fp16",
            "-f", "onnx,ctx", "--no-attribution", "--keep-sources", "-q", *FAST, check=True)
    return out


def _snr(ref_, out):
    ref_, out = np.asarray(ref_, np.float64), np.asarray(out, np.float64)
    return 10 * np.log10((ref_ ** 2).sum() / ((ref_ - out) ** 2).sum())


# ------------------------------------------------------------------------------------- loading

def test_tiny_checkpoint_has_the_real_structure(model):
    c = model.cfg
    assert c.layer_types == ("sliding_attention",) * 3 + ("full_attention",)
    assert (c.num_attention_heads, c.num_key_value_heads) == (8, 2)
    assert c.rotary_dim("full_attention") == c.head_dim // 4 and c.rotary_dim("sliding_attention") == c.head_dim
    assert c.tie_word_embeddings and "lm_head.weight" not in model.tensors
    assert model.tensors["model.layers.0.self_attn.g_proj.weight"].shape == (8, c.hidden_size)


def _copy(tiny, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(tiny, d)
    return d


def test_missing_tensor_is_named(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy(tiny, tmp_path)
    t = load_file(str(d / "model.safetensors"))
    del t["model.layers.2.self_attn.g_proj.weight"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(UsageError, match=r"tensor 'model.layers.2.self_attn.g_proj.weight' is missing"):
        ck.load(d)


def test_misshapen_tensor_is_named(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy(tiny, tmp_path)
    t = load_file(str(d / "model.safetensors"))
    t["model.layers.3.self_attn.q_k_v_proj.weight"] = t["model.layers.3.self_attn.q_k_v_proj.weight"][:-1]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(UsageError, match=r"'model.layers.3.self_attn.q_k_v_proj.weight' has shape \[383, 64\]"):
        ck.load(d)


@pytest.mark.parametrize("edit, message", [
    ({"model_type": "qwen3"}, "model_type is 'qwen3', expected 'spark2_5'"),
    ({"hidden_act": "silu"}, "hidden_act 'silu' is not supported"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types must list"),
    ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads"),
])
def test_bad_config_is_one_clear_error(tiny, tmp_path, edit, message):
    d = _copy(tiny, tmp_path)
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, **edit}))
    with pytest.raises(UsageError, match=message):
        ck.load(d)


def test_pickle_checkpoint_is_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04junk")
    with pytest.raises(UsageError, match="never unpickles"):
        ck.load(tmp_path)


# ------------------------------------------------------------------------------------- ring buffer

def test_host_masks_encode_the_window(model):
    """After W + 5 tokens the ring holds positions 5 .. W+4 and the sliding mask opens exactly the
    W - 1 slots before the query (plus itself); the full mask opens every earlier slot."""
    w = model.cfg.sliding_window
    st = host.KVState(model.cfg, 64)
    fake = {f"new_{t}_{kv}_{j}": np.zeros((1, 2, 1, 32), np.float32)
            for t, n in (("swa", 3), ("full", 1)) for kv in ("key", "value") for j in range(n)}
    for _ in range(w + 5):
        st.write(fake, 1)
    assert sorted(st.ring_pos) == list(range(5, w + 5))
    x = st.inputs(np.zeros((1, model.cfg.hidden_size), np.float32), 1)
    ring_open = x["mask_swa"][0, 0, 0, :w] == 0
    assert ring_open.sum() == w - 1 and st.ring_pos[~ring_open].tolist() == [5]   # position q - W is out
    assert (x["mask_full"][0, 0, 0, :64] == 0).sum() == w + 5


def test_eager_decode_past_the_window_matches_plain_reference(model):
    """The export graphs + host ring buffer, decoding 3 windows past the prompt, against a plain
    whole-sequence forward with position-based sliding masks (fp64, no cache)."""
    from omni_export.runtime.graphs import EagerGraphs

    ids = model.encode("Explain what a sliding-window attention layer does.")[:12]
    gen = model.generate(EagerGraphs(model), ids, 3 * model.cfg.sliding_window, stop=False)
    assert len(ids) + len(gen.tokens) > 3 * model.cfg.sliding_window
    reference = ref.forward(model.cfg, model.tensors, ids + gen.tokens).numpy()
    ours = np.stack(gen.logits)
    assert _snr(reference[len(ids) - 1:-1], ours) > 100
    assert gen.tokens == [int(t) for t in reference[len(ids) - 1:-1].argmax(-1)]


def test_exported_decode_graph_on_ort_matches_plain_reference(model, fp16_build):
    """The ring buffer through the exported fp32 ONNX prefill + decode graphs (the build's sources/,
    what AI Hub compiles) on ONNX Runtime CPU: 40 positions with a 16-slot window (the ring wraps
    twice), against the plain reference."""
    from omni_export.runtime.runners import RunnerSpec, open_runner

    m = read_manifest(fp16_build)
    runners = {}
    for name in ("prefill", "decode"):
        info = m["components"][name]
        path = fp16_build / info["sources"]["fp32"]["path"]
        runners[name] = open_runner(RunnerSpec("ort-cpu", str(path), tuple(s["name"] for s in info["inputs"]),
                                               tuple(s["name"] for s in info["outputs"])))
    ids = model.encode("How many minutes are there in a week?")[:10]
    gen = model.generate(lambda n, x: runners[n].run(x), ids, 30, stop=False)
    for r in runners.values():
        r.close()
    seq = ids + gen.tokens
    assert len(seq) > 2 * model.cfg.sliding_window
    reference = ref.forward(model.cfg, model.tensors, seq).numpy()[len(ids) - 1:-1]
    assert _snr(reference, np.stack(gen.logits)) > 80
    assert gen.tokens == [int(t) for t in reference.argmax(-1)]


def test_context_overflow_is_a_usage_error(model):
    from omni_export.runtime.graphs import EagerGraphs

    with pytest.raises(UsageError, match="larger --context-length"):
        model.generate(EagerGraphs(model), list(range(60)), 10, stop=False)


# ------------------------------------------------------------------------------------- the CLI

def test_cli_builds_accepted_fp16_prefill_and_decode(fp16_build):
    m = read_manifest(fp16_build)
    by = builds_by(m)
    for comp in ("prefill", "decode"):
        for fmt in ("onnx", "ctx"):
            b = by[(comp, fmt, "fp16")]
            assert b["status"] == "accepted", b["parity"]["reason"]
            logits = b["parity"]["outputs"][0]
            assert logits["name"] == "logits" and logits["snr_db"] >= 40 and logits["top1"] >= 0.95
            assert (fp16_build / b["files"][0]["path"]).exists()
    inputs = [s["name"] for s in m["components"]["decode"]["inputs"]]
    assert inputs[:7] == ["inputs_embeds", "cos_full", "sin_full", "cos_swa", "sin_swa", "mask_full", "mask_swa"]
    shapes = {s["name"]: s["shape"] for s in m["components"]["decode"]["inputs"]}
    assert shapes["swa_key_2"] == [1, 2, 16, 32] and shapes["full_value_0"] == [1, 2, 64, 32]
    assert m["checkpoint"]["config"]["sliding_layers"] == [0, 1, 2]
    e2e = {r["runner"]: r for r in m["end_to_end"]}
    assert e2e["htp"]["verdict"] == "accepted" and e2e["htp"]["token_agreement"] >= 0.95


def test_synth_through_the_build_matches_fp32(fp16_build):
    args = ["synth", "spark", "--prompt", "Write a haiku about autumn.", "--max-tokens", "6", "--ignore-eos", "--json"]
    eager = run_cli(*args, "--checkpoint", str(read_manifest(fp16_build)["checkpoint"]["path"]), check=True)
    built = run_cli(*args, "--build", str(fp16_build), "--runner", "ort", check=True)
    a, b = json.loads(eager.stdout), json.loads(built.stdout)
    assert a["generated"] == 6 and a["tokens"] == b["tokens"] and "fp16" in b["graphs"]


def test_synth_usage_errors_are_one_line(tmp_path):
    proc = run_cli("synth", "spark", "--build", str(tmp_path), "--prompt", "x")
    assert proc.returncode == 2 and "no manifest.json" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_real_shape_geometry_is_spark_x2_5_1_7b():
    """--random-weights --size 1.7b: the published shape (28 layers, [s, s, s, f] x 7, window 512,
    8 x 256 query / 2 kv heads, tied 131072-row embedding) adds up to 1.7 B parameters."""
    import math

    c = ck.geometry("1.7b")
    assert c.layer_types[:4] == ("sliding_attention",) * 3 + ("full_attention",)
    assert c.layer_types.count("full_attention") == 7 and c.full_layers == (3, 7, 11, 15, 19, 23, 27)
    assert (c.sliding_window, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (512, 8, 2, 256)
    assert c.rotary_dim("full_attention") == 64
    params = sum(math.prod(d.shape) for d in ck.tensor_table(c).values())
    assert 1.65e9 < params < 1.75e9, params
    with pytest.raises(UsageError, match="--size must be 1.7b"):
        ck.geometry("7b")


def test_w4a16_is_planned_for_the_htp_formats_and_skipped_for_pte_with_a_reason():
    from pathlib import Path

    from omni_export.core import Precision
    from omni_export.pipeline import RunOptions, plan
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    p = plan(RunOptions(get_recipe("spark"), get_target("s25-htp"), Path("unused"), components=("decode",),
                        precisions=(Precision.parse("w4a16"),)))
    assert {b.format.value for b in p.builds} == {"onnx", "dlc", "ctx"}
    assert Precision.W4A16.quantized
    (skip,) = p.skipped
    assert skip["format"] == "pte" and "int4 weights only with int8 dynamic activations" in skip["reason"]


def test_calibrated_w8a16_is_accepted_on_the_htp_and_int4_rejected(tiny, tmp_path):
    """The documented demo geometry (docs/spark.md): calibrated w8a16 prefill and decode pass the 30 dB gate
    on the HTP simulator (before the attention MatMuls' int16 second operand the prefill scored 27.9 dB:
    the QNN EP multiplied 16 x 8 bits), greedy tokens through them agree; w4a16 is rejected."""
    out = tmp_path / "out"
    run_cli("spark", "--target", "s25-htp", "--checkpoint", str(tiny), "--out", str(out), "-p", "w8a16,w4a16",
            "-f", "ctx", "--no-attribution", "-q", "--prefill-tokens", "16", "--context-length", "96",
            "--e2e-tokens", "8", check=False)
    m = read_manifest(out)
    b = {(x["component"], x["precision"]): x for x in m["builds"]}
    for comp in ("prefill", "decode"):
        w8 = b[(comp, "w8a16")]
        assert w8["status"] == "accepted", w8["reason"]
        assert min(o["snr_db"] for o in w8["parity"]["outputs"]) >= 30
        w4 = b[(comp, "w4a16")]
        assert w4["status"] == "rejected" and min(o["snr_db"] for o in w4["parity"]["outputs"]) < 15
        assert w4["details"]["weight_bits"]["4"] > 0.99      # every linear (1x1 Conv) weight int4, per block
        assert m["components"][comp]["top1_min"] == {"w4a16": 0.9}     # the recipe's top-1 gate, recorded
    row = next(r for r in m["end_to_end"] if r["precision"] == "w8a16")
    assert row["runner"] == "htp" and row["verdict"] == "accepted", row["reason"]


def test_default_plan_attempts_w8a8_and_w4a16_for_spark_only():
    """Issue 9: the default command attempts every precision (w8a8 and w4a16 gated like the rest); other
    recipes keep the target's ladder; an explicit --precision is taken as given."""
    from omni_export.core import Precision
    from omni_export.pipeline import RunOptions, plan
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    t = get_target("s25-htp")
    got = {(b.component, b.precision) for b in plan(RunOptions(get_recipe("spark"), t, Path("unused"))).builds}
    assert got == {(c, p) for c in ("prefill", "decode") for p in Precision.requestable() if p != Precision.FP32}
    tts = {b.precision for b in plan(RunOptions(get_recipe("qwen3-tts"), t, Path("unused"))).builds}
    assert tts == {Precision.FP16, Precision.W8A16}
    only = {b.precision for b in plan(RunOptions(get_recipe("spark"), t, Path("unused"),
                                                 precisions=(Precision.W8A16,))).builds}
    assert only == {Precision.W8A16}


def test_default_geometry_w8a16_prefill_is_accepted_with_gptq_weights(tiny, tmp_path):
    """Issue 9 at the default 128 / 1024: with nearest-rounded int8 weights the demo prefill scored 29.4 dB
    (worst output, ORT CPU; 29.3 on the HTP) under the 30 dB gate; GPTQ weights (exporters/gptq.py) give
    34.8. ORT CPU only: the HTP agrees within 0.2 dB (README)."""
    out = tmp_path / "out"
    run_cli("spark", "--target", "s25-htp", "--checkpoint", str(tiny), "--out", str(out), "-p", "w8a16",
            "-f", "onnx", "--components", "prefill", "--no-attribution", "-q", "--e2e-tokens", "0", check=False)
    b = read_manifest(out)["builds"][0]
    assert b["status"] == "accepted", b["reason"]
    assert min(o["snr_db"] for o in b["parity"]["outputs"]) >= 32
    rounding = b["details"]["weight_rounding"]
    assert rounding["method"] == "gptq" and rounding["weights_rounded"] == rounding["weights_seen"] == 25


def test_precision_repair_holds_a_step_to_the_top1_gate_too(tiny, tmp_path):
    """A repair step is judged by the whole gate of its base precision, top-1 included: w4a16 decode with
    two layers raised clears the 15 dB floor but picks fp32's top-1 on fewer than 90 % of rows, so
    the search goes on and no w4a16-mixed build is made (before, the search judged SNR alone and called
    that step accepted while the builds it made were then rejected on top-1). Over w4a16 a step raises
    its blocks to 8-bit weights, not float: every weight stays an integer, 4 or 8 bits."""
    out = tmp_path / "out"
    run_cli("spark", "--target", "s25-htp", "--checkpoint", str(tiny), "--out", str(out), "-p", "w4a16", "-f", "onnx",
            "--components", "decode", "--prefill-tokens", "16", "--context-length", "96", "--e2e-tokens", "0",
            "--repair", "auto", "--repair-steps", "2", "-q", check=False)
    m = read_manifest(out)
    assert "repair" in m["components"]["decode"], m["components"]["decode"]
    search = m["components"]["decode"]["repair"]["w4a16"]
    steps = search["steps"]
    assert search["raise"] == "int8"
    assert [s["weights_8bit"] for s in steps] == [["layers.0"], ["layers.0", "layers.1"]]
    assert all(s["kept_float"] == [] and s["integer_share"] == 1.0 and set(s["weight_bits"]) == {"4", "8"}
               for s in steps), steps
    assert 1.0 > steps[0]["base_share"] > steps[1]["base_share"] > 0
    cleared = [s for s in steps if s["snr_db"] >= 15]
    assert cleared, steps                     # the case this test is about: the SNR floor alone would pass
    for s in cleared:
        assert s["verdict"] == "rejected" and "top-1" in s["reason"], s
    assert search["result"] is None and "--repair-steps" in search["stopped"]
    assert {b["precision"] for b in m["builds"]} == {"w4a16"}


def test_an_end_to_end_row_runs_on_precision_repairs_build_when_the_plain_one_was_rejected():
    """Spark's rows take `<precision>-mixed` where the plain build was rejected, as Qwen3-TTS's do (the
    demo's w8a8 row was 'skipped: no accepted prefill, decode build' beside accepted w8a8-mixed ones). Every
    recipe's rows ask runtime.graphs.accepted."""
    from omni_export.runtime.graphs import accepted as _accepted

    def b(comp, prec, status):
        return {"component": comp, "format": "ctx", "precision": prec, "status": status,
                "files": [{"path": f"{comp}-{prec}.ctx.onnx", "bytes": 1}]}

    m = {"components": {"prefill": {}, "decode": {}},
         "builds": [b(c, "w8a8", "rejected") for c in ("prefill", "decode")] + [b("prefill", "w8a8-mixed", "accepted")]}
    assert not _accepted(m, "decode", "htp", "w8a8")
    assert _accepted(m, "prefill", "htp", "w8a8")
    m["builds"].append(b("decode", "w8a8-mixed", "rejected"))
    assert not _accepted(m, "decode", "htp", "w8a8")
    m["builds"][-1]["status"] = "accepted"
    assert _accepted(m, "decode", "htp", "w8a8") and not _accepted(m, "decode", "htp", "w4a16")


# ------------------------------------------------------------------------------------- the bundle

def test_synth_from_the_bundle_alone_gives_the_tokens_of_the_build_on_the_htp(fp16_build, tiny, tmp_path):
    """The build's bundle (context binaries) carries the host loop's data under the published schema,
    and `synth spark --bundle` with neither the build nor the checkpoint left gives the tokens `synth
    --build --runner htp` gives: a prompt over several prefill blocks, decoding past the 16-slot ring."""
    from omni_export.artifacts.bundle import schema_error

    out, ckpt, ship = tmp_path / "out", tmp_path / "ckpt", tmp_path / "elsewhere" / "ship"
    shutil.copytree(fp16_build, out)
    shutil.copytree(tiny, ckpt)
    m = json.loads((out / "manifest.json").read_text())
    m["checkpoint"]["path"] = str(ckpt)
    (out / "manifest.json").write_text(json.dumps(m))
    assert run_cli("bundle", str(out), "--into", str(ship)).returncode == 0
    rt = json.loads((ship / "runtime.json").read_text())
    assert schema_error(rt) is None and {c: g["format"] for c, g in rt["graphs"].items()} == \
        {"prefill": "ctx", "decode": "ctx"}
    h = rt["host"]
    cfg = ck.geometry("tiny")
    assert h["kv_cache"]["sliding"]["shape"] == [1, 2, 16, 32] and h["kv_cache"]["full"]["shape"] == [1, 2, 64, 32]
    assert h["kv_cache"]["sliding_layers"] == [0, 1, 2] and h["kv_cache"]["full_layers"] == [3]
    assert h["special_ids"] == {"eos": [cfg.eos_token_id], "pad": cfg.pad_token_id, "bos": None}
    assert h["tables"]["tensors"]["embedding"]["shape"] == [320, 64] and h["options"] == \
        {"prefill-tokens": 8, "context-length": 64}
    assert schema_error({**rt, "host": {**h, "kv_layout": "?"}})      # strict: an unknown host key is refused
    args = ["--prompt", "Write a haiku about autumn.", "--max-tokens", "12", "--ignore-eos", "--json"]
    built = run_cli("synth", "spark", "--build", str(out), "--runner", "htp", *args)
    shutil.rmtree(out)
    shutil.rmtree(ckpt)
    alone = run_cli("synth", "spark", "--bundle", str(ship), *args)
    assert built.returncode == 0 and alone.returncode == 0, (built.stderr[-2000:], alone.stderr[-2000:])
    a, b = json.loads(alone.stdout), json.loads(built.stdout)
    assert a["prompt_tokens"] > 16 and a["generated"] == 12 and a["graphs"] == f"{ship} on bundle (fp16)"
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]
    wrong = run_cli("synth", "spark", "--bundle", str(ship), "--build", str(out), "--prompt", "x")
    assert wrong.returncode == 2 and wrong.stderr.strip().endswith("--bundle runs from the bundle alone; drop --build")
