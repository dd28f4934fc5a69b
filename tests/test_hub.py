"""Qualcomm AI Hub against the fake service (tests/fake_hub.py behind the real qai-hub client).

One tiny heterogeneous build on `s25` (ONNX only: text_projection on the NPU at fp16 and w8a16,
Code2Wav on the GPU at fp32 and fp16) is made once; every test works on a copy. Submissions run
in-process through the CLI (click's runner) except where a real process matters: the kill, and
the token checks on a process's own stdout/stderr.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import fake_hub
from conftest import ROOT, builds_by, read_manifest

SCHEMAS = ROOT / "omni_export" / "schemas"
TOKEN = "sentinel-TOKEN-7f3a9c1e5b"
NPU, NPU8, GPU, GPU16 = ("text_projection/onnx/fp16", "text_projection/onnx/w8a16", "code2wav/onnx/fp32",
                         "code2wav/onnx/fp16")


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def s25_build(tmp_path_factory, tiny_checkpoint) -> Path:
    """Built in this process through pipeline.run (the code the CLI runs), without end-to-end
    parity or HTP rewrites, which these tests do not look at and which would triple the time."""
    from omni_export.core import Format, Precision
    from omni_export.pipeline import RunOptions, run
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    out = tmp_path_factory.mktemp("s25") / "out"
    result = run(RunOptions(get_recipe("qwen3-tts"), get_target("s25"), out, checkpoint=tiny_checkpoint,
                            components=("text_projection", "code2wav"), formats=(Format.ONNX,),
                            precisions=(Precision.FP32, Precision.FP16, Precision.W8A16),
                            recipe_options={"left-context": 2, "chunk-frames": 2},
                            attribution="off", rewrites=(), jobs=1, e2e=(), keep_sources=True))
    assert result.exit_code == 0
    return out


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The fake service's state, a client.ini with a sentinel token, and the env that selects them."""
    state = tmp_path / "fake-hub"
    fake_hub.write_scenario(state, tokens=[TOKEN])
    ini = tmp_path / "client.ini"
    ini.write_text(f"[api]\napi_token = {TOKEN}\napi_url = {fake_hub.WEB}\nweb_url = {fake_hub.WEB}\nverbose = False\n")
    env = {"QAIHUB_CLIENT_INI": str(ini), fake_hub.STATE_ENV: str(state), "OMNI_EXPORT_FAKE_HUB": "fake_hub"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {"state": state, "ini": ini, "env": env}


@pytest.fixture
def out(tmp_path, s25_build) -> Path:
    dest = tmp_path / "out"
    shutil.copytree(s25_build, dest)
    return dest


def cli(*args: str):
    """omni-export in this process (the fake service is patched into this process's qai_hub)."""
    from click.testing import CliRunner

    from omni_export.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def cli_process(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omni_export.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **env})


def scenario(hub, **kw) -> None:
    fake_hub.write_scenario(hub["state"], tokens=[TOKEN], **kw)


def created(hub) -> dict[str, int]:
    return {k: len(fake_hub.calls(hub["state"], f"create_{k}_job")) for k in ("compile", "quantize", "inference")}


FAKE_NOTICE = "omni-export: using the FAKE Qualcomm AI Hub from tests/fake_hub.py (OMNI_EXPORT_FAKE_HUB)"


def errors(stderr: str) -> list[str]:
    """stderr without the notice every process using the fake service prints first."""
    lines = stderr.strip().splitlines()
    assert lines[0] == FAKE_NOTICE
    return lines[1:]


def onnx_nodes(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


# ----------------------------------------------------------------------------------------- placement

def test_s25_places_the_lm_on_the_npu_and_code2wav_on_the_gpu():
    from omni_export.core import Format
    from omni_export.pipeline import RunOptions, plan
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    recipe = get_recipe("qwen3-tts")
    opts = RunOptions(recipe, get_target("s25"), Path("unused"))
    p, s25 = plan(opts), opts.target             # placed by the recipe's roles: code2wav is a vocoder
    got = {(b.component, b.format.value, b.precision.value) for b in p.builds}
    for c in ("talker_decode", "predictor_frame", "text_projection"):
        assert {(c, f, "fp16") for f in ("onnx", "dlc", "ctx")} <= got
        assert s25.place(c).hub_compute_unit == "npu" and s25.place(c).by == "s25's default unit"
    assert {b for b in got if b[0] == "code2wav"} == {("code2wav", "onnx", "fp32")}
    assert s25.place("code2wav").hub_compute_unit == "gpu" and s25.place("code2wav").hub_runtimes
    assert s25.place("code2wav").by == "role vocoder (s25 places vocoders on the Adreno GPU)"
    assert s25.place("code2wav_n2").unit == "gpu"          # a shape variant runs where its graph runs
    skipped = {(s["component"], s["format"]): s["reason"] for s in p.skipped}
    assert skipped == {}                          # the defaults ask each unit only for what it takes
    # fp32 asked of every component: the NPU-placed ones say why they cannot.
    p32 = plan(RunOptions(recipe, s25, Path("unused"), components=("talker_decode", "code2wav"),
                          precisions=(get_precision("fp32"),), formats=(Format.ONNX, Format.DLC)))
    assert {(b.component, b.format.value) for b in p32.builds} == {("code2wav", "onnx")}
    reasons = {(s["component"], s["format"]): s["reason"] for s in p32.skipped}
    assert reasons[("talker_decode", "onnx")] == ("talker_decode runs on the Hexagon NPU (HTP) on s25, "
                                                  "which runs fp16, w8a16, w8a8, w4a16")
    assert "code2wav runs on the Adreno GPU on s25, which takes onnx" == reasons[("code2wav", "dlc")]
    s24 = RunOptions(recipe, get_target("s24"), Path("unused")).target
    assert s24.place("code2wav").unit == "gpu" and s24.soc_model == "57"


def get_precision(text):
    from omni_export.core import Precision

    return Precision(text)


def test_the_gpu_placed_build_is_scored_on_a_labelled_cpu_proxy(s25_build):
    m = read_manifest(s25_build)
    b = builds_by(m)
    gpu = b[("code2wav", "onnx", "fp32")]["parity"]["runner"]
    assert gpu["label"] == "ONNX Runtime CPU as a proxy for the Adreno GPU (same precision)"
    assert gpu["short"] == "ort-cpu (gpu proxy)"
    assert m["target"]["placement"] == {"code2wav": "gpu", "text_projection": "htp"}
    assert all(x["status"] == "accepted" for x in b.values()) and len(b) == 4
    assert {(s["component"], s["precision"]): s["reason"] for s in m["skipped"]} == {
        ("text_projection", "fp32"): "text_projection runs on the Hexagon NPU (HTP) on s25, which runs fp16, w8a16, w8a8, w4a16",
        ("code2wav", "w8a16"): "code2wav runs on the Adreno GPU on s25, which runs fp32, fp16"}
    assert set(m["components"]["code2wav"]["sources"]) == {"fp32"}
    assert set(m["components"]["text_projection"]["sources"]) == {"fp32", "w8a16"}
    assert m["components"]["text_projection"]["calibration_inputs"]["path"] == "parity-inputs/text_projection.calibration.npz"
    assert "ort-cpu (gpu proxy)" in (s25_build / "report.md").read_text()


# -------------------------------------------------------------------------------- submit, end to end

def test_submit_compiles_profiles_runs_and_scores_every_accepted_build(hub, out):
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 0, r.output + r.stderr
    m = read_manifest(out)
    h = m["hub"]
    assert h["device"]["name"] == "Samsung Galaxy S25 (Family)"
    assert h["device"]["chipset"] == "qualcomm-snapdragon-8-elite-for-galaxy"
    assert h["qairt_version"]["pinned"] == "2.51" and h["qairt_version"]["why"] == "the QNN of the local toolchain (onnxruntime-qnn's QNN 2.51)"
    b = {f"{x['component']}/{x['format']}/{x['precision']}": x for x in m["builds"]}
    npu, npu8, gpu, gpu16 = (b[k]["hub"] for k in (NPU, NPU8, GPU, GPU16))
    assert [s["kind"] for s in npu["steps"]] == ["compile", "inference"]
    for rec in (npu, npu8, gpu, gpu16):
        assert rec["state"] == "done"
        for s in rec["steps"]:
            assert s["state"] == "success" and s["id"] and s["url"].startswith(fake_hub.WEB)
    assert npu["steps"][0]["options"] == ("--target_runtime precompiled_qnn_onnx --compute_unit npu "
                                          "--qairt_version 2.51 --quantize_full_type float16")
    assert npu8["steps"][0]["options"] == "--target_runtime precompiled_qnn_onnx --compute_unit npu --qairt_version 2.51"
    assert gpu["steps"][0]["options"] == "--target_runtime qnn_dlc --compute_unit gpu --qairt_version 2.51"
    assert gpu16["steps"][0]["options"] == ("--target_runtime qnn_dlc --compute_unit gpu --qairt_version 2.51 "
                                            "--quantize_full_type float16")
    assert npu["steps"][1]["options"] == "--compute_unit npu --qairt_version 2.51"
    assert npu["route"]["quantized_by"] is None and gpu["route"]["upload"] == "fp32"
    assert npu8["route"]["upload"] == "w8a16" and npu8["route"]["quantized_by"].startswith("local QDQ")
    assert npu8["parity"]["threshold_db"] == 30.0 and npu8["parity"]["verdict"] == "accepted"
    # the device outputs are scored with the local gate: fp16 rounding on the "NPU", exact fp32 on the "GPU"
    assert npu["parity"]["verdict"] == "accepted" and npu["parity"]["threshold_db"] == 40.0
    assert 50 < npu["parity"]["outputs"][0]["snr_db"] < 120
    assert gpu["parity"]["verdict"] == "accepted" and gpu["parity"]["threshold_db"] == 80.0
    assert npu["parity"]["runner"]["label"].startswith("Samsung Galaxy S25 (Family) via FAKE AI Hub")
    # profiles: the fake's figures are 25 µs per ONNX node on the NPU, x2 on the GPU
    nodes = {k: onnx_nodes(out / m["components"][k.split("/")[0]]["sources"]["fp32"]["path"]) for k in (NPU, GPU)}
    assert npu["profile"]["inference_ms"] == pytest.approx(25 * nodes[NPU] / 1000)
    assert gpu["profile"]["inference_ms"] == pytest.approx(50 * nodes[GPU] / 1000)
    assert npu["profile"]["compute_units"] == {"NPU": nodes[NPU], "GPU": 0, "CPU": 0}
    assert gpu["profile"]["compute_units"] == {"NPU": 0, "GPU": nodes[GPU], "CPU": 0}
    assert {f["kind"] for f in npu["files"]} == {"compiled_model", "profile", "outputs"}
    # reports: device dB beside the local dB, parity.json valid against its schema
    parity = json.loads((out / "parity.json").read_text())
    jsonschema.validate(parity, json.loads((SCHEMAS / "parity.schema.json").read_text()))
    jsonschema.validate(m, json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    dev = {x["key"]: x["device"] for x in parity["builds"]}
    assert dev[NPU]["verdict"] == "accepted" and dev[NPU]["min_snr_db"] == pytest.approx(
        npu["parity"]["outputs"][0]["snr_db"], abs=1e-3)
    assert parity["hub"]["qairt_version"] == "2.51"
    md = (out / "report.md").read_text()
    assert "| build | local runner | local SNR dB | device SNR dB |" in md and f"| {NPU} | ort-cpu |" in md
    html = (out / "report.html").read_text()
    assert 'id="hub"' in html and "device SNR dB" in html and npu["steps"][1]["url"] in html
    # RTF: this build has no talker or predictor, so no estimate, and it says why
    assert h["rtf"]["rtf"] is None and "talker_decode" in h["rtf"]["missing"]
    assert "RTF not estimated: no device-accepted profile for talker_decode, predictor_frame" in md
    # the GPU builds were judged by proxy; the device re-judged them, and their verdicts say so
    for k, rec in ((GPU, gpu), (GPU16, gpu16)):
        proxy = b[k]["parity"]["proxy"]
        assert proxy["device"]["verdict"] == rec["parity"]["verdict"] == "accepted"
        assert proxy["note"].startswith(f"judged on ORT CPU at {b[k]['precision']} by proxy for the Adreno GPU; "
                                        f"re-judged on Samsung Galaxy S25 (Family) via FAKE AI Hub")
        assert f"✅ accepted ({proxy['note']})" in md and proxy["note"] in html
    assert "proxy" not in b[NPU]["parity"]
    # `omni-export latency`: each graph's slowest ops from the profiles; no projection without the talker
    lat = cli("latency", str(out), "--json")
    assert lat.exit_code == 0, lat.output
    p = json.loads(lat.stdout)
    ops = {g["graph"]: g["ops"] for g in p["slowest_ops"]}
    assert set(ops) == {NPU, NPU8, GPU, GPU16} and ops[GPU][0]["compute_unit"] == "GPU"
    assert b[NPU]["hub"]["profile"]["slowest_ops"][:5] == ops[NPU]
    assert all(a["ms"] >= c["ms"] for o in ops.values() for a, c in zip(o, o[1:])) and ops[NPU][0]["ms"] > ops[NPU][-1]["ms"]
    assert p["rtf"]["rtf"] is None and p["rtf"]["missing"] == ["talker_decode", "predictor_frame"]
    assert p["ttfa"]["ms"] is None and p["ttfa"]["missing"] == ["talker_prefill", "predictor_frame", "talker_decode"]
    text = cli("latency", str(out)).output
    assert "  RTF not projected: no device-accepted profile for talker_decode, predictor_frame" in text
    assert "  TTFA not projected: no device-accepted profile for talker_prefill, predictor_frame, talker_decode" in text
    assert f"  {NPU} (NPU, " in text and "Latency projected on the device" in md
    # every file the hub stage wrote is listed: verify finds the directory clean
    v = cli("verify", str(out))
    assert v.exit_code == 0, v.output
    assert not (out / ".incomplete").exists() and not (out / ".staging").exists()


def test_latency_before_any_submission_says_what_it_needs(out, tmp_path):
    r = cli("latency", str(out))
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "omni-export latency: qwen3-tts → s25 (Samsung Galaxy S25 (Family))",
        "no AI Hub profile times in this build: submit it (`omni-export hub submit OUT`, or build with --hub) to "
        "profile talker_decode, predictor_frame, code2wav, text_projection, talker_prefill on Samsung Galaxy S25 (Family)"]
    assert json.loads(cli("latency", str(out), "--json").stdout)["rtf"] is None
    bad = cli("latency", str(tmp_path / "nothing"))
    assert bad.exit_code == 2 and "no such file or directory" in bad.output


def test_only_accepted_builds_are_submitted(hub, out):
    m = read_manifest(out)
    for b in m["builds"]:
        if b["component"] != "text_projection":
            continue
        for f in b["files"]:                  # reject it locally, as a failed gate would have
            (out / "rejected").mkdir(exist_ok=True)
            os.replace(out / f["path"], out / "rejected" / f["path"])
            f["path"] = f"rejected/{f['path']}"
        b["status"] = b["parity"]["verdict"] = "rejected"
    (out / "manifest.json").write_text(json.dumps(m))
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 3, r.output + r.stderr            # text_projection has no accepted build at all
    m = read_manifest(out)
    assert created(hub) == {"compile": 2, "quantize": 0, "inference": 2}
    assert "hub" not in builds_by(m)[("text_projection", "onnx", "fp16")]
    assert m["hub"]["left_out"] == [{"key": k, "reason": "rejected locally; only accepted builds are submitted"}
                                    for k in (NPU, NPU8)]
    assert sorted(j["name"].split()[1] for j in fake_hub.jobs(hub["state"]).values()) == (
        ["qwen3-tts-code2wav-fp16-s25"] * 2 + ["qwen3-tts-code2wav-fp32-s25"] * 2)


def test_a_build_whose_device_outputs_fall_under_the_gate_is_rejected(hub, out):
    scenario(hub, rules=[{"match": {"type": "inference", "name": "*text_projection*"}, "perturb_snr_db": 20}])
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 3, r.output + r.stderr
    m = read_manifest(out)
    b = builds_by(m)[("text_projection", "onnx", "fp16")]
    assert b["status"] == "rejected" and b["rejected_by"] == "device"
    assert b["hub"]["parity"]["verdict"] == "rejected"
    snr = b["hub"]["parity"]["outputs"][0]["snr_db"]
    assert 17 < snr < 23 and b["parity"]["outputs"][0]["snr_db"] > 40          # the simulator's stays
    assert all(f["path"].startswith("rejected/") and (out / f["path"]).is_file() for f in b["files"])
    assert not (out / "qwen3-tts-text_projection-fp16-s25.onnx").exists()
    assert builds_by(m)[("text_projection", "onnx", "w8a16")]["rejected_by"] == "device"
    assert m["hub"]["summary"]["components_without_device_accepted_build"] == ["text_projection"]
    assert m["summary"]["components_without_accepted_build"] == ["text_projection"]
    md = (out / "report.md").read_text()
    assert f"- `{NPU}` on the device: output 'projected' {snr:.1f} dB < gate 40 dB" in md
    assert "on the device (AI Hub): output 'projected'" in md
    assert builds_by(m)[("code2wav", "onnx", "fp32")]["status"] == "accepted"
    jsonschema.validate(m, json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    v = cli("verify", str(out), "--rescore")          # the local verdict is what a rescore reproduces
    assert v.exit_code == 0, v.output
    # re-gating judges the device scores too: rejected at the build's gate, accepted under a lower one
    again = {r["key"]: r for r in json.loads(cli("parity", str(out), "--gate", "fp16=15,w8a16=25", "--json").stdout)["builds"]}
    assert again[NPU]["verdict"] == "accepted"                              # ~20 dB on the phone >= 15
    assert again[NPU8]["verdict"] == "rejected" and again[NPU8]["reason"].startswith("on the device (AI Hub): ")


def test_quantize_on_hub_runs_ai_hubs_quantize_job_on_the_captured_calibration_set(hub, out):
    r = cli("hub", "submit", str(out), "--quantize-on", "hub", "--precisions", "w8a16")
    assert r.exit_code in (0, 3), r.output + r.stderr
    rec = _records(read_manifest(out))[NPU8]
    assert [s["kind"] for s in rec["steps"]] == ["quantize", "compile", "inference"]
    assert rec["steps"][0]["options"] == "weights_dtype=INT8 activations_dtype=INT16"
    assert rec["route"]["upload"] == "fp32"
    assert rec["route"]["quantized_by"] == ("AI Hub quantize job (INT8 weights, INT16 activations) on the "
                                            "captured calibration set")
    jobs = fake_hub.jobs(hub["state"])
    q = next(j for j in jobs.values() if j["kind"] == "quantize")
    assert (q["weights"], q["activations"]) == ("QUANTIZE_DTYPE_INT8", "QUANTIZE_DTYPE_INT16")
    compiled = next(j for j in jobs.values() if j["kind"] == "compile")
    assert compiled["model"] == q["target"]                  # compiled from AI Hub's QDQ model
    db = json.loads((hub["state"] / "db.json").read_text())
    assert db["datasets"][q["dataset"]]["name"] == "omni-export text_projection calibration"
    assert rec["parity"]["threshold_db"] == 30.0 and rec["parity"]["verdict"] in ("accepted", "rejected")
    assert rec["parity"]["outputs"][0]["snr_db"] > 20       # a real QDQ model ran, not a canned answer


# --------------------------------------------------------------------------------- resume and records

def test_a_kill_mid_submission_is_resumed_without_submitting_twice(hub, out):
    """The process dies right after AI Hub created the first inference job, before its id came
    back; the rerun polls the recorded compile jobs, finds the inference job by its reserved name
    and submits only the one job that was never created."""
    scenario(hub, kill_after_create="inference")
    first = cli_process(hub["env"], "hub", "submit", str(out), "-q")
    assert first.returncode == 137, first.stderr
    m = read_manifest(out)
    steps = {k: {s["kind"]: s for s in rec["steps"]} for k, rec in _records(m).items()}
    assert all(s["compile"]["id"] for s in steps.values())        # ids on disk as soon as they existed
    reserved = [s["inference"] for s in steps.values() if "inference" in s]
    assert len(reserved) == 1 and reserved[0]["id"] is None and reserved[0]["state"] == "reserved"
    assert (out / ".incomplete").exists()
    st = cli("hub", "status", str(out))
    assert st.exit_code == 0 and "was interrupted" in st.output and "(not created)" in st.output
    assert created(hub) == {"compile": 4, "quantize": 0, "inference": 1}

    second = cli("hub", "submit", str(out), "-q")
    assert second.exit_code == 0, second.stderr
    assert created(hub) == {"compile": 4, "quantize": 0, "inference": 4}
    names = [j["name"] for j in fake_hub.jobs(hub["state"]).values()]
    assert len(names) == len(set(names)) == 8
    m = read_manifest(out)
    assert all(rec["state"] == "done" for rec in _records(m).values())
    assert not (out / ".incomplete").exists() and cli("verify", str(out)).exit_code == 0


def test_a_failed_job_is_recorded_and_only_resubmit_retries_it(hub, out):
    scenario(hub, rules=[{"match": {"type": "compile", "name": "*code2wav-fp32*"},
                          "fail": "QAIRT 2.51 cannot run on this device's runtime"}])
    only = ("--components", "code2wav")
    r = cli("hub", "submit", str(out), *only)
    assert r.exit_code == 0                # code2wav has a build accepted on the device (its fp16 one)
    assert r.stdout.splitlines()[-1] == ("1 build(s) have a FAILED job; `omni-export hub submit --resubmit` "
                                         "retries them")
    rec = _records(read_manifest(out))[GPU]
    assert rec["state"] == "failed" and rec["steps"][0]["message"] == "QAIRT 2.51 cannot run on this device's runtime"
    assert "compile job FAILED: QAIRT 2.51 cannot run" in (out / "report.md").read_text()
    assert cli("hub", "submit", str(out), *only).exit_code == 0
    assert created(hub)["compile"] == 2                              # the failed one was not retried
    scenario(hub)
    r = cli("hub", "submit", str(out), "--resubmit", *only)
    assert r.exit_code == 0, r.output + r.stderr
    rec = _records(read_manifest(out))[GPU]
    assert rec["state"] == "done" and rec["steps"][0]["attempt"] == 2
    assert rec["history"][0]["steps"][0]["state"] == "failed"
    assert created(hub)["compile"] == 3


def test_a_5xx_on_submission_never_duplicates_a_job(hub, out):
    """fp32: a 503 before AI Hub created the job; fp16: a 503 after it did (the response was lost)."""
    scenario(hub, rules=[{"match": {"type": "compile", "name": "*code2wav-fp32*"}, "http": [503]},
                         {"match": {"type": "compile", "name": "*code2wav-fp16*"}, "http": [503],
                          "http_after_create": True}])
    r = cli("hub", "submit", str(out), "--components", "code2wav")
    assert r.exit_code == 0, r.output + r.stderr
    jobs = {j["name"].split()[1]: j for j in fake_hub.jobs(hub["state"]).values() if j["kind"] == "compile"}
    assert sorted(jobs) == ["qwen3-tts-code2wav-fp16-s25", "qwen3-tts-code2wav-fp32-s25"]     # one each
    recs = _records(read_manifest(out))
    assert recs[GPU]["steps"][0]["id"] == jobs["qwen3-tts-code2wav-fp32-s25"]["id"]
    assert recs[GPU16]["steps"][0]["id"] == jobs["qwen3-tts-code2wav-fp16-s25"]["id"]
    assert len(fake_hub.calls(hub["state"], "create_compile_job")) == 3     # fp32 twice (the first refused)
    assert len(fake_hub.calls(hub["state"], "get_job_summary_list")) == 2   # each looked up by name first


def test_status_lists_every_recorded_job(hub, out):
    assert cli("hub", "submit", str(out), "--timeout", "0").exit_code == 3    # submit only: still waiting
    st = cli("hub", "status", str(out))
    assert st.exit_code == 0
    lines = st.stdout.splitlines()
    assert lines[0] == ("FAKE AI Hub (tests/fake_hub.py; qai-hub client, fake service) · Samsung Galaxy S25 (Family) "
                        "· QAIRT 2.51 · recorded states (--refresh asks AI Hub)")
    rows = [ln.split() for ln in lines[1:-1]]
    assert [(r[0], r[1]) for r in rows] == [(k, "compile") for k in (NPU, NPU8, GPU, GPU16)]
    assert all(r[2].startswith("j") and r[4].startswith(fake_hub.WEB) for r in rows)
    assert lines[-1] == "4 build(s): 0 accepted on the device, 0 rejected on the device, 0 failed, 4 waiting"
    live = cli("hub", "status", str(out), "--refresh", "--json")
    assert {j["job_state"] for j in json.loads(live.stdout)["jobs"]} <= {"OPTIMIZING_MODEL", "CREATED", "SUCCESS"}
    r = cli("hub", "submit", str(out))                                 # waits on them, submits the rest
    assert r.exit_code == 0 and created(hub) == {"compile": 4, "quantize": 0, "inference": 4}
    assert cli("hub", "status", str(out)).stdout.splitlines()[-1] == (
        "4 build(s): 4 accepted on the device, 0 rejected on the device, 0 failed, 0 waiting")


def test_status_of_a_directory_without_jobs_is_one_line(hub, out):
    r = cli("hub", "status", str(out))
    assert r.exit_code == 2
    assert r.stderr.strip() == (f"omni-export: error: {out} has no AI Hub jobs; submit its accepted builds with "
                                f"`omni-export hub submit {out}`")         # (read only: the fake is never loaded)


def _records(m: dict) -> dict:
    return {f"{b['component']}/{b['format']}/{b['precision']}": b["hub"] for b in m["builds"] if b.get("hub")}


def test_network_errors_are_clear_and_never_cost_a_job(hub, out):
    scenario(hub, offline=["get_device_list"])                   # AI Hub unreachable from the start
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 2
    assert errors(r.stderr) == ["omni-export: error: cannot reach Qualcomm AI Hub: Internal API failure. Could not "
                                f"connect to Qualcomm AI Hub. Please visit {fake_hub.WEB} to check the service's status."]
    assert "hub" not in read_manifest(out) and not (out / ".incomplete").exists()
    scenario(hub, offline=["get_job"])                           # the network goes while jobs run
    r = cli("hub", "submit", str(out), "--components", "code2wav", "--timeout", "0.5")
    assert r.exit_code == 3 and "still waiting on AI Hub" in r.stdout
    (step,) = [s for rec in _records(read_manifest(out)).values() for s in rec["steps"] if "fp32" in s["name"]]
    assert step["id"] and step["state"] == "submitted"       # created, then every status poll failed
    assert step["message"] == (f"status check: get job {step['id']}: Internal API failure. Could not connect to "
                               f"Qualcomm AI Hub. Please visit {fake_hub.WEB} to check the service's status.; will retry")
    scenario(hub)
    assert cli("hub", "submit", str(out), "--components", "code2wav").exit_code == 0
    assert created(hub) == {"compile": 2, "quantize": 0, "inference": 2}


# ------------------------------------------------------------------------------------ credentials

def test_a_missing_token_is_one_line_with_exit_2(hub, out, tmp_path):
    env = {**hub["env"], "QAIHUB_CLIENT_INI": str(tmp_path / "nowhere.ini")}
    r = cli_process(env, "hub", "submit", str(out))
    assert r.returncode == 2 and r.stdout == ""
    assert errors(r.stderr) == [
        f"omni-export: error: no Qualcomm AI Hub token configured (looked in {tmp_path / 'nowhere.ini'}): run "
        f"`qai-hub configure --api_token YOUR_TOKEN` (token from {fake_hub.WEB}/account/) or point "
        f"QAIHUB_CLIENT_INI at a client.ini with an [api] api_token".replace(f"{fake_hub.WEB}/account/",
                                                                             "https://workbench.aihub.qualcomm.com/account/")]
    assert "hub" not in read_manifest(out) and not (out / ".incomplete").exists()
    # --hub on a build fails the same way, before anything is built
    b = cli_process(env, "qwen3-tts", "--target", "s25", "--hub", "--out", str(tmp_path / "never"))
    assert b.returncode == 2 and errors(b.stderr)[0].startswith("omni-export: error: no Qualcomm AI Hub token configured")
    assert len(errors(b.stderr)) == 1
    assert not (tmp_path / "never").exists()


def test_a_rejected_token_is_one_line_and_never_echoed(hub, out):
    scenario(hub)
    fake_hub.write_scenario(hub["state"], tokens=["another-token"])
    r = cli("hub", "devices")
    assert r.exit_code == 2
    assert errors(r.stderr) == [f"omni-export: error: Qualcomm AI Hub rejected the API token in {hub['ini']}: copy a "
                                f"valid one from {fake_hub.WEB}/account/ and run `qai-hub configure --api_token YOUR_TOKEN`"]
    assert TOKEN not in r.output + r.stderr


def test_the_token_never_reaches_a_file_or_the_console(hub, out):
    """The fake service echoes the caller's token in a failure message (as a careless service could)."""
    scenario(hub, rules=[{"match": {"type": "inference", "name": "*code2wav*"}, "fail": "device said: token {token} bad"}])
    r = cli_process(hub["env"], "hub", "submit", str(out), "--debug")
    assert r.returncode == 3, r.stderr
    assert "device said: token *** bad" in (out / "manifest.json").read_text()
    assert TOKEN not in r.stdout + r.stderr
    st = cli("hub", "status", str(out), "--refresh", "--debug")
    assert st.exit_code == 0 and TOKEN not in st.stdout + st.stderr
    for p in out.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


# ---------------------------------------------------------------------------------------- devices

def test_devices_lists_name_chipset_attributes_and_targets(hub):
    r = cli("hub", "devices")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0] == ("Samsung Galaxy S23 (Family) · Android 14 · qualcomm-snapdragon-8gen2")
    assert ("Samsung Galaxy S25 (Family) · Android 15 · qualcomm-snapdragon-8-elite-for-galaxy  "
            "[targets: s25-htp, s25]") in lines
    assert any("hexagon:v79" in ln for ln in lines) and lines[-1].startswith("3 device(s) from FAKE AI Hub")


def test_an_unknown_device_is_refused_before_anything_is_submitted(hub, out):
    r = cli("hub", "submit", str(out), "--device", "Samsung Galaxy S99")
    assert r.exit_code == 2
    assert errors(r.stderr) == ["omni-export: error: AI Hub has no device named 'Samsung Galaxy S99'; similar: Samsung "
                                "Galaxy S23 (Family), Samsung Galaxy S24 (Family), Samsung Galaxy S25 (Family) "
                                "(omni-export hub devices lists them)"]
    assert created(hub) == {"compile": 0, "quantize": 0, "inference": 0}
    assert "hub" not in read_manifest(out) and not (out / ".incomplete").exists()


def test_a_build_without_sources_says_to_rebuild_with_keep_sources(hub, out):
    """sources/ is kept only with --keep-sources or --hub (issue 37 item 3): hub submit on a build
    without it is one line naming the flag, before anything is submitted."""
    m = read_manifest(out)
    m["options"]["keep_sources"] = False
    for c in m["components"].values():
        c.pop("sources", None)
    shutil.rmtree(out / "sources")
    (out / "manifest.json").write_text(json.dumps(m))
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 2
    assert errors(r.stderr) == [f"omni-export: error: {out} was built without sources/ (the ONNX AI Hub compiles "
                                f"from); rebuild it with --keep-sources (or --hub)"]
    assert created(hub) == {"compile": 0, "quantize": 0, "inference": 0}


def test_the_fake_rejects_what_the_real_service_or_client_would(hub, out):
    """The fake is not a yes-machine: the real client's checks and the service's 4xx answers apply."""
    from omni_export.hub.client import Hub

    h = Hub().connect()
    m, c = h.m, h.client
    src = out / read_manifest(out)["components"]["code2wav"]["sources"]["fp32"]["path"]
    model = c.upload_model(str(src))
    s25 = m.Device("Samsung Galaxy S25 (Family)")
    with pytest.raises(m.UserError):
        c.submit_compile_job(model, device=m.Device("Samsung Galaxy S99"))
    with pytest.raises(m.UserError, match="invalid value 'tpu' for --compute_unit"):
        c.submit_compile_job(model, device=s25, options="--target_runtime qnn_dlc --compute_unit tpu")
    with pytest.raises(m.UserError, match="unrecognized option --fast"):
        c.submit_compile_job(model, device=s25, options="--target_runtime qnn_dlc --fast")
    with pytest.raises(m.UserError, match="invalid value '9.99' for --qairt_version"):
        c.submit_compile_job(model, device=s25, options="--qairt_version 9.99")
    with pytest.raises(AttributeError):
        c.submit_compile_job(model, device=s25, options=42)               # the client's own check
    job = c.submit_compile_job(model, device=s25, options="--target_runtime qnn_dlc --compute_unit gpu")
    with pytest.raises(m.UserError, match="not ready"):                   # still compiling
        c.submit_inference_job(job.get_target_model(), device=s25, inputs={"codes": [np.zeros((1, 16, 4), np.int32)],
                                                                             "frame_mask": [np.ones((1, 4), np.float32)]})
    with pytest.raises(m.UserError, match="could not be found"):
        c.get_job("j9999999fk")


# ----------------------------------------------------------------------------------- RTF arithmetic

def test_rtf_of_the_study_placement():
    """FACTS.md: talker + predictor 49.7 ms per 80 ms frame on the S25 NPU, Code2Wav 45.8 ms per
    frame on the GPU, pipelined RTF 0.62. Code2Wav runs once per chunk of 12 frames here."""
    from omni_export.hub.rtf import estimate, lines
    from omni_export.recipes import get_recipe

    def built(comp, unit, ms):
        return {"component": comp, "format": "ctx" if unit == "npu" else "onnx", "precision": "fp16",
                "hub": {"parity": {"verdict": "accepted"}, "profile": {"inference_ms": ms},
                        "route": {"compute_unit": unit, "runtime": "qnn_context_binary"}}}

    m = {"builds": [built("talker_decode", "npu", 30.0), built("predictor_frame", "npu", 19.7),
                    built("code2wav", "gpu", 549.6)]}
    r = estimate(m, get_recipe("qwen3-tts").realtime, {"chunk-frames": 12}, source="test")
    assert r["by_compute_unit"] == {"npu": 49.7, "gpu": 45.8}
    assert r["sequential_rtf"] == pytest.approx(1.1938, abs=1e-4)       # (49.7 + 45.8) / 80
    assert r["pipelined_rtf"] == pytest.approx(0.6212, abs=1e-4)        # max(49.7, 45.8) / 80
    assert r["rtf"] == r["pipelined_rtf"] and r["mode"] == "pipelined"
    text = lines(r)
    assert "code2wav (onnx/fp16, GPU): 549.60 ms per chunk × 1/chunk_frames = 0.0833333 per frame = 45.80 ms per frame" in text
    assert text[:2] == ["talker_decode (ctx/fp16, NPU): 30.00 ms per step × 1 per frame = 30.00 ms per frame",
                        "predictor_frame (ctx/fp16, NPU): 19.70 ms per frame × 1 per frame = 19.70 ms per frame"]
    assert text[3:6] == ["per frame of 80 ms: NPU 49.70 ms · GPU 45.80 ms",
                         "sequential RTF = (49.70 + 45.80) / 80 = 1.194", "pipelined RTF = max(49.70, 45.80) / 80 = 0.621"]
    assert text[-1] == "RTF estimate (pipelined): 0.621 [test]"
    # the predictor measured as prefill + 14 single steps stands in for the fused frame
    m["builds"][1:2] = [built("predictor_prefill", "npu", 2.0), built("predictor_decode", "npu", 1.25)]
    assert estimate(m, get_recipe("qwen3-tts").realtime, {"chunk-frames": 12})["by_compute_unit"]["npu"] == 49.5


# --------------------------------------------------------------------- the acceptance run (slow)

@pytest.mark.slow
def test_a_full_hub_run_on_s25_gates_the_phone_and_estimates_rtf(hub, tmp_path, tiny_checkpoint):
    """`omni-export qwen3-tts --target s25 --hub` through the CLI: every graph the RTF needs built
    (talker and predictor on the NPU at fp16, Code2Wav on the GPU at fp32 and fp16), the fp16
    Code2Wav's device outputs perturbed under its gate, the RTF estimate printed; then the same
    command again adopts the recorded jobs: nothing is submitted twice. Excluded from the default
    run (two builds of three graphs: minutes on a loaded 2-core machine)."""
    scenario(hub, rules=[{"match": {"type": "inference", "name": "*code2wav-fp16*"}, "perturb_snr_db": 20}])
    out = tmp_path / "out"
    args = ["qwen3-tts", "--target", "s25", "--hub", "--components", "talker_decode,predictor_frame,code2wav",
            "--formats", "onnx", "--precision", "fp32,fp16", "--no-attribution", "-q", "--jobs", "1",
            "--left-context", "2", "--chunk-frames", "2", "--checkpoint", str(tiny_checkpoint), "--out", str(out)]
    first = cli_process(hub["env"], *args)
    assert first.returncode == 0, first.stderr[-3000:]
    m = read_manifest(out)
    recs = _records(m)
    assert set(recs) == {"talker_decode/onnx/fp16", "predictor_frame/onnx/fp16", "code2wav/onnx/fp32",
                         "code2wav/onnx/fp16"}
    for rec in recs.values():
        assert [s["kind"] for s in rec["steps"]] == ["compile", "inference"] and all(s["id"] for s in rec["steps"])
        assert rec["profile"]["inference_ms"] > 0 and rec["parity"]["verdict"]
    c16 = builds_by(m)[("code2wav", "onnx", "fp16")]
    assert c16["status"] == "rejected" and c16["rejected_by"] == "device"
    assert c16["parity"]["verdict"] == "accepted"                        # the local (CPU proxy) verdict stays
    rtf = m["hub"]["rtf"]
    assert rtf["missing"] == [] and rtf["mode"] == "pipelined" and set(rtf["by_compute_unit"]) == {"npu", "gpu"}
    assert [g["build"] for g in rtf["graphs"]] == ["talker_decode/onnx/fp16", "predictor_frame/onnx/fp16",
                                                   "code2wav/onnx/fp32"]
    by = rtf["by_compute_unit"]
    assert rtf["pipelined_rtf"] == pytest.approx(max(by.values()) / 80, abs=1e-4)
    assert rtf["sequential_rtf"] == pytest.approx(sum(by.values()) / 80, abs=1e-4)
    assert f"RTF estimate (pipelined): {rtf['rtf']:.3f}" in first.stdout
    jobs_before = len(fake_hub.jobs(hub["state"]))

    again = cli_process(hub["env"], *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(fake_hub.jobs(hub["state"])) == jobs_before                   # adopted, not resubmitted
    assert all(rec.get("adopted") and rec["state"] == "done" for rec in _records(read_manifest(out)).values())
    assert cli("verify", str(out)).exit_code == 0
