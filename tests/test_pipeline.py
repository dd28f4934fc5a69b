"""End to end through the CLI on tiny checkpoints: every format, the gate, the output directory."""
import json
from pathlib import Path

import pytest

from breakage import constant_codes, outlier_input_channel
from conftest import FAST, GOLDEN, builds_by, read_manifest, run_cli
from omni_export.artifacts.store import sha256_file
from omni_export.recipes.qwen3_tts import checkpoint as ck

SCHEMA = Path(__file__).resolve().parents[1] / "omni_export" / "schemas" / "manifest.schema.json"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The default command on the embedded demo checkpoint (fast streaming geometry)."""
    out = tmp_path_factory.mktemp("demo") / "out"
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--out", str(out), *FAST)
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
            assert f["path"].startswith("rejected/") == (b["status"] == "rejected")
    assert not (out / ".incomplete").exists() and not (out / ".staging").exists()


def test_verify_finds_the_demo_build_clean(demo_run):
    """Every format, rejected builds, attribution and the demo checkpoint inside OUT: nothing unlisted."""
    _, out = demo_run
    proc = run_cli("verify", str(out))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.strip().endswith("listed files checked; clean")


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


def test_attribution_scores_every_block_on_the_simulator(demo_run):
    _, out = demo_run
    att = read_manifest(out)["components"]["code2wav"]["attribution"]
    names = [r["block"] for r in att["fp16"]]
    assert names[0] == "rvq" and names[-1] == "decoder.out" and "pre_transformer" in names
    assert all(r["snr_db"] is not None and r["snr_db"] > 40 for r in att["fp16"])
    assert "HTP simulator" in att["fp16"][0]["runner"]
    assert len(att["w8a16"]) == len(names)


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


def _gated_run(tmp, ckpt, *extra):
    out = tmp / "out"
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--checkpoint", str(ckpt), "--out", str(out),
                   "--precision", "fp16,w8a16", "--formats", "onnx,ctx", "--gate", "w8a16=20",
                   "--no-attribution", *FAST, *extra)
    return proc, _verdicts(out)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return ck.write_checkpoint(tmp_path_factory.mktemp("clean") / "ckpt", seed=0)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, clean):
    return _gated_run(tmp_path_factory.mktemp("clean_run"), clean)


def test_control_the_clean_int8_build_passes_the_same_gate(clean_run):
    proc, v = clean_run
    assert proc.returncode == 0
    assert v[("ctx", "w8a16")]["status"] == "accepted" and v[("onnx", "w8a16")]["status"] == "accepted"


def test_outlier_channel_breaks_int8_and_the_gate_rejects_it(tmp_path, clean, clean_run):
    broken = outlier_input_channel(clean, tmp_path / "outlier")
    proc, v = _gated_run(tmp_path, broken)
    assert proc.returncode == 0                                  # fp16 still gives an accepted build
    for fmt in ("onnx", "ctx"):
        assert v[(fmt, "fp16")]["status"] == "accepted"
        bad = v[(fmt, "w8a16")]
        assert bad["status"] == "rejected" and bad["files"][0]["path"].startswith("rejected/")
        good = clean_run[1][(fmt, "w8a16")]["parity"]["outputs"][0]["snr_db"]
        assert bad["parity"]["outputs"][0]["snr_db"] < good - 15


def test_wrong_distribution_calibration_is_rejected(tmp_path, clean, clean_run):
    codes = constant_codes(tmp_path / "codes.npy")
    proc, v = _gated_run(tmp_path, clean, "--calibration-codes", str(codes))
    assert proc.returncode == 0
    assert v[("ctx", "fp16")]["status"] == "accepted"
    for fmt in ("onnx", "ctx"):
        assert v[(fmt, "w8a16")]["status"] == "rejected"
    assert read_manifest(tmp_path / "out")["components"]["code2wav"]["calibration"]["source"].startswith("user codes")


def test_exit_code_3_when_a_component_has_no_accepted_build(tmp_path, clean):
    proc = run_cli("qwen3-tts", "--checkpoint", str(clean), "--out", str(tmp_path / "o"), "--precision", "w8a16",
                   "--formats", "onnx", "--gate", "w8a16=90", "--no-attribution", "--json", "-q", *FAST)
    assert proc.returncode == 3
    summary = json.loads(proc.stdout)
    assert summary["summary"]["components_without_accepted_build"] == ["code2wav"]


def test_a_checkpoint_saved_by_upstream_works_unchanged(tmp_path):
    """Configs as upstream's save_pretrained wrote them (tests/golden), weights from the seed they were made with."""
    import shutil

    src = ck.write_checkpoint(tmp_path / "weights", seed=11)
    up = tmp_path / "upstream"
    shutil.copytree(GOLDEN / "qwen3_tts" / "upstream_saved", up, ignore=shutil.ignore_patterns("*_tensors.json"))
    shutil.copy(src / "speech_tokenizer" / "model.safetensors", up / "speech_tokenizer" / "model.safetensors")
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--checkpoint", str(up), "--out", str(tmp_path / "o"),
                   "--formats", "onnx,ctx", "--precision", "fp16", "--no-attribution", "--json", "-q", *FAST)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = read_manifest(tmp_path / "o")
    assert m["checkpoint"]["label"] == "user checkpoint" and not m["checkpoint"]["demo"]
    meta = json.loads((GOLDEN / "qwen3_tts" / "meta.json").read_text())
    assert meta["upstream_saved"]["omni_export_run"]["exit_code"] == 0
