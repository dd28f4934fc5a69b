"""parity.json (against its schema), report.md and report.html from synthetic manifests; re-gating,
diff and the kept WAVs as units. No model is built here (see test_pipeline for the real build)."""
import base64
import json
import math
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from markupsafe import escape

from omni_export.artifacts.samples import as_channels, keep_audio, read_wav
from omni_export.parity.diff import compare
from omni_export.parity.regate import regate
from omni_export.reports.parity import parity_json
from omni_export.reports import write_reports
from omni_export.reports.markdown import summary
from synthetic import build, demo_like, manifest, write_run

SCHEMAS = Path(__file__).resolve().parents[1] / "omni_export" / "schemas"
PARITY_SCHEMA = json.loads((SCHEMAS / "parity.schema.json").read_text())
MANIFEST_SCHEMA = json.loads((SCHEMAS / "manifest.schema.json").read_text())


def _broken() -> dict:
    """Every kind of bad build: NaN output, failed lowering, bit-exact fp32, a re-gatable int8."""
    return manifest([build("onnx", "fp32", math.inf, 80.0), build("ctx", "fp16", None, 40.0, finite=False),
                     build("pte", "w8a8", None, 30.0, error="lowering failed: RuntimeError: boom"),
                     build("onnx", "w8a16", 27.0, 30.0)])


# --------------------------------------------------------------------------------------- parity.json

def test_synthetic_manifests_are_real_manifests():
    for m in (demo_like(), _broken()):
        jsonschema.validate(m, MANIFEST_SCHEMA)


@pytest.mark.parametrize("make", [demo_like, _broken])
def test_parity_json_validates_with_and_without_regating(make):
    jsonschema.Draft202012Validator.check_schema(PARITY_SCHEMA)
    m = make()
    for record in (None, regate(m, {"w8a16": 20.0, "fp16": 45.0}, fail_under_db=30.0)):
        doc = json.loads(json.dumps(parity_json(m, record), allow_nan=False))
        jsonschema.validate(doc, PARITY_SCHEMA)


def test_parity_schema_rejects_what_it_must():
    doc = parity_json(demo_like())
    bad_verdict = json.loads(json.dumps(doc))
    bad_verdict["builds"][0]["verdict"] = "maybe"
    accepted_unscored = json.loads(json.dumps(doc))
    accepted_unscored["builds"][0].update(outputs=[], min_snr_db=None)
    wrong_version = {**doc, "schema_version": 1}
    for bad in (bad_verdict, accepted_unscored, wrong_version):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, PARITY_SCHEMA)


def test_parity_json_is_strict_json_with_words_for_infinite_scores():
    doc = parity_json(_broken())
    text = json.dumps(doc, allow_nan=False)          # raises on a NaN/Infinity literal
    by = {b["key"]: b for b in json.loads(text)["builds"]}
    assert by["code2wav/onnx/fp32"]["min_snr_db"] == "inf"
    assert by["code2wav/ctx/fp16"]["min_snr_db"] == "nan"
    assert by["code2wav/pte/w8a8"]["min_snr_db"] is None


# ------------------------------------------------------------------------------------------ regating

def test_regate_flips_verdicts_against_new_gates_and_keeps_the_build_time_ones():
    m = demo_like()
    r = regate(m, {"fp16": 45.0, "w8a16": 25.0})
    v = {x["key"]: x for x in r["builds"]}
    assert v["code2wav/ctx/fp16"]["verdict"] == "rejected" and "44.3 dB < gate 45 dB" in v["code2wav/ctx/fp16"]["reason"]
    assert v["code2wav/onnx/fp16"]["verdict"] == "accepted"
    assert v["code2wav/ctx/w8a16"]["verdict"] == "accepted" and v["code2wav/onnx/w8a16"]["verdict"] == "rejected"
    assert set(r["summary"]["changed"]) == {"code2wav/ctx/fp16", "code2wav/ctx/w8a16", "code2wav/pte/w8a16"}
    assert [b["status"] for b in m["builds"]] == [b["status"] for b in demo_like()["builds"]]   # untouched


def test_regate_never_accepts_nan_or_unscored_builds():
    r = regate(_broken(), {"fp16": -1000.0, "w8a8": -1000.0})
    v = {x["key"]: x for x in r["builds"]}
    assert v["code2wav/ctx/fp16"]["verdict"] == "rejected" and "NaN/Inf" in v["code2wav/ctx/fp16"]["reason"]
    assert v["code2wav/pte/w8a8"]["verdict"] == "rejected" and "lowering failed" in v["code2wav/pte/w8a8"]["reason"]


def test_regate_fail_under_names_accepted_builds_below_the_floor():
    r = regate(demo_like(), {}, fail_under_db=45.0)
    assert r["summary"]["below_fail_under"] == ["code2wav/ctx/fp16"]
    assert r["summary"]["components_without_accepted_build"] == []
    assert regate(demo_like(), {"fp16": 60.0})["summary"]["components_without_accepted_build"] == ["code2wav"]


# ---------------------------------------------------------------------------------------------- diff

def test_diff_flags_drops_over_the_tolerance_only():
    a, b = demo_like(), demo_like()
    b["builds"][0]["parity"]["outputs"][0]["snr_db"] = 52.0      # onnx fp16 -0.5 dB
    b["builds"][2]["parity"]["outputs"][0]["snr_db"] = 45.0      # pte fp16 -3.2 dB
    result = compare(a, b, tolerance_db=1.0)
    assert [r["key"] for r in result["regressions"]] == ["code2wav/pte/fp16"]
    assert result["regressions"][0]["delta_db"] == pytest.approx(-3.2)
    assert compare(a, b, tolerance_db=5.0)["regressions"] == []


def test_diff_flags_nan_verdict_flips_and_vanished_builds():
    a = demo_like()
    b = manifest([build("onnx", "fp16", None, 40.0, finite=False), build("ctx", "fp16", 39.9, 40.0),
                  build("onnx", "w8a16", 24.5, 30.0), build("pte", "w8a16", 25.7, 30.0)])
    flags = {r["key"]: r["flag"] for r in compare(a, b)["regressions"]}
    assert flags["code2wav/onnx/fp16"].startswith("NaN/Inf in B")
    assert "accepted in A, rejected in B" in flags["code2wav/ctx/fp16"]        # only -0.4 dB, but it flipped
    assert flags["code2wav/pte/fp16"] == "accepted in A, not built in B"
    assert "code2wav/ctx/w8a16" not in flags                                    # was rejected anyway


def test_diff_treats_two_exact_builds_as_equal_and_reports_provenance():
    a = manifest([build("onnx", "fp32", math.inf, 80.0)])
    b = manifest([build("onnx", "fp32", 141.0, 80.0)])
    b["toolchain"]["onnxruntime-qnn"] = "2.8.0"
    result = compare(a, b)
    assert result["regressions"] == []
    assert {"field": "toolchain.onnxruntime-qnn", "a": "2.7.0", "b": "2.8.0"} in result["provenance"]


# ------------------------------------------------------------------------------------------ report.md

def test_markdown_fits_one_screen_and_names_every_rejected_build_with_its_reason():
    m = demo_like()
    text = summary(m)
    assert len(text.splitlines()) <= 40
    assert text.startswith("## ✅")
    for b in m["builds"]:
        row = f"| code2wav | {b['format']} | {b['precision']} |"
        assert text.count(row) == 1
        if b["status"] == "rejected":
            key = f"`{b['component']}/{b['format']}/{b['precision']}`"
            where = f"`{b['files'][0]['path']}`"
            assert f"- {key} ({b['parity']['runner']['short']}, {where}): {b['parity']['reason']}" in text
    assert "demo, random weights" in text and "w8a16 `decoder.out` 35.0 dB" in text


def test_markdown_says_a_reason_for_several_skipped_precisions_once():
    m = demo_like()
    why = "one XNNPACK partition of ~7500 nodes"
    m["skipped"] = [{"component": "predictor_frame", "format": "pte", "precision": p, "reason": why}
                    for p in ("fp32", "fp16", "w8a8")] + [
        {"component": "code2wav", "format": "dlc", "precision": "fp32", "reason": "the HTP runs no fp32"}]
    line = next(t for t in summary(m).splitlines() if t.startswith("Not built: "))
    assert line == (f"Not built: predictor_frame pte fp32, fp16, w8a8 ({why}); "
                    "code2wav dlc fp32 (the HTP runs no fp32)")


def test_markdown_says_exit_3_and_shows_regated_verdicts():
    m = demo_like()
    text = summary(m, regate(m, {"fp16": 60.0}))
    assert text.startswith("## ❌") and "no accepted build for code2wav (exit 3)" in text
    assert "**Re-gated**" in text and "fp16=60" in text
    assert "❌ rejected (was accepted)" in text


# ---------------------------------------------------------------------------------------- report.html

@pytest.fixture(scope="module")
def html_run(tmp_path_factory):
    root = write_run(tmp_path_factory.mktemp("html") / "out", _with_hub(demo_like()), audio=True)
    write_reports(root, json.loads((root / "manifest.json").read_text()))
    return root, (root / "report.html").read_text()


def _with_hub(m: dict) -> dict:
    b = m["builds"][1]
    b["hub"] = {"route": {"runtime": "qnn_context_binary", "compute_unit": "npu", "upload": "fp32",
                          "device": "Samsung Galaxy S25 (Family)", "qairt_version": "2.41"},
                "state": "done", "history": [], "files": [],
                "steps": [{"kind": "compile", "name": "n", "id": "jabc123", "url": "https://aihub.example/jobs/jabc123/",
                           "options": "--target_runtime qnn_context_binary", "state": "success", "message": None}],
                "profile": {"inference_ms": 4.2, "peak_memory_mb": 12.5, "compute_units": {"NPU": 40, "GPU": 0, "CPU": 2}},
                "parity": {**b["parity"], "runner": {"kind": "device", "short": "device npu", "label": "S25"}}}
    m["hub"] = {"client": "Qualcomm AI Hub (qai-hub 0.56.0)", "device": {"name": "Samsung Galaxy S25 (Family)",
                "os": "15", "chipset": "qualcomm-snapdragon-8-elite-for-galaxy", "attributes": []},
                "qairt_version": {"pinned": "2.41", "why": "--qairt-version"}, "uploads": {"models": {}, "datasets": {}},
                "summary": {}, "rtf": None}
    m["end_to_end"] = [{"runner": "htp", "precision": "fp16", "prompts": 2, "frames": 24, "threshold": 0.99,
                        "tie_margin": 0.05, "code_agreement": 0.993, "near_tie_flips": 1, "flips": 2,
                        "free_running_agreement": 0.9, "first_divergence": [None, 7], "wav_snr_db": 31.5,
                        "verdict": "accepted", "reason": "teacher-forced codes 99.3% equal"}]
    return m


def test_html_is_self_contained(html_run):
    _, html = html_run
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', html)
    assert len(images) >= 2 + 1 + 6          # SNR chart, attribution chart, fp32 clip, six build clips
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)


def test_html_shows_every_build_reason_provenance_and_optional_sections(html_run):
    root, html = html_run
    m = json.loads((root / "manifest.json").read_text())
    for b in m["builds"]:
        if b["status"] == "rejected":
            assert str(escape(b["parity"]["reason"])) in html
    for text in ("demo, random weights", "0123456789abcdef0123456789abcdef01234567", "ci-host", "onnxruntime-qnn 2.7.0",
                 "Per-block fidelity", "jabc123", "code_agreement", "Nothing was skipped", "NPU 40 · CPU 2", "4.20"):
        assert text in html, text


def test_html_links_every_kept_wav_and_the_files_exist(html_run):
    root, html = html_run
    links = set(re.findall(r'<audio controls preload="none" src="([^"]+)"', html))
    assert links == {"samples/code2wav-fp32-wav.wav"} | {
        f"samples/code2wav-{f}-{p}-wav.wav" for f in ("onnx", "ctx", "pte") for p in ("fp16", "w8a16")}
    assert all((root / p).is_file() for p in links)


def test_html_clip_snr_is_computed_from_the_wavs(html_run):
    _, html = html_run
    # add_audio mixed noise at each build's recorded SNR, so the clip SNRs read back the same numbers
    for db in ("52.5", "44.3", "24.5"):
        assert f"clip SNR {db} dB" in html


def test_html_survives_nan_unscored_and_exact_builds(tmp_path):
    root = write_run(tmp_path / "out", _broken(), audio=True)
    write_reports(root, json.loads((root / "manifest.json").read_text()))
    html = (root / "report.html").read_text()
    assert "lowering failed: RuntimeError: boom" in html and "not scored" in html
    assert "clip SNR NaN/Inf dB" in html                       # the NaN build's clip, read back from its WAV
    assert ">∞<" in html                                       # the bit-exact fp32 build
    assert "No accepted build for" not in html                 # fp32 onnx is accepted


def test_optional_sections_are_absent_when_the_manifest_has_none(tmp_path):
    root = write_run(tmp_path / "out", demo_like())
    write_reports(root, json.loads((root / "manifest.json").read_text()))
    html = (root / "report.html").read_text()
    assert 'id="hub"' not in html and 'id="e2e"' not in html and 'id="audio"' not in html
    assert 'id="verdicts"' in html


# -------------------------------------------------------------------------------------------- samples

def test_keep_audio_writes_the_last_heldout_output_losslessly(tmp_path):
    outs = [{"wav": np.zeros((1, 1, 480), np.float32)}, {"wav": np.linspace(-1.5, 1.5, 480, dtype=np.float32)[None, None]}]
    [rec] = keep_audio(tmp_path, "c-onnx-fp16", outs, {"wav": 24000})
    assert rec["path"] == "samples/c-onnx-fp16-wav.wav" and rec["heldout_index"] == 1 and rec["peak"] == 1.5
    rate, data = read_wav(tmp_path / rec["path"])
    assert rate == 24000 and np.array_equal(data[0], outs[1]["wav"][0, 0])
    assert keep_audio(tmp_path, "x", outs, {}) == []
    assert as_channels(np.zeros((1, 2, 10))).shape == (2, 10)


# -------------------------------------------------------------------------------------------- figure cache

def test_an_unchanged_report_is_drawn_from_the_figure_cache(tmp_path, monkeypatch):
    """The second report of the same manifest draws nothing (matplotlib's savefig never called) and
    is byte-identical apart from its timestamp; a changed score or clip draws that figure again."""
    import matplotlib.figure

    from omni_export.reports import figures

    monkeypatch.setenv("OMNI_EXPORT_CACHE_DIR", str(tmp_path / "cache"))
    root = write_run(tmp_path / "out", demo_like(), audio=True)
    m = json.loads((root / "manifest.json").read_text())
    drawn = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: (drawn.append(1), real(self, *a, **k)))

    def html():
        drawn.clear()
        write_reports(root, m)
        return re.sub(r"Generated [^<]*", "", (root / "report.html").read_text()), len(drawn)

    first, n_first = html()
    assert n_first >= 2 + 1 + 6 and len(list((tmp_path / "cache" / "figures").glob("*.uri"))) == n_first
    again, n_again = html()
    assert n_again == 0 and again == first
    m["builds"][0]["parity"]["outputs"][0]["snr_db"] = 12.0             # one score changed: the SNR chart only
    changed, n_changed = html()
    assert n_changed == 1 and changed != first
    monkeypatch.setenv("OMNI_EXPORT_FIGURE_CACHE", "off")
    assert figures._memo_dir() is None and html()[1] == n_first


# ------------------------------------------------------------------------------------------ caveats

def test_caveats_say_what_an_accepted_verdict_was_not_checked_against(tmp_path):
    """An fp16 .pte scored where XNNPACK sums in fp32, a component of an HTP target scored on CPU
    runtimes only, and the end-to-end gate's meaning: said beside the verdicts, in both reports."""
    m = manifest([build("onnx", "fp16", 60.0, 40.0), build("pte", "fp16", 55.0, 40.0)])
    m["host"]["xnnpack_fp16_accumulation"] = "fp32"
    m["end_to_end"] = _with_hub(demo_like())["end_to_end"]
    text = summary(m)
    pte = "1 accepted fp16 .pte build(s) were scored on a CPU whose XNNPACK sums fp16 products in fp32"
    htp = "Nothing of code2wav ran on the HTP (simulator or device)"
    gate = "The end-to-end gate is teacher-forced agreement"
    assert pte in text and htp in text and gate in text
    write_run(tmp_path / "out", m)
    write_reports(tmp_path / "out", m)
    page = (tmp_path / "out" / "report.html").read_text()
    assert pte in page and htp in page and gate in page

    m["host"]["xnnpack_fp16_accumulation"] = "fp16"            # a host that sums as phones do
    m["builds"].append(build("ctx", "fp16", 50.0, 40.0))          # and a build the HTP simulator ran
    m["end_to_end"] = []
    text = summary(m)
    assert pte not in text and htp not in text and gate not in text and "⚠️" not in text


def test_an_accepted_build_gated_by_codes_agreement_is_drawn_accepted_with_its_agreement():
    """The fused predictor frame's codes have no SNR: its bar said "NaN/Inf: rejected" in red while
    the build was accepted (issue 37). It says its agreement and its verdict, in the verdict's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from omni_export.reports import figures
    from omni_export.reports.html import _bars
    from omni_export.reports.view import build_rows

    m = manifest([build("ctx", "fp16", 50.0, 40.0)])
    b = m["builds"][0]
    b["parity"]["outputs"] = [{"name": "codes", "snr_db": None, "psnr_db": None, "agreement": 1.0,
                               "agreement_raw": 0.733, "finite": True}]
    bars = _bars(build_rows(m))
    assert [x["note"] for x in bars] == ["codes agreement 100.0% (raw 73.3%, near ties excused)"]
    fig, ax = plt.subplots()
    figures._snr_bar(ax, 0, bars[0], math.nan, 60.0)
    (text,) = [t for t in ax.texts]
    assert text.get_text() == "codes agreement 100.0% (raw 73.3%, near ties excused): accepted"
    assert matplotlib.colors.same_color(text.get_color(), figures.ACCEPTED)
    b["status"] = "rejected"
    fig, ax = plt.subplots()
    figures._snr_bar(ax, 0, _bars(build_rows(m))[0], math.nan, 60.0)
    assert ax.texts[0].get_text().endswith(": rejected")
    assert matplotlib.colors.same_color(ax.texts[0].get_color(), figures.REJECTED)
    plt.close("all")


def test_build_json_scores_what_the_gate_read():
    """--json's per-build snr_db pooled every output: the fused frame's ungated outputs gave 3.6 dB
    beside a build report.md shows as accepted on codes agreement (issue 37). Now the gated outputs'."""
    from omni_export.cli import _json_build

    m = manifest([build("ctx", "fp16", 50.0, 40.0)])
    comp = m["builds"][0]["component"]
    m["components"][comp]["gated_outputs"] = ["codes"]
    m["builds"][0]["parity"]["outputs"] = [
        {"name": "codes", "snr_db": None, "psnr_db": None, "agreement": 1.0, "agreement_raw": 0.733, "finite": True},
        {"name": "margins", "snr_db": 3.6, "psnr_db": 9.0, "finite": True}]
    j = _json_build(m, m["builds"][0])
    assert (j["component"], j["format"], j["precision"], j["status"]) == (comp, "ctx", "fp16", "accepted")
    assert j["snr_db"] is None and j["agreement"] == 1.0 and j["gated_outputs"] == ["codes"]   # labelled
    m["components"][comp]["gated_outputs"] = []                       # every output gated
    j = _json_build(m, m["builds"][0])
    assert j["snr_db"] == 3.6 and j["gated_outputs"] == ["codes", "margins"]


def test_every_row_says_what_its_verdict_rests_on(tmp_path):
    """The runner, how many held-out samples it scored, and a DLC scored by its context binary's run."""
    from omni_export.reports.view import build_rows

    m = manifest([build("ctx", "fp16", 50.0, 40.0), build("ctx", "fp16", 50.0, 40.0), build("onnx", "fp16", 60.0, 40.0)])
    m["builds"][1]["format"] = "dlc"
    comp = m["builds"][0]["component"]
    m["components"][comp]["heldout"] = {**m["components"][comp].get("heldout", {}), "count": 12}
    for b, k in zip(m["builds"], (2, 2, 12)):
        b["parity"]["samples"] = k
    m["builds"][1]["outputs_from"] = "ctx"
    assert [r.scored for r in build_rows(m)] == ["2 of 12 samples", "2 of 12 samples; shares the ctx build's run, "
                                                 "not run itself", "12 samples"]
    for b in m["builds"][:2]:
        b["parity"]["heldout_indices"] = [3, 7]          # which ones, when a runner scored a subset
    assert [r.scored for r in build_rows(m)][:2] == ["2 of 12 samples: #3, #7", "2 of 12 samples: #3, #7; shares "
                                                     "the ctx build's run, not run itself"]
    from omni_export.reports.html import render

    text, html = summary(m), render(tmp_path, m)
    assert "(2 of 12 samples: #3, #7; shares the ctx build's run, not run itself) |" in text
    assert "(12 samples) |" in text and "(2 of 12 samples: #3, #7)" in html


def test_an_output_gated_by_agreement_shows_its_agreement_in_both_reports(tmp_path):
    """report.md showed "—" and report.html's tables "—" for the fused frame's SNR (issue 37): the
    gated codes give their agreement, the raw figure beside an excused one."""
    m = manifest([build("ctx", "fp16", 50.0, 40.0)])
    m["builds"][0]["parity"]["outputs"] = [{"name": "codes", "snr_db": None, "psnr_db": None, "agreement": 1.0,
                                            "agreement_raw": 0.733, "finite": True}]
    said = "codes agreement 100.0% (raw 73.3%, near ties excused)"
    assert f"| htp-sim | {said} | — |" in summary(m)
    write_run(tmp_path / "out", m)
    write_reports(tmp_path / "out", m)
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count(f'<td class="num">{said}</td>') == 2            # the verdict row and the per-output row


def test_an_end_to_end_row_on_repaired_graphs_says_which_in_report_md():
    from omni_export.reports.markdown import _end_to_end

    row = {"runner": "htp", "precision": "w8a16", "prompts": 2, "frames": 24, "code_agreement": 1.0,
           "near_tie_flips": 0, "flips": 0, "free_running_agreement": 1.0, "wav_snr_db": 30.5, "verdict": "accepted",
           "repaired": {"code2wav": "w8a16-mixed", "code2wav_n2": "w8a16-mixed"}}
    text = "\n".join(_end_to_end({"end_to_end": [row]}))
    assert "| w8a16 (code2wav at w8a16-mixed, code2wav_n2 at w8a16-mixed) | htp |" in text
    del row["repaired"]
    assert "| w8a16 | htp |" in "\n".join(_end_to_end({"end_to_end": [row]}))


def test_a_repair_that_could_not_start_is_said_in_both_reports_without_a_table(tmp_path):
    """The 0.6B talker prefill's repair record has no runner and no steps (its graph is past 256 MB and
    not a BlockChain): report.html failed to render ('dict object' has no attribute 'runner') and the
    whole build exited 1 after 47 minutes of jobs."""
    from omni_export.reports.html import render

    m = manifest([build("onnx", "w8a16", 28.2, 30.0)])
    why = "a graph past 256 MB of weights is ranked by its per-block attribution, which needs a BlockChain"
    m["components"]["code2wav"] = {**m["components"]["code2wav"],
                            "repair": {"w8a16": {"steps": [], "result": None, "order": [], "budget": 4, "stopped": why}}}
    text, html = summary(m), render(tmp_path, m)
    assert f"code2wav w8a16 rejected; repair found no passing variant: {why}" in text and "| step | change" not in text
    assert f"No variant passed: {why}." in html and 'class="repair"' not in html and "Each step keeps" not in html


def test_a_transformer_repair_at_16_bit_weights_is_said_in_both_reports(tmp_path):
    """An output-ranked search (a real-size talker): step 1 quantizes the linears per channel, step 2
    raises layers to 16-bit weights; both reports say what each step changed, not "kept in float"."""
    from omni_export.reports.html import render

    m = manifest([build("ctx", "w8a16", 26.4, 30.0)])
    pc = "linears per output channel"
    steps = [{"step": 1, "kept_float": [], "scheme": pc, "snr_db": 28.9, "verdict": "rejected", "integer_share": 1.0},
             {"step": 2, "kept_float": [], "weights_16bit": ["decoder.layers.17", "decoder.layers.1"], "scheme": pc,
              "snr_db": 30.7, "verdict": "accepted", "integer_share": 1.0, "base_share": 0.75}]
    result = {"precision": "w8a16-mixed", "step": 2, "kept_float": [], "weights_16bit": steps[1]["weights_16bit"],
              "scheme": pc, "integer_share": 1.0, "base_share": 0.75, "snr_db": 30.7}
    m["components"]["code2wav"] = {**m["components"]["code2wav"], "repair": {"w8a16": {
        "runner": "qnn-htp", "ranked_by": "outputs", "per_channel": True, "raise": "int16", "order": [],
        "budget": 4, "steps": steps, "result": result}}}
    text, html = summary(m), render(tmp_path, m)
    assert f"| 1 | nothing raised; {pc} | 28.9 dB | rejected | 100.0 % |" in text
    assert (f"| 2 | decoder.layers.17, decoder.layers.1 at 16-bit weights; {pc} | 30.7 dB | accepted | "
            "100.0 % (75.0 % at the base width) |") in text
    assert "accepted at step 2: decoder.layers.17, decoder.layers.1 at 16-bit weights; linears per output channel" in text
    assert "The first step quantizes the linears per output channel" in html and "kept in float" not in html
    assert "decoder.layers.17, decoder.layers.1 at 16-bit weights (linears per output channel)" in html
    assert "100.0 % (75.0 % at the base width) of the" in html
