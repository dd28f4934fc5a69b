"""`omni-export latency`: TTFA and RTF projected from AI Hub profile times (hub/latency.py).

The arithmetic is checked on manifests written here (the study's per-graph times; made-up host work).
The whole path -- a tiny s25 build of every graph the projection reads, submitted to the fake AI Hub
(tests/fake_hub.py), a synth run recorded in it, `omni-export latency` and the reports -- is a slow test
(six graphs built: 60-120 s on this 2-core machine, past the default suite's budget); the default suite
runs `latency` on test_hub.py's submitted build (test_submit_compiles_profiles_runs_and_scores_every_accepted_build)."""
from __future__ import annotations

import json

import pytest

import fake_hub
from conftest import read_manifest, run_cli

TOKEN = "sentinel-TOKEN-latency"


def _built(comp, unit, ms, fmt=None):
    return {"component": comp, "format": fmt or ("ctx" if unit == "npu" else "onnx"), "precision": "fp16",
            "status": "accepted",
            "hub": {"parity": {"verdict": "accepted"}, "route": {"compute_unit": unit, "runtime": "qnn_context_binary"},
                    "profile": {"inference_ms": ms}}}


def _manifest(builds, latency=None, **options):
    m = {"recipe": {"name": "qwen3-tts"}, "target": {"name": "s25", "hub_device": "Samsung Galaxy S25 (Family)"},
         "options": {"recipe_options": {"chunk-frames": 12, "chunk-schedule": "2", **options}}, "builds": builds,
         "hub": {"client": "test", "device": {"name": "Samsung Galaxy S25 (Family)"}}}
    if latency:
        m["latency"] = {"synth": [latency]}
    return m


STUDY = [_built("talker_decode", "npu", 30.0), _built("predictor_frame", "npu", 19.7),
         _built("code2wav", "gpu", 549.6)]


def test_the_studys_per_graph_times_give_its_pipelined_rtf_of_0_62():
    """Arithmetic, not a measurement: FACTS.md's study figures (talker + predictor 49.7 ms per 80 ms frame
    on the S25 NPU, Code2Wav 45.8 ms per frame on the Adreno GPU: 549.6 ms per 12-frame chunk) through
    the projection give the study's pipelined RTF, 0.62; with no synth run recorded, no host work."""
    from omni_export.hub.latency import lines, project
    from omni_export.recipes import get_recipe

    p = project(_manifest(STUDY), get_recipe("qwen3-tts"))
    r = p["rtf"]
    assert [(x["compute_unit"], x["ms"]) for x in r["lanes"]] == [("npu", 49.7), ("gpu", 45.8)]
    assert r["mode"] == "pipelined" and r["rtf"] == pytest.approx(0.6212, abs=1e-4) and r["host_ms_per_unit"] is None
    text = lines(p)
    assert "  lanes: NPU 49.70 ms · GPU 45.80 ms; RTF (pipelined, slowest lane / 80 ms) = 0.621 " \
           "[projection: arithmetic on the figures above]" in text
    assert any(x.startswith("  host work: not included (no synth run recorded in OUT") for x in text)
    # the time to first audio needs the prompt's graphs and the first chunk's, which the study gave no time for
    assert p["ttfa"]["ms"] is None and p["ttfa"]["missing"] == ["text_projection", "talker_prefill", "code2wav_n2"]
    assert "  TTFA not projected: no device-accepted profile for text_projection, talker_prefill, code2wav_n2" in text


def test_host_work_joins_the_loops_lane_and_the_ttfa_adds_up_the_path_to_the_first_chunk():
    from omni_export.hub.latency import lines, project
    from omni_export.recipes import get_recipe

    run = {"runner": "ort", "graphs": "OUT on ort (fp16)", "recorded": "2026-12-01T00:00:00Z", "omni_export_git": "abc",
           "ttfa_ms": 200.0, "first_audio_after_frames": 2,
           "latency": {"timed_on": "wall clock of this machine", "per_frame_ms": {"host": 9.8},
                       "stages_ms": {"text_projection": {"calls": 1}, "talker_prefill": {"calls": 2},
                                     "talker_decode": {"calls": 11}}}}
    builds = STUDY + [_built("text_projection", "npu", 0.5), _built("talker_prefill", "npu", 40.0),
                      _built("code2wav_n2", "gpu", 20.0, "onnx")]
    p = project(_manifest(builds, run), get_recipe("qwen3-tts"))
    assert [(x["compute_unit"], x["graphs_ms"], x["host_ms"], x["ms"]) for x in p["rtf"]["lanes"]] == \
        [("npu", 49.7, 9.8, 59.5), ("gpu", 45.8, 0.0, 45.8)]
    assert p["rtf"]["rtf"] == pytest.approx(59.5 / 80, abs=1e-4)
    t = p["ttfa"]
    # prompt: 1 projection + 2 prefill calls (the recorded run's), then 2 predictor frames, 1 talker step,
    # the 2-frame chunk, and 2 frames of host work
    assert [(x["what"], x["calls"], x["ms"]) for x in t["terms"]] == [
        ("text_projection", 1, 0.5), ("talker_prefill", 2, 80.0), ("predictor_frame", 2, 39.4),
        ("talker_decode", 1, 30.0), ("code2wav_n2", 1, 20.0), ("host", 2, 19.6)]
    assert t["ms"] == pytest.approx(189.5) and t["frames"] == 2 and t["host"] == "included"
    text = lines(p)
    assert text[0] == "AI Hub profiles: test on Samsung Galaxy S25 (Family)"
    assert "  talker_prefill: 2 × 40.00 ms = 80.00 ms (the prompt, as often as the recorded synth run called it) " \
           "[AI Hub profile]" in text
    assert "  host work: 9.80 ms per frame [synth --json, wall clock of this machine; recorded 2026-12-01T00:00:00Z " \
           "at omni-export abc]" in text
    assert "  TTFA = 189.50 ms, host work included [projection: arithmetic on the figures above]" in text


def test_without_profile_times_it_says_in_one_line_what_it_needs():
    from omni_export.hub.latency import lines, project
    from omni_export.recipes import get_recipe

    m = _manifest([])
    m.pop("hub")
    p = project(m, get_recipe("qwen3-tts"))
    assert lines(p) == ["no AI Hub profile times in this build: submit it (`omni-export hub submit OUT`, or build "
                        "with --hub) to profile talker_decode, predictor_frame, code2wav, text_projection, "
                        "talker_prefill, code2wav_n2 on Samsung Galaxy S25 (Family)"]
    spark = project({**m, "recipe": {"name": "spark"}}, get_recipe("spark"))
    assert spark["needs"].startswith("spark declares no real-time unit of output")


def test_record_latency_needs_a_build():
    proc = run_cli("synth", "qwen3-tts", "--text-ids", "1,2,3", "--record-latency")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("omni-export: error: --record-latency records into a build's "
                                                    "manifest.json: pass --build OUT")


# ----------------------------------------------------------------------------- a fake-hub build

@pytest.fixture(scope="module")
def submitted(tmp_path_factory, tiny_checkpoint):
    """The graphs of one 80 ms frame, of the prompt and of the first chunk, ONNX at fp16 on s25 (the LM on
    the NPU, Code2Wav on the GPU by its role), submitted to the fake AI Hub; then a synth run recorded. The
    code predictor as its prefill and step graphs (the fused frame's 15 unrolled steps take 25 s to export)."""
    from omni_export.core import Format, Precision
    from omni_export.pipeline import RunOptions, run
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    root = tmp_path_factory.mktemp("latency")
    out = root / "out"
    result = run(RunOptions(get_recipe("qwen3-tts"), get_target("s25"), out, checkpoint=tiny_checkpoint,
                            components=("text_projection", "talker_prefill", "talker_decode", "predictor_prefill",
                                        "predictor_decode", "code2wav"),
                            formats=(Format.ONNX,), precisions=(Precision.FP16,),
                            recipe_options={"left-context": 2, "chunk-frames": 2},
                            attribution="off", rewrites=(), jobs=1, e2e=(), keep_sources=True))
    assert result.exit_code == 0
    state, ini = root / "fake-hub", root / "client.ini"
    fake_hub.write_scenario(state, tokens=[TOKEN])
    ini.write_text(f"[api]\napi_token = {TOKEN}\napi_url = {fake_hub.WEB}\nweb_url = {fake_hub.WEB}\nverbose = False\n")
    env = {"QAIHUB_CLIENT_INI": str(ini), fake_hub.STATE_ENV: str(state), "OMNI_EXPORT_FAKE_HUB": "fake_hub"}
    sub = run_cli("hub", "submit", str(out), env=env)
    assert sub.returncode == 0, sub.stderr[-2000:]
    before = read_manifest(out)
    synth = run_cli("synth", "qwen3-tts", "--build", str(out), "--runner", "ort", "--text-ids",
                    "1,2,3,4,5,6,7,8,9", "--greedy", "--max-frames", "4", "--json", "--record-latency")
    assert synth.returncode == 0, synth.stderr[-2000:]
    return out, before, json.loads(synth.stdout)


@pytest.mark.slow
def test_latency_projects_ttfa_and_rtf_from_the_fake_hubs_profiles(submitted, tmp_path):
    out, before, synth = submitted
    assert "latency" not in before
    m = read_manifest(out)
    rec = m["latency"]["synth"][0]
    assert rec["runner"] == "ort" and rec["ttfa_ms"] == synth["ttfa_ms"] and rec["first_audio_after_frames"] == 2
    proc = run_cli("latency", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    assert p["needs"] is None and p["device"] == "Samsung Galaxy S25 (Family)"
    prof = {f"{b['component']}": b["hub"]["profile"]["inference_ms"] for b in m["builds"]}
    lanes = {x["compute_unit"]: x for x in p["rtf"]["lanes"]}
    host = synth["latency"]["per_frame_ms"]["host"]
    frame = prof["predictor_prefill"] + 14 * prof["predictor_decode"]      # stands in for the fused frame
    assert lanes["npu"]["graphs_ms"] == pytest.approx(prof["talker_decode"] + frame, abs=1e-2)
    assert lanes["npu"]["host_ms"] == pytest.approx(host) and lanes["gpu"]["graphs_ms"] == pytest.approx(
        prof["code2wav"] / 2, abs=1e-3)                           # one 2-frame chunk per 2 frames
    assert p["rtf"]["rtf"] == pytest.approx(max(lanes["npu"]["ms"], lanes["gpu"]["ms"]) / 80, abs=1e-4)
    t = p["ttfa"]                          # chunk-frames 2: the default schedule's first chunk is code2wav itself
    assert t["graph"] == "code2wav" and t["frames"] == 2 and not t["missing"]
    calls = {k: v["calls"] for k, v in synth["latency"]["stages_ms"].items() if "calls" in v}
    assert t["ms"] == pytest.approx(calls["text_projection"] * prof["text_projection"] + calls["talker_prefill"] *
                                    prof["talker_prefill"] + 2 * frame + prof["talker_decode"] + prof["code2wav"]
                                    + 2 * host, abs=2e-2)
    # the slowest ops per graph, from the device profile (the fake gives MatMul and Conv the most time)
    ops = {g["graph"]: g["ops"] for g in p["slowest_ops"]}
    assert set(ops) == {f"{c}/onnx/fp16" for c in prof}
    assert ops["talker_decode/onnx/fp16"][0]["type"] == "MatMul" and ops["code2wav/onnx/fp16"][0]["compute_unit"] == "GPU"
    assert all(a["ms"] >= b["ms"] for o in ops.values() for a, b in zip(o, o[1:]))
    # the same, for people: every figure with its source; and in the reports
    text = run_cli("latency", str(out)).stdout
    assert f"RTF (pipelined, slowest lane / 80 ms) = {p['rtf']['rtf']:.3f} [projection: arithmetic" in text
    job = next(s["id"] for s in next(b for b in m["builds"] if b["component"] == "talker_decode")["hub"]["steps"]
               if s["kind"] == "inference")
    assert f"TTFA = {t['ms']:.2f} ms, host work included" in text and "AI Hub profiles: FAKE AI Hub" in text
    assert f"[AI Hub profile, job {job}]" in text and "[synth --json, wall clock of this machine" in text
    assert "Slowest ops on the device" in text
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "Latency projected on the device" in md and f"TTFA = {t['ms']:.2f} ms" in md
    assert 'id="latency"' in html and f"TTFA = {t['ms']:.2f} ms" in html
    assert run_cli("verify", str(out)).returncode == 0                # the recorded run left the build clean
