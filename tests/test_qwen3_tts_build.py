"""Qwen3-TTS complete, through the CLI on the demo checkpoint: every graph built and scored on the
HTP simulator, end-to-end parity through the built graphs, and synthesis from a build."""
import json

import numpy as np
import pytest

from conftest import GEOMETRY, builds_by, read_manifest, run_cli

GRAPHS = ("text_projection", "talker_prefill", "talker_decode", "predictor_prefill", "predictor_decode",
          "predictor_frame", "code2wav")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("q3") / "out"
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--out", str(out), "--precision", "fp16",
                   "--formats", "onnx,ctx", "--no-attribution", "--e2e-frames", "4", *GEOMETRY, timeout=1500)
    return proc, out


def test_every_graph_is_built_and_scored_on_the_simulator(build):
    proc, out = build
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    b = builds_by(read_manifest(out))
    assert {c for c, _, _ in b} == set(GRAPHS)
    for g in GRAPHS:
        ctx = b[(g, "ctx", "fp16")]
        assert ctx["parity"]["runner"]["kind"] == "qnn-htp", g
        floats = [o for o in ctx["parity"]["outputs"] if o.get("agreement") is None and o["name"] != "margins"]
        if g != "predictor_frame":
            assert ctx["status"] == "accepted" and min(o["snr_db"] for o in floats) >= 40, (g, ctx["parity"])


def test_fused_frame_codes_are_scored_by_tie_aware_agreement(build):
    _, out = build
    ctx = builds_by(read_manifest(out))[("predictor_frame", "ctx", "fp16")]
    codes = next(o for o in ctx["parity"]["outputs"] if o["name"] == "codes")
    assert codes["snr_db"] is None and 0 <= codes["agreement_raw"] <= codes["agreement"] <= 1
    assert ("agrees" in ctx["parity"]["reason"]) or ctx["status"] == "accepted"
    onnx = builds_by(read_manifest(out))[("predictor_frame", "onnx", "fp16")]
    assert next(o for o in onnx["parity"]["outputs"] if o["name"] == "codes")["agreement"] >= 0.99
    # what the fused graph cannot sample is said in the manifest (synth then runs the step graphs)
    assert set(read_manifest(out)["components"]["predictor_frame"]["limits"]) == {"subtalker_top_k", "subtalker_top_p"}


def test_the_fused_frames_embedding_is_gated_against_its_own_codes_and_fp32(build):
    """The frame's summed embedding (the next talker input) is gated, not only its codes: against the
    codebook sum of the build's own codes and fp32's up to the first differing code (issue 37)."""
    _, out = build
    m = read_manifest(out)
    assert m["components"]["predictor_frame"]["gated_outputs"] == ["codes", "embedding", "embedding_own_codes"]
    for fmt in ("onnx", "ctx"):
        b = builds_by(m)[("predictor_frame", fmt, "fp16")]
        outs = {o["name"]: o for o in b["parity"]["outputs"]}
        assert outs["embedding_own_codes"]["snr_db"] >= 40 and outs["embedding"]["snr_db"] >= 40, outs
        assert outs["embedding_own_codes"]["against"] == "the sum of the codebook rows its own codes select"
        if b["status"] == "accepted":
            assert "dB >= gate 40 dB; 'codes' agreement" in b["parity"]["reason"], b["parity"]["reason"]
    assert builds_by(m)[("predictor_frame", "onnx", "fp16")]["status"] == "accepted"


def test_a_frame_whose_embedding_is_broken_with_its_codes_intact_is_rejected_naming_it(build, tmp_path, monkeypatch):
    """The frame graph reads the last code's codebook row one row off (a wrong offset) in its summed
    embedding only: codes and their agreement are intact and fp32's graph is just as wrong, so only the
    own-codes score (the checkpoint's codebook rows) can see it. The build is rejected naming it. Only
    the frame's fp32 ONNX is built, in this process, on the inputs `build` captured (its options)."""
    from click.testing import CliRunner

    from omni_export import trace
    from omni_export.cli import main
    from omni_export.recipes.qwen3_tts import talker

    forward, traced, broken = talker.PredictorFrame.forward, trace.trace, []

    def off_by_one(self, past_hidden, code0, noise):
        codes, embedding, margins = forward(self, past_hidden, code0, noise)
        if not broken:
            return codes, embedding, margins
        last, core = codes[:, -1:].long(), self.core
        return codes, embedding + core.embed(15, (last + 1) % core.vocab) - core.embed(15, last), margins

    def trace_broken(*args, **kw):      # the graph from its fp32 trace on; its inputs captured by the real pipeline
        broken.append(True)
        return traced(*args, **kw)

    monkeypatch.setattr(talker.PredictorFrame, "forward", off_by_one)
    monkeypatch.setattr(trace, "trace", trace_broken)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["qwen3-tts", "--target", "cpu", "--out", str(out), "--components", "predictor_frame",
                                  "--formats", "onnx", "--precision", "fp32", "--e2e-frames", "4", *GEOMETRY,
                                  "--no-attribution", "-q"], catch_exceptions=False)
    assert r.exit_code == 3, r.output[-2000:]
    b = builds_by(read_manifest(out))[("predictor_frame", "onnx", "fp32")]
    outs = {o["name"]: o for o in b["parity"]["outputs"]}
    assert broken and b["status"] == "rejected" and outs["codes"]["agreement_raw"] == 1.0
    assert outs["embedding"]["snr_db"] == "inf"                  # fp32's graph is as wrong: no fp32 check sees it
    assert b["parity"]["reason"].startswith("output 'embedding_own_codes' against the sum of the codebook rows its "
                                            "own codes select, "), b["parity"]["reason"]
    # verify --rescore reruns it without the checkpoint: codes by agreement, the own-codes score as recorded
    r = CliRunner().invoke(main, ["verify", str(out), "--rescore"], catch_exceptions=False)
    assert r.exit_code == 0 and "codes agreement 100.0%" in r.output, r.output


def test_the_report_shows_the_fused_frames_codes_agreement_in_a_browser(build):
    """The fused frame's codes have no SNR: its row was drawn red as NaN/Inf while accepted (issue 37).
    In Chromium every row has its manifest verdict's colour and the frame's rows give agreement %."""
    from browser import check_report

    _, out = build
    frame = [r for r in check_report(out) if r["key"].startswith("predictor_frame/")]
    assert frame
    for r in frame:
        snr = r["cells"][4]
        assert "codes agreement" in snr and "%" in snr and "NaN" not in snr, r["cells"]


def test_end_to_end_parity_is_recorded_and_gated(build):
    _, out = build
    m = read_manifest(out)
    [row] = m["end_to_end"]
    assert row["runner"] == "htp" and row["precision"] == "fp16"
    assert row["verdict"] == "accepted" and row["code_agreement"] >= row["threshold"], row
    assert row["near_tie_flips"] <= row["flips"]
    # the demo's decisive heads: the fp16 graphs on the HTP simulator speak the fp32 pipeline's codes
    assert row["free_running_agreement"] >= 0.99, row
    assert "End to end" in (out / "report.md").read_text() or "end-to-end" in (out / "report.md").read_text().lower()


def test_a_row_run_as_parts_of_the_prompts_merges_to_the_row_of_one_run(build):
    """The build runs a light model's row as jobs/e2e.E2E_PARTS jobs, a share of the held-out prompts
    each (the demo's w8a16 row ran 67 s on one core at the end of the build); merged, the parts give
    the row one run gives, prompt order and all."""
    from pathlib import Path

    from omni_export.core import RANDOM_WEIGHTS
    from omni_export.progress import Progress
    from omni_export.recipes import get_recipe, load_model
    from omni_export.recipes.qwen3_tts import e2e

    _, out = build
    m = read_manifest(out)
    model = load_model(get_recipe("qwen3-tts"), Path(m["checkpoint"]["path"]),
                       {**m["options"]["recipe_options"], RANDOM_WEIGHTS: False}, out)
    n = len(model.requests("heldout"))
    whole = e2e.run(model, out, m, {"ort": ("fp16",)}, Progress())
    parts = [e2e.run(model, out, m, {"ort": ("fp16",)}, Progress(), part=(k, 2)) for k in range(2)]
    assert n >= 2 and [len(p[0]["_part"]["reference"]) for p in parts] == [len(range(k, n, 2)) for k in range(2)]
    assert "verdict" not in parts[0][0] and whole[0]["verdict"] == "accepted"
    assert e2e.merge(parts) == whole


def test_a_row_whose_fused_frame_was_rejected_runs_the_predictor_step_graphs_instead(build, monkeypatch):
    """The fused frame graph has no accepted build at a row's precision (its codes flip where the step
    graphs' pass: 0.6B random weights at w8a16), or was not built: the row is not skipped, its
    free-running synthesis runs the predictor's prefill and decode step graphs (the same greedy codes)
    and says so; the report names it. Without accepted step graphs it stays skipped, naming the frame."""
    import copy
    from pathlib import Path

    from omni_export.core import RANDOM_WEIGHTS
    from omni_export.progress import Progress
    from omni_export.recipes import get_recipe, load_model
    from omni_export.recipes.qwen3_tts import e2e
    from omni_export.reports.markdown import _end_to_end
    from omni_export.runtime.graphs import BuildGraphs

    _, out = build
    m = read_manifest(out)
    model = load_model(get_recipe("qwen3-tts"), Path(m["checkpoint"]["path"]),
                       {**m["options"]["recipe_options"], RANDOM_WEIGHTS: False}, out)
    called, real = [], BuildGraphs.__call__
    monkeypatch.setattr(BuildGraphs, "__call__", lambda self, name, inputs: (called.append(name), real(self, name, inputs))[1])
    [whole] = e2e.run(model, out, m, {"ort": ("fp16",)}, Progress())
    assert "predictor_frame" in called and "predictor" not in whole
    rejected = copy.deepcopy(m)
    for b in rejected["builds"]:
        if b["component"] == "predictor_frame":
            b["status"] = "rejected"
    called.clear()
    [row] = e2e.run(model, out, rejected, {"ort": ("fp16",)}, Progress())
    assert row["verdict"] == "accepted" and row["predictor"] == {"graphs": "step", "why": "no accepted predictor_frame build"}
    assert "predictor_frame" not in called and called.count("predictor_decode") > called.count("talker_decode") > 0
    # greedy through the step graphs: the codes the fused frame's row decided, the same teacher-forced score
    assert row["free_running_agreement"] == whole["free_running_agreement"] >= 0.99
    assert row["code_agreement"] == whole["code_agreement"]
    assert "predictor step graphs: no accepted predictor_frame build" in "\n".join(_end_to_end({"end_to_end": [row]}))
    for b in rejected["builds"]:
        if b["component"] == "predictor_decode":
            b["status"] = "rejected"
    [row] = e2e.run(model, out, rejected, {"ort": ("fp16",)}, Progress())
    assert row["verdict"] == "skipped" and row["reason"] == "no accepted predictor_decode, predictor_frame build", row


def test_calibration_comes_from_the_pipeline_itself(build):
    _, out = build
    comps = read_manifest(out)["components"]
    assert "fp32 generations of the recipe's calibration prompts" in comps["talker_decode"]["calibration"]["source"]
    assert "held-out prompts" in comps["talker_decode"]["heldout"]["source"]
    assert comps["talker_decode"]["calibration"]["sha256"] != comps["talker_decode"]["heldout"]["sha256"]


def test_synth_through_the_build_on_the_ort_runner(build, tmp_path):
    _, out = build
    proc = run_cli("synth", "qwen3-tts", "--build", str(out), "--runner", "ort", "--text", "Hi there.",
                   "--greedy", "--max-frames", "6", "--wav", str(tmp_path / "a.wav"),
                   "--codes-out", str(tmp_path / "a.npy"), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["frames"] == 6 and "on ort (fp16)" in s["graphs"]
    # the stream's first chunk (--chunk-schedule 2, here also --chunk-frames) leaves after 2 frames
    lat = s["latency"]
    assert s["first_audio_after_frames"] == 2 and 0 < s["ttfa_ms"] <= lat["total_ms"] and s["rtf"] > 0
    assert [c["frames"] for c in lat["chunks"]] == [2, 2, 2] and lat["timed_on"].startswith("wall clock of this machine")
    assert {"text_projection", "talker_prefill", "talker_decode", "predictor_frame", "code2wav", "host"} <= set(lat["stages_ms"])
    assert lat["stages_ms"]["talker_decode"]["calls"] == 6 and lat["stages_ms"]["code2wav"]["calls"] == 3
    # frames done / total with an ETA on stderr (progress.frame_lines), the JSON alone on stdout
    assert any(ln.startswith("generate: 1/≤6 frames, ") and ", ETA ≤" in ln for ln in proc.stderr.splitlines())
    codes = np.load(tmp_path / "a.npy")
    assert codes.shape == (6, 16) and codes.max() < 2048
    eager = run_cli("synth", "qwen3-tts", "--checkpoint", s["checkpoint"], "--text", "Hi there.", "--greedy",
                    "--max-frames", "6", "--codes-out", str(tmp_path / "b.npy"), "--json")
    assert eager.returncode == 0, eager.stderr[-2000:]
    assert (np.load(tmp_path / "b.npy") == codes).all()      # fp16 ONNX on CPU vs fp32 eager, free running


def test_synth_decodes_given_codes_without_a_tokenizer(tmp_path):
    codes = np.random.default_rng(0).integers(0, 2048, (5, 16))
    np.save(tmp_path / "c.npy", codes)
    proc = run_cli("synth", "qwen3-tts", "--codes", str(tmp_path / "c.npy"), "--wav", str(tmp_path / "o.wav"), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["frames"] == 5 and s["seconds"] == 0.4
    # the default schedule: a first chunk of 2 frames through its own graph, then the steady graph's (12)
    assert s["first_audio_after_frames"] == 2 and s["ttfa_ms"] > 0
    assert [(c["graph"], c["frames"]) for c in s["latency"]["chunks"]] == [("code2wav_n2", 2), ("code2wav", 3)]
    import wave

    with wave.open(str(tmp_path / "o.wav")) as w:
        assert w.getframerate() == 24000 and w.getnframes() == 5 * 1920


def test_synth_errors_are_one_line(tmp_path):
    proc = run_cli("synth", "qwen3-tts", "--speaker", "nobody", "--text", "x")
    assert proc.returncode == 2 and "unknown speaker 'nobody'" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("synth", "qwen3-tts")
    assert proc.returncode == 2 and "give --text, --text-ids or --codes" in proc.stderr


def test_built_graphs_under_a_session_budget_close_the_least_recently_used(build):
    """End-to-end parity at 1.7B cannot keep every graph's session open beside the build: with
    max_open_bytes, opening a graph that does not fit closes the least recently used one (reopened
    when needed again), and the outputs are those of the sessions kept open."""
    from omni_export.artifacts.reproducibility import read_parity_inputs
    from omni_export.runtime.graphs import BuildGraphs

    _, out = build
    names = ("talker_prefill", "talker_decode", "talker_decode", "talker_prefill", "talker_decode")
    inputs = {n: read_parity_inputs(out / "parity-inputs" / f"{n}.npz")[0][0] for n in set(names)}
    free = BuildGraphs(out, "ort", "fp16")
    tight = BuildGraphs(out, "ort", "fp16", max_open_bytes=BuildGraphs.SESSION_FACTOR * max(
        free._bytes[n] for n in set(names)))
    try:
        for n in names:
            a, b = free(n, inputs[n]), tight(n, inputs[n])
            assert all(np.array_equal(a[k], b[k]) for k in a), n
            assert len(tight._runners) == 1 and n in tight._runners      # only one fits at a time
        assert tight.reopened == 2 and free.reopened == 0 and len(free._runners) == 2
    finally:
        free.close()
        tight.close()


def test_synth_falls_back_to_the_step_graphs_when_the_build_has_no_frame_graph(build, tmp_path):
    """A --target cpu build has no predictor_frame .pte (opt in): synth on it used to stop with "no
    usable 'predictor_frame' graph"; it now runs the predictor's step graphs and says so."""
    import shutil

    _, out = build
    copy = tmp_path / "b"
    shutil.copytree(out, copy, symlinks=True)
    m = read_manifest(copy)
    m["builds"] = [b for b in m["builds"] if b["component"] != "predictor_frame"]
    del m["components"]["predictor_frame"]
    (copy / "manifest.json").write_text(json.dumps(m))
    args = ("synth", "qwen3-tts", "--build", str(copy), "--runner", "ort", "--text", "Hi there.", "--greedy",
            "--max-frames", "4", "--json")
    proc = run_cli(*args, "--codes-out", str(tmp_path / "s.npy"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["predictor"] == "step"
    full = run_cli("synth", "qwen3-tts", "--build", str(out), *args[4:], "--codes-out", str(tmp_path / "f.npy"))
    assert full.returncode == 0 and json.loads(full.stdout)["predictor"] == "frame"
    assert (np.load(tmp_path / "s.npy") == np.load(tmp_path / "f.npy")).all()     # same codes either way
    proc = run_cli(*args, "--predictor", "frame")                                  # asked for: a clear error
    assert proc.returncode == 2 and "no usable 'predictor_frame' graph" in proc.stderr


def _bundle_synth(out, ship, tmp_path, runner: str):
    """synth --bundle SHIP and synth --build OUT --runner RUNNER on the same text and seed: their --json."""
    args = ("--text", "Hi there.", "--seed", "7", "--max-frames", "2", "--json")
    a = run_cli("synth", "qwen3-tts", "--bundle", str(ship), *args, "--codes-out", str(tmp_path / "a.npy"),
                "--wav", str(tmp_path / "a.wav"))
    assert a.returncode == 0, a.stderr[-2000:]
    b = run_cli("synth", "qwen3-tts", "--build", str(out), "--runner", runner, *args,
                "--codes-out", str(tmp_path / "b.npy"), "--wav", str(tmp_path / "b.wav"))
    assert b.returncode == 0, b.stderr[-2000:]
    sa, sb = json.loads(a.stdout), json.loads(b.stdout)
    assert sa["text_ids"] == sb["text_ids"] and sa["frames"] == sb["frames"] == 2
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def test_synth_from_a_bundle_alone_speaks_the_codes_of_synth_on_the_build(build, tmp_path):
    """Text -> codes -> WAV from a bundle moved away from OUT and the checkpoint (tokenizer, host tables,
    config, graphs: nothing else) equals synth on the build through the same graphs, here the ONNX
    builds on ONNX Runtime picked into the bundle (milliseconds a call; the context binaries on the HTP
    simulator: the slow test below). Issue 37 item 3; docs/bundle.md."""
    _, out = build
    ship = tmp_path / "ship"
    picks = [x for g in GRAPHS for x in ("--pick", f"{g}=onnx:fp16")]
    assert run_cli("bundle", str(out), "--into", str(ship), *picks).returncode == 0
    rt = json.loads((ship / "runtime.json").read_text())
    assert {g["format"] for g in rt["graphs"].values()} == {"onnx"} and set(rt["graphs"]) == set(GRAPHS)
    _bundle_synth(out, ship, tmp_path, "ort")


@pytest.mark.slow
def test_the_bundle_the_build_wrote_speaks_the_codes_of_synth_on_the_htp_runner(build, tmp_path):
    """The bundle the build wrote (its context binaries) on the HTP simulator equals `synth --build OUT
    --runner htp` on the same seed. Slow: 38 s of CPU with the CLI server's start (the tiny Code2Wav
    alone takes ~10 s of CPU per call on the simulator), past the suite's budget."""
    import shutil

    _, out = build
    ship = tmp_path / "ship"
    shutil.copytree(out / "bundle", ship)
    rt = json.loads((ship / "runtime.json").read_text())
    assert {g["format"] for g in rt["graphs"].values()} == {"ctx"} and set(rt["graphs"]) == set(GRAPHS)
    _bundle_synth(out, ship, tmp_path, "htp")
