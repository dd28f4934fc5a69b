"""`omni-export verify OUT`: re-hash against the manifest (exit 0 clean, 3 drift, 2 bad input), and
--rescore: every listed artifact re-run on its runner with the held-out inputs kept in OUT."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from omni_export.artifacts.store import listed_files
from conftest import read_manifest, run_cli

ONNX = "qwen3-tts-code2wav-fp16-s25-htp.onnx"


@pytest.fixture
def build(tmp_path, fp16_build) -> Path:
    out = tmp_path / "out"
    shutil.copytree(fp16_build, out, symlinks=True)
    return out


def verify(out: Path, *extra: str):
    proc = run_cli("verify", str(out), *extra)
    return proc.returncode, proc.stdout.strip().splitlines()


def test_a_fresh_build_is_clean(fp16_build):
    code, lines = verify(fp16_build)
    m = read_manifest(fp16_build)
    n = len(listed_files(m))            # build files, parity inputs, kept calibration inputs, sources
    assert n > sum(len(b["files"]) for b in m["builds"])
    assert code == 0, lines
    assert [d["path"] for d in m["documents"]] == ["parity.json", "report.md", "report.html"]
    assert lines == [f"{fp16_build}: {n} listed files and 3 reports checked; clean"]


def test_missing_artifact_is_drift(build):
    (build / ONNX).unlink()
    code, lines = verify(build)
    assert code == 3
    assert f"missing    {ONNX}: listed in the manifest, not on disk" in lines


def test_changed_artifact_is_drift(build):
    data = bytearray((build / ONNX).read_bytes())
    data[-10] ^= 0xFF
    (build / ONNX).write_bytes(bytes(data))
    code, lines = verify(build)
    assert code == 3
    assert any(line.startswith(f"changed    {ONNX}: sha256 ") for line in lines), lines


def test_truncated_artifact_and_edited_reports_are_drift(build):
    with open(build / ONNX, "r+b") as f:
        f.truncate(100)
    (build / "report.md").write_text((build / "report.md").read_text().replace("accepted", "ACCEPTED", 1))
    p = json.loads((build / "parity.json").read_text())
    p["edited"] = True
    (build / "parity.json").write_text(json.dumps(p))
    code, lines = verify(build)
    assert code == 3
    changed = {line.split()[1].rstrip(":") for line in lines if line.startswith("changed ")}
    assert changed == {ONNX, "report.md", "parity.json"}, lines
    assert any(line.startswith(f"changed    {ONNX}: sha256 ") and "(100 bytes)" in line for line in lines)


def test_a_report_removed_or_not_hashed_is_drift(build):
    (build / "report.html").unlink()
    m = read_manifest(build)
    m["documents"] = [d for d in m["documents"] if d["path"] != "report.md"]
    (build / "manifest.json").write_text(json.dumps(m))
    code, lines = verify(build)
    assert code == 3
    assert "missing    report.html: listed in the manifest, not on disk" in lines
    assert "extra      report.md: a report the manifest does not hash" in lines


def test_reports_rewritten_by_report_and_parity_stay_clean(build):
    before = {d["path"]: d["sha256"] for d in read_manifest(build)["documents"]}
    assert run_cli("parity", str(build), "--gate", "fp16=80").returncode in (0, 3)
    after = {d["path"]: d["sha256"] for d in read_manifest(build)["documents"]}
    assert after["parity.json"] != before["parity.json"]          # the re-gating is in parity.json
    assert verify(build)[0] == 0
    assert run_cli("report", str(build)).returncode == 0
    code, lines = verify(build)
    assert code == 0, lines


def test_extra_unlisted_file_and_unfinished_run_are_drift(build):
    (build / "rejected").mkdir(exist_ok=True)
    (build / "rejected" / "smuggled.onnx").write_bytes(b"x")
    (build / ".incomplete").write_text("{}")
    code, lines = verify(build)
    assert code == 3
    assert "extra      rejected/smuggled.onnx: not listed in the manifest" in lines
    assert any(line.startswith("incomplete .incomplete: a run did not finish here") for line in lines)


def test_manifest_listing_a_path_outside_out_is_drift_and_not_read(build, tmp_path):
    m = read_manifest(build)
    m["builds"][0]["files"][0]["path"] = "../../etc/passwd"
    (build / "manifest.json").write_text(json.dumps(m))
    code, lines = verify(build)
    assert code == 3
    assert "outside    ../../etc/passwd: the manifest lists a path outside the output directory" in lines


def test_corrupt_manifest_is_drift(build):
    (build / "manifest.json").write_text('{"tool": "omni-export", "builds": [')
    code, lines = verify(build)
    assert code == 3 and lines[0].startswith("manifest   manifest.json: not readable JSON")


def test_not_a_build_directory_is_bad_input(tmp_path):
    (tmp_path / "empty").mkdir()
    for path, message in [(tmp_path / "empty", "holds no manifest.json"), (tmp_path / "nope", "is not a directory")]:
        proc = run_cli("verify", str(path))
        assert proc.returncode == 2
        assert proc.stderr.strip().startswith(f"omni-export: error: {path} {message}")


def test_json_output(build):
    (build / ONNX).unlink()
    proc = run_cli("verify", str(build), "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["clean"] is False
    assert {"kind": "missing", "path": ONNX, "detail": "listed in the manifest, not on disk"} in doc["findings"]


# -------------------------------------------------------------------------------------- rescore

def test_rescore_reproduces_every_recorded_score(fp16_build):
    code, lines = verify(fp16_build, "--rescore", "--tolerance-db", "0.01")
    assert code == 0, lines
    m = read_manifest(fp16_build)
    for b in m["builds"]:
        line = next(x for x in lines if x.startswith(f"rescore    {b['name']} ({b['format']})"))
        if b["format"] == "dlc":
            assert "skipped" in line
        else:
            now = float(line.split(": wav ")[1].removesuffix(" dB"))
            assert abs(now - b["parity"]["outputs"][0]["snr_db"]) <= 0.01, line


def test_rescore_catches_a_score_or_verdict_that_no_longer_holds(build):
    """The manifest is not hashed: a recorded score edited upwards, or a gate edited so the recorded
    verdict no longer follows, is caught by rerunning the artifacts."""
    m = read_manifest(build)
    # (the HTP builds are dropped from the manifest to keep the simulator out of this test: their
    # files then show up as unlisted, which is drift too)
    m["builds"] = [b for b in m["builds"] if b["format"] in ("onnx", "pte")]
    onnx, pte = m["builds"]
    onnx["parity"]["outputs"][0]["snr_db"] += 5.0
    pte["parity"]["threshold_db"] = 200.0
    (build / "manifest.json").write_text(json.dumps(m))
    code, lines = verify(build, "--rescore")
    assert code == 3
    assert any(line.startswith(f"score      {ONNX}: output 'wav' scores ") and "recorded" in line for line in lines)
    assert f"score      {pte['files'][0]['path']}: verdict now rejected, recorded accepted" in lines
    assert f"extra      {ONNX.replace('.onnx', '.dlc')}: not listed in the manifest" in lines
    assert sum(line.startswith("score") for line in lines) == 2


def test_rescore_is_skipped_when_files_drifted(build):
    (build / ONNX).unlink()
    code, lines = verify(build, "--rescore")
    assert code == 3
    assert "rescore    .: not rescored: files differ from the manifest (fix or rebuild first)" in lines


def test_parity_inputs_are_small_hashed_and_hold_inputs_and_references(fp16_build):
    from omni_export.artifacts.reproducibility import read_parity_inputs
    from omni_export.artifacts.store import sha256_file

    rec = read_manifest(fp16_build)["components"]["code2wav"]["parity_inputs"]
    p = fp16_build / rec["path"]
    assert rec["path"] == "parity-inputs/code2wav.npz" and sha256_file(p) == rec["sha256"]
    assert p.stat().st_size < 200_000
    inputs, refs = read_parity_inputs(p)
    assert len(inputs) == len(refs) == rec["samples"] == 2
    assert inputs[0]["codes"].dtype == np.int32 and refs[0]["wav"].shape == (1, 1, 2 * 1920)     # N new frames only


def test_the_reports_rows_are_drawn_in_their_manifest_verdicts_colour_in_a_browser(fp16_build):
    """report.html in headless Chromium (Playwright): no console or page error, every build row in
    the colour and words of its manifest verdict (tests/browser.py)."""
    from browser import check_report

    rows = check_report(fp16_build)
    assert {r["key"].split("/")[1] for r in rows} == {"onnx", "dlc", "ctx", "pte"}
