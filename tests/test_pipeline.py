"""End to end through the CLI on tiny checkpoints: every format, the gate, the output directory."""
import json
from pathlib import Path

import pytest

from breakage import constant_codes, outlier_activation_channel, outlier_input_channel
from conftest import FAST, GEOMETRY, GOLDEN, builds_by, read_manifest, run_cli
from omni_export.artifacts.store import FILE_MODE, sha256_file
from omni_export.recipes.qwen3_tts import checkpoint as ck

SCHEMA = Path(__file__).resolve().parents[1] / "omni_export" / "schemas" / "manifest.schema.json"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The default command on the embedded demo checkpoint, Code2Wav only (fast streaming geometry);
    the other components have their own run in test_qwen3_tts_build.py."""
    out = tmp_path_factory.mktemp("demo") / "out"
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--out", str(out), "--components", "code2wav", *FAST,
                   "--summary-to", str(out.parent / "summary.md"), fresh=True)   # a new interpreter: its chatter is tested
    return proc, out


def test_demo_run_builds_every_format_at_fp16_and_w8a16(demo_run):
    proc, out = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = builds_by(read_manifest(out))
    assert set(b) == {("code2wav", f, p) for f in ("onnx", "dlc", "ctx", "pte") for p in ("fp16", "w8a16")}
    for fmt in ("dlc", "ctx"):
        fp16 = b[("code2wav", fmt, "fp16")]
        assert fp16["status"] == "accepted"
        assert fp16["parity"]["runner"]["kind"] == "qnn-htp"
        assert fp16["parity"]["runner"]["options"]["soc_model"] == "69"
        assert fp16["parity"]["outputs"][0]["snr_db"] >= 40
    # the context binary is lowered first and runs on the simulator; its DLC sibling (the same QNN
    # graph) shares those outputs instead of compiling the source again
    dlc, ctx = b[("code2wav", "dlc", "fp16")], b[("code2wav", "ctx", "fp16")]
    assert dlc["outputs_from"] == "ctx" and "outputs_from" not in ctx
    assert dlc["parity"]["outputs"] == ctx["parity"]["outputs"]


def test_manifest_validates_against_its_schema(demo_run):
    import jsonschema

    _, out = demo_run
    jsonschema.validate(read_manifest(out), json.loads(SCHEMA.read_text()))


def test_every_listed_file_exists_with_its_hash_and_rejected_ones_are_apart(demo_run):
    _, out = demo_run
    m = read_manifest(out)
    for b in m["builds"]:
        for f in b["files"]:
            p = out / f["path"]
            assert p.exists() and sha256_file(p) == f["sha256"] and p.stat().st_size == f["bytes"]
            assert p.stat().st_mode & 0o777 == FILE_MODE, (f["path"], oct(p.stat().st_mode))   # QNN's DLC was 0640
            assert f["path"].startswith("rejected/") == (b["status"] == "rejected")
    assert not (out / ".incomplete").exists() and not (out / ".staging").exists()


def test_verify_finds_the_demo_build_clean(demo_run):
    """Every format, rejected builds, attribution and the demo checkpoint inside OUT: nothing unlisted."""
    _, out = demo_run
    proc = run_cli("verify", str(out))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.strip().endswith("listed files and 3 reports checked; clean")


def test_demo_is_labelled_everywhere(demo_run):
    proc, out = demo_run
    assert read_manifest(out)["checkpoint"]["label"] == "demo, random weights"
    assert "demo, random weights" in (out / "report.md").read_text()
    assert json.loads((out / "parity.json").read_text())["checkpoint"]["label"] == "demo, random weights"
    assert "demo, random weights" in proc.stdout


def test_provenance_and_calibration_are_recorded(demo_run):
    _, out = demo_run
    m = read_manifest(out)
    tc = m["toolchain"]
    assert tc["torch"].startswith("2.13.0") and tc["executorch"] == "1.5.1" and tc["onnxruntime-qnn"] == "2.7.0"
    assert tc["qnn"] == "2.51.0"
    comp = m["components"]["code2wav"]
    assert comp["calibration"]["count"] >= 4 and len(comp["calibration"]["sha256"]) == 64
    assert comp["heldout"]["sha256"] != comp["calibration"]["sha256"]
    assert all(len(w["sha256"]) == 64 for w in m["checkpoint"]["weights"])
    q = builds_by(m)[("code2wav", "onnx", "w8a16")]
    assert q["details"]["calibration_samples"] == comp["calibration"]["count"]


def test_attribution_scores_every_block_of_the_rejected_precision(demo_run):
    """Default --attribution auto: the blocks of a precision with a rejected build are lowered alone
    and scored -- on ORT CPU when that precision's ONNX build scored low there, else on the
    simulator; a precision whose builds all pass is not re-examined."""
    _, out = demo_run
    m = read_manifest(out)
    att = m["components"]["code2wav"]["attribution"]
    rejected = {b["precision"] for b in m["builds"] if b["status"] == "rejected" and b["format"] != "pte"}
    assert set(att) == rejected and "w8a16" in rejected
    names = [r["block"] for r in att["w8a16"]]
    assert names[0] == "rvq" and names[-1] == "decoder.out" and "pre_transformer" in names
    assert all(r["snr_db"] is not None for r in att["w8a16"])
    for prec, rows in att.items():
        mine = [b for b in m["builds"] if b["component"] == "code2wav" and b["precision"] == prec]
        onnx_low = any(b["format"] == "onnx" and b["status"] == "rejected" and not b.get("error") for b in mine)
        want = "ONNX Runtime CPU" if onnx_low and not any(b.get("error") for b in mine) else "HTP simulator"
        assert all(want in r["runner"] for r in rows), (prec, [(b["format"], b["status"]) for b in mine])


def test_a_components_job_graph_shares_intermediate_graphs_and_the_context_binarys_run(tmp_path):
    """One fp32 export, one fp16 conversion and one quantization per precision feed every format; the .pte
    lowers from the trace; a DLC's score is its context binary's run (the same QNN graph)."""
    from omni_export.core import BuildSpec, Format, Precision
    from omni_export.jobs.component import ComponentJobs
    from omni_export.jobs.graph import JobGraph
    from omni_export.pipeline import RunOptions
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    class Run:
        opts = RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), tmp_path)
        store = type("S", (), {"root": tmp_path})()

        def gate(self, component, precision):
            return 40.0

    builds = [BuildSpec("qwen3-tts", "code2wav", f, p, "s25-htp") for p in (Precision.FP16, Precision.W8A16)
              for f in (Format.ONNX, Format.DLC, Format.CTX, Format.PTE)]
    g = JobGraph()
    ComponentJobs(Run(), "code2wav", builds, g).plan()
    deps = {i: j.deps for i, j in g.jobs.items()}
    assert deps["code2wav/export"] == ("code2wav/trace",)
    assert deps["code2wav/fp16"] == ("code2wav/export",) and deps["code2wav/quantize/w8a16"] == ("code2wav/export",)
    for f in ("onnx", "dlc", "ctx"):
        assert deps[f"code2wav/lower/{f}/fp16"] == ("code2wav/fp16",)
        assert deps[f"code2wav/lower/{f}/w8a16"] == ("code2wav/quantize/w8a16",)
    assert deps["code2wav/lower/pte/w8a16"] == ("code2wav/trace",)
    for p in ("fp16", "w8a16"):
        assert deps[f"code2wav/score/dlc/{p}"] == (f"code2wav/lower/dlc/{p}", f"code2wav/score/ctx/{p}")
        assert g.jobs[f"code2wav/score/dlc/{p}"].kind == "score-shared"
        # the simulator's run waits for ORT's: past 256 MB it scores the samples ORT scored worst
        assert deps[f"code2wav/score/ctx/{p}"] == (f"code2wav/lower/ctx/{p}", f"code2wav/score/onnx/{p}")
    assert sum(j.where == "driver" for j in g.jobs.values() if j.kind != "score-shared") == 1    # the trace
    assert g.critical_path()[1][0] == "code2wav/trace"


def test_a_dlc_still_waiting_for_its_compile_when_its_context_binary_fails_is_rejected_not_a_crash(tmp_path):
    """At 0.6B the context binary of a precision failed to compile while its DLC was still waiting to
    be compiled; the DLC's shared score, failed in turn, found no lowering result and the build ended
    in an AttributeError traceback. It is a rejected build that says why."""
    from omni_export.core import BuildSpec, Format, Precision
    from omni_export.jobs.component import ComponentJobs
    from omni_export.jobs.errors import UpstreamFailed
    from omni_export.jobs.graph import JobGraph
    from omni_export.pipeline import RunOptions
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    lines = []

    class Run:
        opts = RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), tmp_path)
        store = type("S", (), {"root": tmp_path})()
        progress = type("P", (), {"job_finished": lambda self, label, note: lines.append((label, note.text))})()

        def gate(self, component, precision):
            return 40.0

    builds = [BuildSpec("qwen3-tts", "code2wav", f, Precision.W8A16, "s25-htp") for f in (Format.DLC, Format.CTX)]
    g = JobGraph()
    cj = ComponentJobs(Run(), "code2wav", builds, g)
    cj.plan()
    job = g.jobs["code2wav/score/dlc/w8a16"]
    assert g.jobs["code2wav/lower/dlc/w8a16"].result is None          # its own compile has not run
    job.state, job.error = "failed", UpstreamFailed("code2wav/score/ctx/w8a16 failed: QNN compile failed")
    job.started = job.ended = 1.0
    job.done(job)
    e = cj.entries[0]
    assert e["status"] == "rejected" and e["files"] == []
    assert e["error"] == e["parity"]["reason"] and "QNN compile failed" in e["error"]
    assert lines and "QNN compile failed" in lines[-1][1]


def test_a_simulator_run_of_a_context_binary_reserves_less_than_one_compiling_its_source():
    from omni_export.memory import step_bytes
    from omni_export.runtime.runners import RunnerSpec
    from omni_export.jobs.component import _step_kind

    ctx = RunnerSpec("qnn-htp", "/b/m-fp16.ctx.onnx", ("x",), ("y",))
    src = RunnerSpec("qnn-htp", "/w/fp32.onnx", ("x",), ("y",))
    assert (_step_kind(ctx), _step_kind(src)) == ("qnn-htp-ctx", "qnn-htp")
    assert step_bytes(_step_kind(ctx), 10**9) < step_bytes(_step_kind(src), 10**9)
    assert _step_kind(RunnerSpec("ort-cpu", "/b/m.onnx", ("x",), ("y",))) == "ort-cpu"


def test_attribution_runs_on_cpu_only_when_the_onnx_build_scored_low_there_and_nothing_failed():
    from omni_export.core import Precision
    from omni_export.jobs.component import _scored_low_on_cpu

    def e(fmt, status, error=None, prec="w8a16"):
        return {"format": fmt, "precision": prec, "status": status, **({"error": error} if error else {})}

    w = Precision.W8A16
    assert _scored_low_on_cpu([e("onnx", "rejected"), e("dlc", "rejected"), e("ctx", "accepted")], w)
    assert not _scored_low_on_cpu([e("onnx", "accepted"), e("dlc", "rejected")], w)       # an HTP-only loss
    assert not _scored_low_on_cpu([e("onnx", "rejected", "lowering failed: x")], w)      # never scored
    assert not _scored_low_on_cpu([e("onnx", "rejected"), e("ctx", "rejected", "lowering failed: MEM")], w)
    assert not _scored_low_on_cpu([e("onnx", "rejected", prec="fp16")], w)


def test_a_located_compile_failure_keeps_only_its_block_on_the_target_and_ranks_the_rest_on_cpu():
    """Code2Wav w8a16 at 0.6B: ONNX scored low on ORT, the context binary failed to finalize with the
    last block as the likely node: ORT CPU ranks the blocks, that block alone is lowered on the HTP."""
    from omni_export.core import Precision
    from omni_export.jobs.component import _located_failures

    def e(fmt, status, error=None, diagnosis=None, prec="w8a16"):
        return {"format": fmt, "precision": prec, "status": status, **({"error": error} if error else {}),
                **({"diagnosis": diagnosis} if diagnosis else {})}

    w = Precision.W8A16
    low = e("onnx", "rejected")
    mem = e("ctx", "rejected", "lowering failed: MEM", {"node": "up", "likely": True, "likely_block": "blocks.6"})
    named = e("dlc", "rejected", "lowering failed: Det", {"node": "d", "block": "blocks.2"})
    assert _located_failures([low, mem], w) == ("blocks.6",)
    assert _located_failures([low, mem, named], w) == ("blocks.2", "blocks.6")
    # the DLC scored by the failed context binary's run fails with it, without a diagnosis of its own
    shared = e("dlc", "rejected", "runner failed: code2wav/score/ctx/w8a16 failed: MEM")
    assert _located_failures([low, mem, shared], w) == ("blocks.6",)
    assert _located_failures([low, shared], w) is None
    assert _located_failures([low, e("ctx", "rejected", "lowering failed: x")], w) is None      # not located
    assert _located_failures([e("onnx", "accepted"), mem], w) is None        # no loss on ORT to rank by
    assert _located_failures([low, e("ctx", "rejected")], w) is None         # nothing failed
    assert _located_failures([low, mem], Precision.W8A8) is None


def test_rejected_reasons_name_the_weakest_block(demo_run):
    _, out = demo_run
    for b in read_manifest(out)["builds"]:
        if b["status"] == "rejected":
            assert "weakest block" in b["parity"]["reason"]


def test_report_lists_every_build_and_rejection(demo_run):
    _, out = demo_run
    text = (out / "report.md").read_text()
    m = read_manifest(out)
    assert text.count("| code2wav |") == len(m["builds"])
    for b in m["builds"]:
        if b["status"] == "rejected":
            assert b["name"] in text


# ---------------------------------------------------------------------------- breakage and the gate

def _verdicts(out):
    return {(b["format"], b["precision"]): b for b in read_manifest(out)["builds"]}


GATED = 20.0       # the w8a16 gate of the breakage runs


def _gated_run(tmp, ckpt, *extra, env=None):
    out = tmp / "out"
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--checkpoint", str(ckpt), "--out", str(out),
                   "--precision", "w8a16", "--formats", "onnx,ctx", "--gate", f"w8a16={GATED:g}",
                   "--no-attribution", *FAST, *extra, env=env)
    return proc, _verdicts(out)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, demo_run):
    """The demo run's own checkpoint (copied: tests may not change the demo run's files)."""
    import shutil

    dst = tmp_path_factory.mktemp("clean") / "ckpt"
    shutil.copytree(demo_run[1] / "demo-checkpoint", dst)
    return dst


@pytest.fixture(scope="module")
def iid(tmp_path_factory):
    """Seed 0 with i.i.d. heads (the demo's are tied to embedding rows): the calibration tests' figures."""
    return ck.write_checkpoint(tmp_path_factory.mktemp("iid") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def clean_run(demo_run):
    """The control: the demo run built Code2Wav from this checkpoint at w8a16 on the same geometry,
    onnx and ctx among its formats, with every build scored; only its gate (30 dB) differs from the
    breakage runs' (--gate w8a16=20). Its scores are the clean figures they are measured against."""
    proc, out = demo_run
    return proc, _verdicts(out)


def test_control_the_clean_int8_build_passes_the_same_gate(demo_run, clean_run, clean):
    proc, v = clean_run
    assert proc.returncode == 0
    recorded = {w["path"]: w["sha256"] for w in read_manifest(demo_run[1])["checkpoint"]["weights"]}
    assert recorded == {p: sha256_file(clean / p) for p in recorded}      # the breakage runs' source
    for fmt in ("onnx", "ctx"):
        snr = v[(fmt, "w8a16")]["parity"]["outputs"][0]["snr_db"]
        assert snr >= GATED, f"{fmt} w8a16 {snr} dB: the clean build would be rejected at the breakage gate"


def test_precision_repair_keeps_the_broken_block_in_float_and_the_result_passes(tmp_path, clean, clean_run):
    """The outlier input channel scales a row of the RVQ output projections down and pre_conv's weights
    reading it up: each block's int8 rounding loses it, and the gate rejects the w8a16 builds (15 dB
    and more under the clean build's score, moved under rejected/). Repair (jobs/repair.py) ranks
    the blocks by whole-graph sensitivity (pre_conv, then rvq: the block-alone attribution would have
    put rvq last, its loss being tiny until pre_conv amplifies it), keeps exactly those two in float,
    and the w8a16-mixed builds pass the gate the w8a16 ones failed, on the same runners, most weight
    bytes still quantized. The rejected w8a16 builds stay as they were (`--repair off`: the test below).

    Here the HTP simulator also crashes (faults.HTP_CRASH_ENV: SIGSEGV) on every w8a16-mixed graph QNN's
    fast graph preparation (--htp-optimization 1) compiles, as QNN 2.51 did on a 0.6B Code2Wav repair
    step: step 1 runs again at --htp-optimization 2, and so do step 2 and the repaired builds."""
    from omni_export.faults import HTP_CRASH_ENV

    broken = outlier_input_channel(clean, tmp_path / "outlier")
    # worker processes (the suite's default --jobs 1 runs jobs in the build process, which a crash ends)
    proc, v = _gated_run(tmp_path, broken, "--repair", "auto", env={HTP_CRASH_ENV: "w8a16-mixed.", "OMNI_EXPORT_JOBS": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(tmp_path / "out")
    search = m["components"]["code2wav"]["repair"]["w8a16"]
    assert search["htp_optimization_why"].startswith("step 1 crashed the HTP simulator at --htp-optimization 1 (WorkerDied")
    assert [s.get("htp_optimization") for s in search["steps"]] == ["2", "2"] and m["jobs"]["reran"] >= 1
    assert "the step runs again at --htp-optimization 2" in proc.stderr
    assert v[("ctx", "w8a16-mixed")]["details"]["htp_graph_finalization"] == "2"
    assert v[("ctx", "w8a16")]["details"]["htp_graph_finalization"] == "1"
    assert "its steps compiled at --htp-optimization 2: step 1 crashed the HTP simulator" in \
        (tmp_path / "out" / "report.md").read_text()
    assert search["order"][:2] == ["pre_conv", "rvq"] and search["runner"] == "qnn-htp"
    assert search["ranked_by"] == "sensitivity"
    assert search["result"]["kept_float"] == ["pre_conv", "rvq"] and search["result"]["precision"] == "w8a16-mixed"
    assert [s["verdict"] for s in search["steps"]] == ["rejected", "accepted"]
    bits = search["steps"][-1]["weight_bits"]       # the RVQ's codebooks kept in float (fp16) are most of the bytes here
    assert search["result"]["integer_share"] == pytest.approx(bits["8"] + bits["16"], abs=1e-3) and bits["fp16"] > 0.5
    for fmt in ("onnx", "ctx"):
        bad = v[(fmt, "w8a16")]
        assert bad["status"] == "rejected" and bad["files"][0]["path"].startswith("rejected/")
        good = clean_run[1][(fmt, "w8a16")]["parity"]["outputs"][0]["snr_db"]
        assert bad["parity"]["outputs"][0]["snr_db"] < good - 15
        mixed = v[(fmt, "w8a16-mixed")]
        assert mixed["status"] == "accepted" and mixed["parity"]["outputs"][0]["snr_db"] >= GATED
        assert mixed["repair"] == {"from": "w8a16", "kept_float": ["pre_conv", "rvq"],
                                   "integer_share": search["result"]["integer_share"],
                                   "base_share": search["result"]["base_share"]}
        assert mixed["repair"]["base_share"] == pytest.approx(bits["8"], abs=1e-3)
        assert not mixed["files"][0]["path"].startswith("rejected/")
        assert "fp16" in mixed["details"]["weight_bits"] and "fp16" not in v[(fmt, "w8a16")]["details"]["weight_bits"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("Precision repair: code2wav w8a16 rejected → **w8a16-mixed** accepted at step 2: pre_conv, rvq kept "
            "in float") in report


def test_outlier_activation_channel_breaks_int8_and_the_gate_rejects_it(tmp_path, clean, clean_run):
    broken = outlier_activation_channel(clean, tmp_path / "act-outlier")
    proc, v = _gated_run(tmp_path, broken, "--repair", "off")
    assert proc.returncode == 3
    assert "repair" not in read_manifest(tmp_path / "out")["components"]["code2wav"]
    assert {p for _, p in v} == {"w8a16"}                       # nothing repaired
    for fmt in ("onnx", "ctx"):
        assert v[(fmt, "w8a16")]["status"] == "rejected"
        good = clean_run[1][(fmt, "w8a16")]["parity"]["outputs"][0]["snr_db"]
        assert v[(fmt, "w8a16")]["parity"]["outputs"][0]["snr_db"] < good - 6


def test_a_wrong_distribution_calibration_set_is_used_recorded_and_scored(tmp_path, iid):
    """One code repeated in every frame. With 16-bit activation headroom (exporters/onnx.py) the
    seed-0 checkpoint's Code2Wav loses under a dB to it (24.2 vs 24.3 dB on ORT at 44e7e21; on the
    demo's decisive heads 19.9 dB): the gate judges what the build measures on held-out real codes,
    and here it measures fine."""
    codes = constant_codes(tmp_path / "codes.npy")
    out = tmp_path / "out"
    run_cli("qwen3-tts", "--checkpoint", str(iid), "--out", str(out), "--precision", "w8a16", "--formats", "onnx",
            "--gate", f"w8a16={GATED:g}", "--no-attribution", *FAST, "--calibration-codes", str(codes), check=True)
    m = read_manifest(out)
    assert m["components"]["code2wav"]["calibration"]["source"].startswith("user codes")
    assert m["components"]["code2wav"]["calibration"]["count"] >= 4
    [b] = m["builds"]
    assert b["parity"]["outputs"][0]["snr_db"] is not None and b["details"]["calibration_samples"] >= 4


def test_exit_code_3_when_a_component_has_no_accepted_build(tmp_path, iid):
    proc = run_cli("qwen3-tts", "--checkpoint", str(iid), "--out", str(tmp_path / "o"), "--precision", "w8a16",
                   "--components", "code2wav", "--formats", "onnx", "--gate", "w8a16=90", "--no-attribution", "--json", "-q", *FAST)
    assert proc.returncode == 3
    summary = json.loads(proc.stdout)
    assert summary["summary"]["components_without_accepted_build"] == ["code2wav"]


def test_a_checkpoint_saved_by_upstream_works_unchanged(tmp_path):
    """Configs as upstream's save_pretrained wrote them (tests/golden), weights from the seed they
    were made with (upstream loaded them strictly and saved them back unchanged: meta.json)."""
    import shutil

    src = ck.write_checkpoint(tmp_path / "weights", seed=11)
    up = tmp_path / "upstream"
    shutil.copytree(GOLDEN / "qwen3_tts" / "upstream_saved", up, ignore=shutil.ignore_patterns("tensors.json"))
    for rel in ("model.safetensors", "speech_tokenizer/model.safetensors", "vocab.json", "merges.txt",
                "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / rel, up / rel)
    # upstream's config class kept our demo marker as an unknown key and saved it back; a user's
    # checkpoint has no such key, so drop it (nothing else in the saved config is touched)
    cfg = json.loads((up / "config.json").read_text())
    assert cfg.pop(ck.DEMO_MARKER, None) is not None
    (up / "config.json").write_text(json.dumps(cfg, indent=2))
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--checkpoint", str(up), "--out", str(tmp_path / "o"),
                   "--formats", "onnx", "--precision", "fp16", "--components", "talker_decode,code2wav",
                   "--no-attribution", "--json", "-q", *GEOMETRY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["exit_code"] == 0                 # stdout: the JSON alone
    assert "plan: " not in proc.stderr and "ETA " not in proc.stderr  # -q: no progress
    m = read_manifest(tmp_path / "o")
    assert m["checkpoint"]["label"] == "user checkpoint" and not m["checkpoint"]["demo"]
    meta = json.loads((GOLDEN / "qwen3_tts" / "meta.json").read_text())["upstream_saved"]
    assert meta["talker_tensors_equal_ours"] and meta["decoder_tensors_equal_ours"]
    assert meta["omni_export_run"]["exit_code"] == 0


# ------------------------------------------------------------------------------------------ reports

def test_parity_json_of_the_demo_validates_against_its_schema(demo_run):
    import jsonschema

    _, out = demo_run
    schema = json.loads((SCHEMA.parent / "parity.schema.json").read_text())
    doc = json.loads((out / "parity.json").read_text())
    jsonschema.validate(doc, schema)
    assert {b["key"] for b in doc["builds"]} == {f"code2wav/{b[1]}/{b[2]}" for b in builds_by(read_manifest(out))}


def test_demo_summary_fits_one_screen_and_names_each_rejection(demo_run):
    _, out = demo_run
    text = (out / "report.md").read_text()
    assert len(text.splitlines()) <= 40
    for b in read_manifest(out)["builds"]:
        if b["status"] == "rejected":
            assert f"`code2wav/{b['format']}/{b['precision']}`" in text and b["parity"]["reason"] in text


def test_the_demo_progress_carries_no_library_chatter(demo_run):
    """torchao's CUDA-kernel load failures, torch's pytree deprecation and ExecuTorch's Arm CPU probe
    (omni_export/quiet.py) printed between the demo's progress lines; the .pte builds ran all three."""
    proc, _ = demo_run
    assert "lower pte w8a16" in proc.stderr and "score pte fp16 on executorch" in proc.stderr
    for chatter in ("cpuinfo_utils.cpp", "Failed to load", "KernelPreference", "register_constant"):
        assert chatter not in proc.stderr, chatter


def test_the_build_prints_its_plan_and_a_first_eta_before_any_job_ends(demo_run):
    """The plan (builds as components x formats x precisions, jobs per kind, scoring runs per runner)
    and an ETA come before the first job's line; the ETA is refined as jobs end; the manifest keeps
    the first ETA against the wall; the cost model (jobs/eta.py) holds this run's job seconds."""
    import os
    import re
    from collections import Counter

    proc, out = demo_run
    lines = proc.stderr.splitlines()
    m = read_manifest(out)
    first_job = next(i for i, ln in enumerate(lines) if ln.startswith(("✓", "✗")) and ": trace " in ln)
    head = lines[:first_job]
    b = re.search(r"^plan: (\d+) builds of (\d+) components x (\d+) formats \(([a-z, ]+)\) x (\d+) precisions "
                  r"\(([a-z0-9, ]+)\)", "\n".join(head), re.M)
    assert b, head
    assert int(b[1]) == len(m["builds"]) and int(b[2]) == len({x["component"] for x in m["builds"]})
    assert b[4].split(", ") == list(dict.fromkeys(x["format"] for x in m["builds"]))
    assert b[6].split(", ") == list(dict.fromkeys(x["precision"] for x in m["builds"]))
    j = re.search(r"^plan: (\d+) jobs on (\d+) workers? \((\w+)\): (.*)$", "\n".join(head), re.M)
    kinds = {k: int(n) for n, k in (x.split(" ") for x in j[4].split(", "))}
    graph = m["jobs"]["graph"]
    assert sum(kinds.values()) == int(j[1]) and int(j[2]) == m["jobs"]["workers"]
    later = Counter(r["kind"] for r in graph) - Counter(kinds)       # planned once under way: rows, attribution
    assert set(later) <= {"e2e", "attribute"} and later["e2e"] >= 1, later
    runs = re.search(r"^plan: (\d+) scoring runs: (.*?)(;|$)", "\n".join(head), re.M)
    per = {r: int(n) for n, r in re.findall(r"(\d+) on (\w+) \(", runs[2])}
    fmt = Counter(x["format"] for x in m["builds"])
    expected = {"ort": fmt["onnx"], "htp": fmt["ctx"], "pte": fmt["pte"]}
    assert per == {k: n for k, n in expected.items() if n} and int(runs[1]) == sum(per.values())
    etas = [ln for ln in lines if re.match(r"^ETA (\d+h)?(\d+m)?\d+s, about \d\d:\d\d:\d\d: \d+/\d+ jobs done", ln)]
    assert etas and etas[0] in head, head
    assert re.search(r"^jobs ended after \S+; the first ETA said \S+ \([+-]\d+ %\)$", proc.stderr, re.M)
    eta = m["timings"]["eta"]
    assert eta["first_s"] > 0 and eta["jobs_wall_s"] > 0 and eta["first_said_at_s"] is not None
    costs = json.loads((Path(os.environ["OMNI_EXPORT_CACHE_DIR"]) / "costs.json").read_text())
    kept = {k.split(" (")[0].split(" @")[0] for k in costs["jobs"]}     # e2e rows: "<id> @<build signature>"
    assert {r["id"].split(" (")[0] for r in graph if r["state"] == "done"} <= kept
    assert any(k.startswith("end-to-end/") and " @" in k for k in costs["jobs"]), sorted(costs["jobs"])


def test_each_score_line_says_the_builds_verdict(demo_run):
    """The progress line of a scoring stage ends with what the gate found (the lowest gated SNR of an
    accepted build, the reason of a rejected one, marked ✗) and the scoring job's own seconds, not the
    wait for it; the same figures as the manifest."""
    proc, out = demo_run
    lines = [ln for ln in proc.stderr.splitlines() if ": score " in ln and ln.startswith(("✓", "✗"))]
    builds = read_manifest(out)["builds"]
    assert len(lines) == len(builds) and any(b["status"] == "rejected" for b in builds)
    for b in builds:
        head = f"code2wav: score {b['format']} {b['precision']} on "
        line = next(ln for ln in lines if head in ln)
        if b["status"] == "accepted":
            worst = min(o["snr_db"] for o in b["parity"]["outputs"] if o["snr_db"] is not None)
            assert line.startswith("✓") and f"{worst:.1f} dB, accepted" in line, line
        else:
            said = line.split("rejected: ", 1)[1].rsplit(" (ran ", 1)[0].split(" — shares ")[0]
            # the manifest's reason may go on with what per-block attribution found later
            assert line.startswith("✗") and b["parity"]["reason"].startswith(said) and " dB < gate " in said, line
        assert "(ran " in line, line


def test_summary_to_appends_the_report_for_the_ci_job_summary(demo_run):
    _, out = demo_run
    text = (out.parent / "summary.md").read_text()
    assert text.strip() == (out / "report.md").read_text().strip()
    assert (out / "report.html").stat().st_size > 0


def test_kept_fp32_clip_is_the_model_output_on_the_last_heldout_input(demo_run):
    import numpy as np
    import torch

    from omni_export.artifacts.samples import read_wav
    from omni_export.recipes.qwen3_tts.model import load

    _, out = demo_run
    [rec] = read_manifest(out)["components"]["code2wav"]["samples"]
    model = load(out / "demo-checkpoint", {"left-context": 2, "chunk-frames": 2, "calibration-codes": None}, out)
    graph = model.graph("code2wav")
    heldout = model.samples("code2wav", "heldout").inputs
    with torch.no_grad():
        wav = graph.module(*(torch.from_numpy(heldout[-1][s.name]) for s in graph.inputs)).numpy()
    rate, data = read_wav(out / rec["path"])
    assert rate == 24000 and rec["heldout_index"] == len(heldout) - 1
    np.testing.assert_allclose(data[0], wav.reshape(-1), atol=1e-6)


def test_every_build_keeps_its_own_clip(demo_run):
    from omni_export.artifacts.samples import read_wav
    from omni_export.artifacts.store import sha256_file
    from omni_export.parity.metrics import snr

    _, out = demo_run
    m = read_manifest(out)
    _, ref = read_wav(out / m["components"]["code2wav"]["samples"][0]["path"])
    clip_snr = {}
    for b in m["builds"]:
        [rec] = b["samples"]
        assert sha256_file(out / rec["path"]) == rec["sha256"]
        clip_snr[(b["format"], b["precision"])] = snr(ref, read_wav(out / rec["path"])[1])
    # the clip is the build's output, not a copy of fp32: it carries the build's own error
    for fmt in ("onnx", "dlc", "ctx", "pte"):
        assert 35 < clip_snr[(fmt, "fp16")] < 90 and clip_snr[(fmt, "w8a16")] < clip_snr[(fmt, "fp16")] - 8


def test_report_html_of_the_demo_renders_in_headless_chromium(demo_run, tmp_path):
    """tools/screenshot_report.sh on the demo's report.html: charts in green and red, not a blank page."""
    import shutil
    import subprocess

    from PIL import Image

    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    _, out = demo_run
    png = tmp_path / "report.png"
    script = Path(__file__).resolve().parents[1] / "tools" / "screenshot_report.sh"
    proc = subprocess.run([str(script), str(out / "report.html"), str(png), "1400x3000"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    im = Image.open(png).convert("RGB")
    assert im.size == (1400, 3000)
    colors = im.getcolors(maxcolors=1 << 24)
    assert len(colors) > 1000                                   # antialiased text and figures, not blank
    white = sum(n for n, c in colors if min(c) > 245)
    assert white < 0.92 * im.size[0] * im.size[1]

    def near(rgb, tol=8):
        return sum(n for n, c in colors if all(abs(a - b) <= tol for a, b in zip(c, rgb)))

    assert near((77, 144, 81)) > 2000 and near((207, 72, 72)) > 2000    # accepted and rejected SNR bars


def test_the_demo_reports_rows_are_drawn_in_their_manifest_verdicts_colour_in_a_browser(demo_run):
    """Playwright driving Chromium on the demo's report.html, which has rejected rows (w8a16): no
    console or page error, each row's colour class, chip colour and words are its manifest verdict."""
    from browser import check_report

    _, out = demo_run
    rows = check_report(out)
    assert {r["cls"] for r in rows} == {"accepted", "rejected"}


def test_slow_runners_score_a_spread_subset_only_of_heavy_graphs():
    from omni_export.jobs.component import HEAVY_BYTES, SLOW_SAMPLES
    from omni_export.jobs.plan import RunOptions
    from omni_export.jobs.record import slow_samples as _slow_samples
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    opts = RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), Path("unused"))
    assert _slow_samples(opts, HEAVY_BYTES - 1, 12) is None                    # small graphs: every sample
    assert _slow_samples(opts, HEAVY_BYTES, 12) == [0, 11][:SLOW_SAMPLES]       # first and last
    opts.sim_samples = 3
    assert _slow_samples(opts, 10, 12) == [0, 6, 11]                           # the flag applies to any graph
    opts.sim_samples = 0
    assert _slow_samples(opts, HEAVY_BYTES, 12) is None                        # 0: all
    # a component may ask for more (the fused frame: nothing else runs it on the HTP at real sizes)
    opts.sim_samples = None
    frame = get_recipe("qwen3-tts").component("predictor_frame")
    assert frame.sim_samples == 4 and _slow_samples(opts, HEAVY_BYTES, 12, frame.sim_samples) == [0, 4, 7, 11]
    assert _slow_samples(opts, HEAVY_BYTES - 1, 12, frame.sim_samples) is None


def test_the_simulator_scores_the_samples_ort_scored_worst_a_flipped_code_first():
    """Per held-out sample, the ONNX build's lowest gated agreement, then its lowest gated SNR: the
    samples a slow runner scores are the first of these in order (issue 33's rule, agreement first)."""
    from omni_export.core import OutputScore, Verdict
    from omni_export.jobs.component import _sample_key

    def key(agree, db):
        return _sample_key(Verdict(True, 40.0, "", (OutputScore("codes", None, None, 0.0, agreement=agree),
                                                      OutputScore("embedding", db, db, 0.0),
                                                      OutputScore("margins", 1.0, 1.0, 0.0))),
                           ("codes", "embedding"))

    per = [key(1.0, 60.0), key(0.9, 70.0), key(1.0, 45.0), key(1.0, 80.0)]
    assert per[1] == (0.9, 70.0)                                                # margins are not gated
    assert sorted(range(4), key=lambda k: per[k])[:2] == [1, 2]


def test_sim_samples_flag_limits_the_simulator_not_ort(tmp_path):
    """--sim-samples 1: the context binary is scored on one held-out sample (and says so), the
    ONNX build of the same graph on all of them; the manifest records each component's weights."""
    out = tmp_path / "out"
    proc = run_cli("qwen3-tts", "--out", str(out), "--components", "text_projection", "--formats", "onnx,ctx",
                   "--precision", "fp16", "--e2e-frames", "0", "--sim-samples", "1", *GEOMETRY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(out)
    b = builds_by(m)
    heldout = m["components"]["text_projection"]["heldout"]["count"]
    assert heldout > 1
    ctx = b[("text_projection", "ctx", "fp16")]["parity"]
    assert ctx["samples"] == 1 and "1 of" in ctx["samples_note"]
    onnx = b[("text_projection", "onnx", "fp16")]["parity"]
    assert onnx["samples"] == heldout and "samples_note" not in onnx
    # the simulator's one sample is the one the ONNX build scored worst on ORT CPU
    per = onnx["per_sample_snr_db"]
    assert len(per) == heldout and "lowest SNR of the ONNX build" in ctx["samples_note"]
    assert f"indices [{per.index(min(per))}]" in ctx["samples_note"]
    assert ctx["heldout_indices"] == [per.index(min(per))]
    assert f"| htp-sim fp16 (1 of {heldout} samples: #{per.index(min(per))}) |" in (out / "report.md").read_text()
    assert m["options"]["sim_samples"] == 1
    assert 0 < m["components"]["text_projection"]["weight_bytes"] < (1 << 30)


def test_a_failure_whose_cause_we_measured_says_what_to_do():
    """QNN's finalizer says only "memory allocation"; measured on real-size Code2Wav's last block
    alone, it meant a tensor too long for the HTP (34 frames compile, 35 do not), so the reason says
    what may compile."""
    from omni_export.jobs.errors import short as _short

    e = RuntimeError("[ONNXRuntimeError] : 11 : EP_FAIL : Failed to finalize QNN graph. Error: "
                     "QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation related error., Code: 1002\nmore")
    reason = _short(e)
    assert reason.startswith("RuntimeError: [ONNXRuntimeError] : 11") and "\n" not in reason
    assert reason.endswith("(the HTP could not fit a tensor of this graph; a shorter time axis (a smaller "
                           "streaming chunk) may compile)")
    assert _short(ValueError("other")) == "ValueError: other"


def test_a_components_intermediate_graphs_are_deleted_when_it_is_done(tiny_checkpoint, tmp_path):
    """At 1.7B each talker graph's fp32 / fp16 / QDQ ONNX came to ~12 GB and stayed in .staging to
    the end of the run; they now go as soon as their component's last job is done."""
    import contextlib

    from omni_export.core import Format, Precision
    from omni_export.pipeline import Progress, RunOptions, run
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    out = tmp_path / "out"
    lines = []

    class Watch(Progress):
        @contextlib.contextmanager
        def stage(self, text):
            work = out / ".staging" / "work"
            from omni_export.progress import StageNote

            lines.append((text, sorted(p.name for p in work.iterdir()) if work.exists() else []))
            yield StageNote()              # a stage's closing note (the bundle step writes one)

    result = run(RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), out, checkpoint=tiny_checkpoint,
                            components=("text_projection", "code2wav"), formats=(Format.ONNX,),
                            precisions=(Precision.FP16,), recipe_options={"left-context": 2, "chunk-frames": 2},
                            attribution="off", rewrites=(), jobs=1, e2e=()), Watch())
    assert result.exit_code == 0
    for comp in ("text_projection", "code2wav"):
        mine = [i for i, (text, _) in enumerate(lines) if text.startswith(comp + ":")]
        assert any(comp in dirs for _, dirs in lines[mine[0]:mine[-1] + 1])      # in use while it runs
        assert all(comp not in dirs for _, dirs in lines[mine[-1] + 1:])           # gone once it is done
    assert not (out / ".staging").exists()


def test_a_report_that_fails_to_render_loses_no_build(tiny_checkpoint, tmp_path, monkeypatch):
    """report.html failed on the 0.6B build after 46 min of jobs, and the run ended without a
    manifest (OUT marked incomplete). The manifest and the artifacts are written first now; the error
    still ends the run."""
    from omni_export.artifacts.manifest import read_manifest
    from omni_export.artifacts.store import MARKER
    from omni_export.core import Format, Precision
    from omni_export.pipeline import RunOptions, run
    from omni_export.recipes import get_recipe
    from omni_export.reports import html
    from omni_export.targets import get_target

    def broken(*a, **k):
        raise RuntimeError("template bug")

    monkeypatch.setattr(html, "render", broken)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="template bug"):
        run(RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), out, checkpoint=tiny_checkpoint,
                       components=("text_projection",), formats=(Format.ONNX,), precisions=(Precision.FP16,),
                       recipe_options={"left-context": 2, "chunk-frames": 2}, attribution="off", rewrites=(),
                       jobs=1, e2e=()))
    m = read_manifest(out)
    assert not (out / MARKER).exists() and m["summary"]["accepted"] == 1
    assert all((out / b["files"][0]["path"]).is_file() for b in m["builds"])
