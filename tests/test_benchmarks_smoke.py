"""The benchmark harness works: it runs on the tiny demo checkpoint and writes result JSON with
every field and sane values. No timing thresholds (timing never goes in tests), few passes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import timing as tm  # noqa: E402

FAST_TIMING = ["--passes", "3", "--warmup", "1", "--min-pass-ms", "1", "--bandwidth-mib", "16", "--samples", "2"]


def bench(tmp: Path, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    results = tmp / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), args[0], "--results", str(results),
                           "--work", str(tmp / "work"), *args[1:]],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    files = sorted(results.glob("*.json"))
    assert len(files) == 1, (proc.returncode, proc.stderr[-3000:])
    return proc, json.loads(files[0].read_text())


def check_provenance(d: dict) -> None:
    p = d["provenance"]
    assert p["git_sha"] and p["toolchain"]["torch"] and p["toolchain"]["onnxruntime"]
    assert p["host"]["cores"] >= 1 and p["host"]["mem_total_bytes"] > 0
    assert "run.py" in p["command_line"][1] and p["options"]
    mem = d["process"]["memory"]
    assert mem["samples"] >= 1 and mem["peak_rss_anon_bytes"] > 10 * 2**20
    assert mem["peak_processes"] and max(p[1] for p in mem["timeline"]) == mem["peak_rss_anon_bytes"]
    cpu = [p[3] for p in mem["timeline"]]
    assert cpu == sorted(cpu) and cpu[-1] == mem["cpu_s_sampled"] > 0          # CPU seconds so far, sampled
    proc = d["process"]
    assert 0 < mem["cpu_s_sampled"] <= proc["cpu_s"] * 1.05        # sampled misses ends; rusage is exact
    assert 0 < proc["mean_cores_busy"] <= proc["cores"] + 0.1
    assert 0 < mem["peak_pss_anon_bytes"] <= mem["peak_rss_anon_bytes"] * 1.01


def check_arm(arm: dict, passes: int) -> None:
    assert arm["quotable"] and not arm["errors"] and arm["n"] == passes == len(arm["per_pass"])
    assert 0 < arm["min"] <= arm["median"] <= arm["max"]


def test_runtime_benchmark_on_the_demo_checkpoint(tmp_path):
    proc, d = bench(tmp_path, "runtime", "--size", "tiny", "--cases", "talker,code2wav", "--runners", "ort",
                    *FAST_TIMING)
    assert proc.returncode == 0 and d["status"] == "ok", proc.stderr[-3000:]
    check_provenance(d)
    assert d["benchmark"] == "runtime" and d["threads"]["requested"] == d["threads"]["torch"] == 1
    assert d["threads"]["executorch_xnnpack"] == 1
    talker = d["cases"]["talker"]
    assert talker["exports"]["ort"]["session_threads"]["intra_op"] == 1
    reads = ("memory read (torch.mv)", "memory read (np.max)")
    for name in ("ort-cpu fp32 (ONNX)", "torch eager fp32", *reads, "bandwidth floor (weights)"):
        check_arm(talker["arms"][name], 3)
    for name in reads:
        assert talker["arms"][name]["unit"] == "GB/s" and talker["arms"][name]["better"] == "higher"
    assert talker["weight_bytes"] > 0 and talker["kv_cache_bytes_read"] > 0
    # each pass's floor: the weights at the faster read rate of that pass
    rates = zip(*(talker["arms"][name]["per_pass"] for name in reads))
    for floor_ms, pair in zip(talker["arms"]["bandwidth floor (weights)"]["per_pass"], rates):
        assert floor_ms == pytest.approx(talker["weight_bytes"] / (max(pair) * 1e9) * 1e3, rel=1e-3)
    assert talker["floor_meaningful"] is False          # the demo's weights fit in the caches
    orders = talker["pass_orders"]
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])       # rotated, all arms
    floor = next(r for r in talker["ratios"] if r["name"] == "talker step / floor: ort-cpu fp32 (ONNX)")
    assert floor["budget"] == "<= 1.25" and floor["ratio_of_medians"] > 0 and floor["per_pass"]["n"] == 3
    assert floor["verdict"] in ("met", "missed", "straddles the budget") and isinstance(floor["not_a_ranking"], bool)
    assert [b["name"] for b in d["budgets"]] == ["talker step / floor: ort-cpu fp32 (ONNX)"]
    c2w = d["cases"]["code2wav"]
    check_arm(c2w["arms"]["ort-cpu fp32 (ONNX)"], 3)
    assert c2w["inputs"]["codes"][0][2] == c2w["left_context"] + c2w["chunk_frames"]
    assert c2w["exports"]["ort"]["files"][0]["bytes"] > 0
    assert not any((tmp_path / "work").iterdir())          # scratch files and partial results removed


def test_runtime_predictor_case_step_path_against_fused_frame(tmp_path):
    proc, d = bench(tmp_path, "runtime", "--size", "tiny", "--cases", "predictor", "--runners=", *FAST_TIMING)
    assert proc.returncode == 0 and d["status"] == "ok", proc.stderr[-3000:]
    case = d["cases"]["predictor"]
    for name in ("torch eager fp32: prefill + 14 step calls", "torch eager fp32: 1 fused call"):
        check_arm(case["arms"][name], 3)
    agree = case["agreement"]["torch eager fp32"]
    assert agree["frames"] == 2 == len(agree["per_frame"]) and 0 <= agree["frames_equal"] <= 2
    assert all(r["embedding_max_abs_diff"] >= 0 for r in agree["per_frame"])
    ratio = next(r for r in case["ratios"] if r["name"] == "step path / fused frame: torch eager fp32")
    assert ratio["ratio_of_medians"] > 0 and "budget" not in ratio       # budgets are for exported graphs


def test_build_benchmark_records_manifest_timings_and_sizes(tmp_path):
    proc, d = bench(tmp_path, "build", "--size", "tiny", "--", "--components", "code2wav", "--left-context", "2",
                    "--chunk-frames", "2", "--precision", "fp16", "--formats", "onnx", "--no-attribution")
    assert proc.returncode == 0 and d["status"] == "ok", d["process"].get("stderr_tail")
    check_provenance(d)
    assert d["process"]["exit_code"] == 0 and d["process"]["wall_s"] > 0 and d["budget"] is None
    assert "--components" in d["process"]["command"] and "--json" in d["process"]["command"]
    m = d["manifest"]
    assert m["timings"]["total_s"] > 0 and m["components"]["code2wav"]["timings"]["trace_s"] > 0
    (b,) = m["builds"]
    # the ONNX build's own job copies its fp16 graph; the export and fp16 conversion are jobs of their own
    assert b["status"] == "accepted" and b["bytes"] > 0 and b["timings"]["lower_s"] >= 0 and b["timings"]["graph_s"] > 0
    assert m["artifact_bytes"]["accepted"] == b["bytes"] and m["toolchain"]["onnx"]
    assert d["cli_json"]["exit_code"] == 0 and d["disk_bytes"]
    stages = {s["stage"]: s for s in d["process"]["memory"]["stages"]}
    assert "code2wav: lower onnx fp16" in stages           # a job of its own: a copy of the fp16 graph, ~1 ms
    lower = stages["code2wav: export fp32 ONNX"]
    assert lower["wall_s"] > 0 and (lower["cores_busy"] is None or 0 <= lower["cores_busy"] <= d["process"]["cores"] + 0.5)
    # the scoring run of the one build: its runner, samples and seconds (runtime.pool's job line)
    jobs = d["process"]["memory"]["scoring_jobs"]
    assert set(jobs["by_runner"]) == {"ort-cpu"}
    ort = jobs["by_runner"]["ort-cpu"]
    assert ort["jobs"] == 1 and ort["samples"] == 2 and ort["failed"] == 0       # Code2Wav: 2 held-out chunks
    assert jobs["longest"][0]["model"] == "qwen3-tts-code2wav-fp16-s25-htp.onnx" and jobs["longest"][0]["ok"]
    # the second, identical run into the same --out: every build served by the cache
    r = d["rebuild"]
    assert r["exit_code"] == 0 and r["builds"] == 1 and r["from_cache"] == 1 and r["wall_s"] > 0
    assert r["budget_wall_s"] == 5 and r["wall_within"] == (r["wall_s"] <= 5)
    assert not any(s["stage"].startswith("code2wav: lower") for s in r["stages"])


def test_a_failing_build_is_recorded_with_its_exit_status_and_stderr(tmp_path):
    proc, d = bench(tmp_path, "build", "--size", "tiny", "--", "--components", "no_such_component")
    assert proc.returncode == 1 and d["status"] == "failed"
    assert d["process"]["exit_code"] == 2 and "no_such_component" in d["process"]["stderr_tail"]
    assert d["manifest"] is None


def test_a_build_that_would_fill_the_disk_is_not_started(tmp_path):
    """An earlier result of the same size says how much the build writes; less free space than that
    (+10 %) refuses to start, naming the figures, before any work; --no-disk-check overrides."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "build-tiny-20260101T000000Z-deadbeef.json").write_text(
        json.dumps({"status": "ok", "disk_bytes": {"a": 5}}))                # older: not the estimate
    (results / "build-tiny-20260102T000000Z-deadbeef.json").write_text(
        json.dumps({"status": "ok", "disk_bytes": {"artifacts": 1 << 62, "manifest.json": 10}}))
    (results / "build-tiny-20260103T000000Z-deadbeef.json").write_text(
        json.dumps({"status": "failed", "disk_bytes": {"a": 1 << 63}}))     # stopped: ignored beside a complete one
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, "benchmarks/run.py", "build", "--size", "tiny", "--results", str(results),
                           "--work", str(work)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not started" in proc.stderr and "build-tiny-20260102T000000Z-deadbeef.json" in proc.stderr
    assert "GB free under" in proc.stderr and "--no-disk-check" in proc.stderr
    fakes = set(results.iterdir())
    assert not work.exists() and len(fakes) == 3                             # nothing run, nothing written
    # --no-disk-check starts it anyway (a build that fails at once: started, and recorded as failed)
    proc = subprocess.run([sys.executable, "benchmarks/run.py", "build", "--size", "tiny", "--results", str(results),
                           "--work", str(work), "--no-disk-check", "--", "--components", "no_such_component"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "not started" not in proc.stderr, proc.stderr[-2000:]
    (failed,) = set(results.iterdir()) - fakes
    assert json.loads(failed.read_text())["status"] == "failed"
    failed.unlink()
    from benchmarks import build as bb

    assert bb.disk_needed(results, "tiny") == ((1 << 62) + 10, "build-tiny-20260102T000000Z-deadbeef.json")
    assert bb.disk_needed(results, "0.6b") is None
    (results / "build-tiny-20260102T000000Z-deadbeef.json").unlink()
    assert bb.disk_needed(results, "tiny") == (5, "build-tiny-20260101T000000Z-deadbeef.json")
    assert bb.disk_shortfall(work, results, "tiny") is None                  # 5 bytes fit
    (results / "build-tiny-20260101T000000Z-deadbeef.json").unlink()
    assert bb.disk_needed(results, "tiny") == (1 << 63, "build-tiny-20260103T000000Z-deadbeef.json")


def _arm(name: str, per_pass: list) -> tm.Arm:
    arm = tm.Arm(name, None)
    arm.per_pass = per_pass
    return arm


def test_ratios_flag_overlapping_spreads_and_judge_budgets_per_pass():
    slow, fast = _arm("step", [3.0, 3.2, 2.9]), _arm("fused", [1.0, 1.1, 1.05])
    r = tm.ratio("x", slow, fast, "", (">=", 1.5))
    assert r["not_a_ranking"] is False and r["verdict"] == "met" and r["per_pass"]["n"] == 3
    assert r["ratio_of_medians"] == pytest.approx(3.0 / 1.05, rel=1e-4)
    close = tm.ratio("y", _arm("a", [1.0, 1.4, 1.2]), _arm("b", [1.1, 0.9, 1.0]), "", (">=", 1.25))
    assert close["not_a_ranking"] is True and close["verdict"] == "straddles the budget"
    under = tm.ratio("z", fast, slow, "", ("<=", 1.25))
    assert under["verdict"] == "met" and tm.ratio("w", slow, fast, "", ("<=", 1.25))["verdict"] == "missed"


def test_a_failed_pass_is_kept_and_makes_the_arm_unquotable():
    calls = []

    def flaky(i):
        calls.append(i)
        if len(calls) == 3:
            raise RuntimeError("boom")

    a, b = tm.Arm("a", flaky), tm.Arm("b", lambda i: None)
    tm.warm(a, 1, 0.0, 1)
    tm.warm(b, 1, 0.0, 1)
    orders = tm.run_passes([a, b], 3, 2)
    assert orders == [["a", "b"], ["b", "a"], ["a", "b"]]
    ja = tm.arm_json(a)
    assert ja["failed_passes"] == 1 and not ja["quotable"] and "boom" in ja["errors"][0]["error"]
    assert ja["per_pass"].count(None) == 1 and ja["n"] == 2
    assert tm.ratio("r", a, b, "")["quotable"] is False


def test_random_weight_checkpoints_carry_a_tokenizer(tmp_path):
    """The benchmarks' --random-weights builds capture real inputs from the recipe's prompts, which
    need a tokenizer; the real-shape writer (here at the tiny geometry) must write one."""
    from omni_export.recipes.qwen3_tts import demo
    from omni_export.text_tokenizer import load

    cfg = demo.geometry("tiny")
    demo.write_talker(tmp_path, cfg, 0, {}, real_size=True)
    ids = load(tmp_path).encode("<|im_start|>assistant\nHello<|im_end|>\n")
    assert ids and max(ids) < cfg.talker.text_vocab_size


def test_tree_sampler_counts_children_and_copy_on_write_pages_once_in_pss(tmp_path):
    """A parent touches 400 MiB and forks: the RssAnon sum counts the shared pages twice, the
    Pss_Anon sum once. The child also shows up in the sampled tree."""
    from benchmarks import proctree

    script = ("import os, time\n"
              "a = bytearray(400 * 2**20)\n"
              "for i in range(0, len(a), 4096): a[i] = 1\n"
              "pid = os.fork()\n"
              "time.sleep(1.5)\n"
              "os._exit(0) if pid == 0 else os.waitpid(pid, 0)\n")
    mon = proctree.run_monitored([sys.executable, "-c", script], cwd=tmp_path, env=None, logdir=tmp_path / "logs",
                                 interval=0.1)
    mem = mon.memory
    assert mon.exit_code == 0 and mem["max_processes_in_tree"] == 2
    assert mem["peak_rss_anon_bytes"] > 1.9 * 400 * 2**20
    assert 400 * 2**20 < mem["peak_pss_anon_bytes"] < 1.2 * 400 * 2**20


def test_stage_peaks_name_the_processes_holding_each_stage_peak(tmp_path):
    """A stage's peak is broken down by process: the parent holds 300 MiB throughout and a child
    it starts during the stage "child" 200 MiB more; during "alone" only the parent is listed."""
    from benchmarks import proctree

    log = tmp_path / "logs" / "stages.jsonl"          # run_monitored reads the stage log from its logdir
    child = "b = bytearray(200 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\nimport time; time.sleep(1.5)"
    script = ("import json, subprocess, sys, time\n"
              "def ev(e, s): open(%r, 'a').write(json.dumps({'t': time.time(), 'event': e, 'stage': s}) + '\\n')\n"
              "a = bytearray(300 * 2**20)\n"
              "for i in range(0, len(a), 4096): a[i] = 1\n"
              "ev('start', 'alone'); time.sleep(0.8); ev('end', 'alone')\n"
              "ev('start', 'child'); subprocess.run([sys.executable, '-c', %r]); ev('end', 'child')\n") % (str(log), child)
    mon = proctree.run_monitored([sys.executable, "-c", script], cwd=tmp_path, env=None, logdir=tmp_path / "logs",
                                 interval=0.1)
    assert mon.exit_code == 0, mon.stderr
    stages = {r["stage"]: r for r in mon.memory["stages"]}
    alone, both = stages["alone"]["peak_processes"], stages["child"]["peak_processes"]
    assert [p["role"] for p in alone] == ["build process"] and 0.29 < alone[0]["rss_anon_gib"] < 0.4
    assert len(both) == 2 and both[0]["role"] == "build process" and both[0]["pid"] == alone[0]["pid"]
    assert "-c" in both[1]["role"] and 0.19 < both[1]["rss_anon_gib"] < 0.3
    assert stages["child"]["peak_rss_anon_gib"] >= both[0]["rss_anon_gib"] + both[1]["rss_anon_gib"] - 0.001


def test_cpu_is_attributed_to_the_roles_the_build_children_mark(tmp_path):
    """A child that names itself in the stage log (runtime.pool.mark_process, as the build's scoring
    workers and compile children do) gets its CPU and its share of a stage peak under that role;
    the parent's CPU stays with the build process."""
    import os

    from benchmarks import proctree

    log = tmp_path / "logs" / "stages.jsonl"
    child = ("from omni_export.runtime.pool import mark_process\n"
             "mark_process('QNN context-binary compile child')\n"
             "b = bytearray(200 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
             "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.2: pass\n")
    script = ("import json, subprocess, sys, time\n"
              "def ev(e, s): open(%r, 'a').write(json.dumps({'t': time.time(), 'event': e, 'stage': s}) + '\\n')\n"
              "ev('start', 'compile'); subprocess.run([sys.executable, '-c', %r]); ev('end', 'compile')\n") % (str(log), child)
    env = dict(os.environ, OMNI_EXPORT_STAGE_LOG=str(log), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    mon = proctree.run_monitored([sys.executable, "-c", script], cwd=tmp_path, env=env, logdir=tmp_path / "logs",
                                 interval=0.1)
    assert mon.exit_code == 0, mon.stderr
    roles = mon.memory["cpu_by_role"]
    assert roles["QNN context-binary compile child"]["processes"] == 1
    assert roles["QNN context-binary compile child"]["cpu_s"] >= 1.0
    assert roles["build process"]["cpu_s"] < roles["QNN context-binary compile child"]["cpu_s"]
    held = {p["role"] for p in {r["stage"]: r for r in mon.memory["stages"]}["compile"]["peak_processes"]}
    assert "QNN context-binary compile child" in held
