"""`omni-export report | parity | diff` as CI meets them: files written, exit codes 0 / 2 / 3,
--summary-to, one-line errors. On synthetic output directories (see synthetic.py)."""
import json
import shutil

import jsonschema
import pytest

from conftest import run_cli
from synthetic import build, demo_like, manifest, write_run
from test_reports import PARITY_SCHEMA


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", demo_like(), audio=True)


def _parity(run_dir) -> dict:
    doc = json.loads((run_dir / "parity.json").read_text())
    jsonschema.validate(doc, PARITY_SCHEMA)
    return doc


def test_report_regenerates_all_three_files_from_the_manifest(run_dir, tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("previous step\n")
    proc = run_cli("report", str(run_dir), "--summary-to", str(summary))
    assert proc.returncode == 0, proc.stderr
    for name in ("parity.json", "report.md", "report.html"):
        assert (run_dir / name).stat().st_size > 0
    assert _parity(run_dir)["regated"] is None
    text = summary.read_text()
    assert text.startswith("previous step\n") and (run_dir / "report.md").read_text() in text
    assert "samples/code2wav-ctx-w8a16-wav.wav" in (run_dir / "report.html").read_text()


def test_parity_with_a_stricter_gate_exits_3_and_records_it_beside_the_manifest(run_dir):
    def without_documents() -> dict:
        m = json.loads((run_dir / "manifest.json").read_text())
        return {k: v for k, v in m.items() if k != "documents"}

    before = without_documents()
    proc = run_cli("parity", str(run_dir), "--gate", "fp16=55")
    assert proc.returncode == 3, proc.stderr
    assert "no accepted build for code2wav (exit 3)" in proc.stdout
    assert "❌ rejected (was accepted)" in proc.stdout
    assert without_documents() == before     # build-time verdicts untouched; only the reports' hashes move
    regated = _parity(run_dir)["regated"]
    assert regated["gates_db"] == {"fp16": 55.0} and regated["summary"]["accepted"] == 0
    assert "Re-gated" in (run_dir / "report.md").read_text()
    assert "Re-gated" in (run_dir / "report.html").read_text()


def test_parity_with_a_looser_gate_exits_0_and_report_keeps_the_regating(run_dir):
    proc = run_cli("parity", str(run_dir), "--gate", "w8a16=25,fp16=40")
    assert proc.returncode == 0, proc.stderr
    assert set(_parity(run_dir)["regated"]["summary"]["changed"]) == {"code2wav/ctx/w8a16", "code2wav/pte/w8a16"}
    assert run_cli("report", str(run_dir)).returncode == 0
    assert _parity(run_dir)["regated"]["gates_db"] == {"w8a16": 25.0, "fp16": 40.0}
    assert run_cli("parity", str(run_dir)).returncode == 0                 # no flags: back to build time
    assert _parity(run_dir)["regated"] is None


def test_parity_fail_under(run_dir):
    proc = run_cli("parity", str(run_dir), "--fail-under", "45", "--json")
    assert proc.returncode == 3
    assert json.loads(proc.stdout)["summary"]["below_fail_under"] == ["code2wav/ctx/fp16"]
    assert run_cli("parity", str(run_dir), "--fail-under", "44").returncode == 0


def test_parity_keeps_nan_rejected_under_any_gate(tmp_path):
    run = write_run(tmp_path / "nan", manifest([build("onnx", "fp16", None, 40.0, finite=False)]))
    proc = run_cli("parity", str(run), "--gate", "fp16=-500")
    assert proc.returncode == 3 and "NaN/Inf" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["parity", "{run}", "--gate", "fp16"], "--gate expects PRECISION=DB"),
    (["parity", "{run}", "--gate", "fp16=nan"], "a finite number"),
    (["parity", "{run}", "--gate", "int4=3"], "unknown precision 'int4'"),
    (["parity", "{tmp}/missing"], "no such file or directory"),
    (["report", "{tmp}"], "no manifest.json"),
    (["diff", "{run}", "{tmp}/missing"], "no such file or directory"),
    (["diff", "{run}", "{run}", "--tolerance", "-1"], "non-negative"),
])
def test_bad_input_is_one_line_with_exit_2(run_dir, tmp_path, args, message):
    proc = run_cli(*[a.format(run=run_dir, tmp=tmp_path) for a in args])
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unfinished_and_foreign_runs_are_refused(run_dir, tmp_path):
    (run_dir / ".incomplete").write_text("{}")
    assert "unfinished run" in run_cli("report", str(run_dir)).stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text('{"tool": "something-else"}')
    proc = run_cli("parity", str(other), "--debug")
    assert proc.returncode == 2 and "not an omni-export manifest" in proc.stderr and "Traceback" in proc.stderr


def test_diff_exit_codes_and_table(run_dir, tmp_path):
    same = tmp_path / "same"
    shutil.copytree(run_dir, same)
    proc = run_cli("diff", str(run_dir), str(same))
    assert proc.returncode == 0 and "no regression" in proc.stdout
    worse = demo_like()
    worse["builds"][2]["parity"]["outputs"][0]["snr_db"] = 46.0            # pte fp16: 48.2 -> 46.0
    b = write_run(tmp_path / "worse", worse)
    summary = tmp_path / "summary.md"
    proc = run_cli("diff", str(run_dir), str(b / "manifest.json"), "--summary-to", str(summary))
    assert proc.returncode == 3
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| code2wav/pte/fp16 |"))
    assert "| 48.2 | 46.0 | -2.2 |" in row and "regression" in row
    assert "1 regression" in summary.read_text()
    assert run_cli("diff", str(run_dir), str(b), "--tolerance", "3").returncode == 0


def test_help_teaches_examples_and_exit_codes():
    for cmd, words in (("report", ("manifest.json", "--summary-to", "Exit codes")),
                       ("parity", ("--gate fp16=45,w8a16=32", "--fail-under", "NaN/Inf output stays rejected", "Exit codes")),
                       ("diff", ("--tolerance", "regression", "Exit codes"))):
        proc = run_cli(cmd, "--help")
        assert proc.returncode == 0
        for w in words:
            assert w in " ".join(proc.stdout.split()), (cmd, w)
    top = run_cli("--help").stdout
    assert all(c in top for c in ("report", "parity", "diff"))
    assert "--summary-to" in run_cli("qwen3-tts", "--help").stdout


def test_ci_example_uses_only_flags_the_commands_have():
    """docs/ci-example.yml: valid YAML, summary appended, report uploaded, every flag real."""
    import re
    from pathlib import Path

    import yaml

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "docs" / "ci-example.yml").read_text())
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    runs = [s["run"].replace("\\\n", " ") for s in steps if "run" in s]
    calls = [re.search(r"omni-export\s+(\S+)(.*)", r) for r in runs if "omni-export " in r]
    assert {c.group(1) for c in calls} >= {"qwen3-tts", "parity"}
    for c in calls:
        assert '--summary-to "$GITHUB_STEP_SUMMARY"' in c.group(2)
        help_text = run_cli(c.group(1), "--help").stdout
        for flag in re.findall(r"(--[a-z][a-z-]+)", c.group(2)):
            assert flag in help_text, (c.group(1), flag)
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and "report.html" in upload["with"]["path"]
    assert "samples/" in upload["with"]["path"]
