"""The ship bundle (issue 37 item 3): `omni-export bundle`, runtime.json under its published schema,
`synth --bundle` from the bundle alone, and bundles that were tampered with."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import read_manifest, run_cli

SCHEMA = Path(__file__).resolve().parents[1] / "omni_export" / "schemas" / "runtime.schema.json"
ERROR = "omni-export: error: "


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def build(tmp_path, fp16_build) -> Path:
    """A copy of the session's fp16 build (read-only), with the bundle the build wrote."""
    out = tmp_path / "out"
    shutil.copytree(fp16_build, out)
    return out


def test_the_build_bundles_one_accepted_artifact_per_component_with_a_valid_runtime_json(build, tmp_path):
    import jsonschema

    m = read_manifest(build)
    rec = m["bundle"]                              # written at the end of the build, listed in the manifest
    assert rec["path"] == "bundle" and rec["graphs"] == {"code2wav": "ctx/fp16"}
    rt = json.loads((build / "bundle" / "runtime.json").read_text())
    jsonschema.validate(rt, json.loads(SCHEMA.read_text()))
    builds = {(b["component"], b["format"], b["precision"]): b for b in m["builds"]}
    assert set(rt["graphs"]) == set(m["components"])            # <= 1 artifact per component: a dict of them
    for comp, g in rt["graphs"].items():
        b = builds[comp, g["format"], g["precision"]]
        assert b["name"] == g["build"] and b["status"] == "accepted" and g["parity"]["verdict"] == "accepted"
        assert (g["format"], g["picked_by"]) == ("ctx", "policy")     # the HTP context binary on an -htp target
        assert g["parity"]["reason"] == b["parity"]["reason"] and g["parity"]["samples"] == b["parity"]["samples"]
        assert [f"graphs/{Path(f['path']).name}" for f in b["files"]] == g["files"]
    listed = {f["path"]: f for f in rt["files"]}
    for f in rt["files"]:
        assert _sha(build / "bundle" / f["path"]) == f["sha256"]
    for comp, g in rt["graphs"].items():
        for rel, src in zip(g["files"], builds[comp, g["format"], g["precision"]]["files"]):
            assert listed[rel]["sha256"] == src["sha256"] == _sha(build / src["path"])
    assert {f["path"] for f in rec["files"]} == {f"bundle/{p}" for p in [*listed, "runtime.json", "README.md"]}
    assert sorted(p.relative_to(build / "bundle").as_posix() for p in (build / "bundle").rglob("*") if p.is_file()) \
        == sorted([*listed, "runtime.json", "README.md"])
    host = rt["host"]
    assert host["speakers"] and host["sample_rate"] == 24000 and host["streaming"]["chunk_frames"] == 2
    assert {"model/vocab.json", "model/merges.txt"} <= set(host["tokenizer"]["files"])
    assert host["tokenizer"]["text_split"] == m["checkpoint"]["text_split"] == "qwen2"    # one name, as synth --json
    bad = json.loads(json.dumps(rt))
    bad["host"]["tokenizer"]["text_split"] = "bert"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json.loads(SCHEMA.read_text()))
    assert host["sampling"]["top_k"] == 50 and host["kv_cache"]["talker"]["context"] == 1024
    report = (build / "report.md").read_text()
    assert "**Bundle** `bundle`:" in report and "`runtime.json` and a README" in report
    assert run_cli("verify", str(build)).returncode == 0       # the bundle's files are checked, not "extra"

    # the command: elsewhere, with an override; a pick that names no accepted build is one line
    ship = tmp_path / "ship"
    proc = run_cli("bundle", str(build), "--into", str(ship), "--pick", "code2wav=onnx:fp16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["graphs"] == {"code2wav": "onnx/fp16"}
    g = json.loads((ship / "runtime.json").read_text())["graphs"]["code2wav"]
    assert (g["format"], g["picked_by"], g["files"]) == ("onnx", "--pick", ["graphs/qwen3-tts-code2wav-fp16-s25-htp.onnx"])
    proc = run_cli("bundle", str(build), "--pick", "code2wav=ctx:w8a16")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"{ERROR}--pick code2wav=ctx:w8a16: that build was not built; accepted code2wav builds: ctx:fp16, dlc:fp16, "
        f"onnx:fp16, pte:fp16"]


def test_synth_from_the_bundle_alone_equals_synth_on_the_build(build, tmp_path):
    """A bundle away from OUT and the checkpoint decodes codes as `synth --build OUT` does on the same
    graph: here Code2Wav's ONNX pick on ONNX Runtime (milliseconds; the context binaries on the HTP
    simulator, text to codes to WAV: test_qwen3_tts_build)."""
    ship = tmp_path / "elsewhere" / "ship"
    assert run_cli("bundle", str(build), "--into", str(ship), "--pick", "code2wav=onnx:fp16").returncode == 0
    codes = tmp_path / "c.npy"
    np.save(codes, np.random.default_rng(5).integers(0, 2048, (5, 16)))
    a = run_cli("synth", "qwen3-tts", "--bundle", str(ship), "--codes", str(codes), "--wav", str(tmp_path / "a.wav"),
                "--json")
    assert a.returncode == 0, a.stderr[-2000:]
    assert json.loads(a.stdout)["graphs"] == f"{ship} on bundle (fp16)"
    b = run_cli("synth", "qwen3-tts", "--build", str(build), "--runner", "ort", "--codes", str(codes),
                "--wav", str(tmp_path / "b.wav"))
    assert b.returncode == 0, b.stderr[-2000:]
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()


def _synth(bundle: Path, tmp_path: Path):
    return run_cli("synth", "qwen3-tts", "--bundle", str(bundle), "--text-ids", "1,2,3,4,5,6,7,8,9",
                   "--wav", str(tmp_path / "never.wav"))


def test_a_tampered_bundle_is_refused_in_one_line_before_anything_runs(build, tmp_path):
    ship = build / "bundle"
    tables = ship / "model" / "host_tables.safetensors"
    data = bytearray(tables.read_bytes())
    data[-1] ^= 1
    tables.write_bytes(bytes(data))
    proc = _synth(ship, tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"{ERROR}{tables} does not match its sha256 in runtime.json; the bundle was changed after it was made: "
        f"make it again with `omni-export bundle`"]
    assert not (tmp_path / "never.wav").exists()


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_runtime_json_pointing_outside_the_bundle_is_refused(build, tmp_path, how):
    ship = build / "bundle"
    rt_file = ship / "runtime.json"
    rt = json.loads(rt_file.read_text())
    secret = tmp_path / "secret.txt"
    secret.write_text("not the bundle's")
    if how == "symlink":                     # a listed file replaced by a link leading out
        (ship / "model" / "merges.txt").unlink()
        (ship / "model" / "merges.txt").symlink_to(secret)
        want = [f"{rt_file}: the path \"model/merges.txt\" is a symlink to {secret}, outside the bundle; "
                f"a bundle's files lie inside it"]
    else:                                    # the schema's relpath rule, before any file is opened
        bad = "../secret.txt" if how == "dotdot" else str(secret)
        rt["graphs"]["code2wav"]["files"][0] = bad
        rt["files"][0]["path"] = bad
        rt_file.write_text(json.dumps(rt))
        want = None
    proc = _synth(ship, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    if want:
        assert lines == [ERROR + want[0]]
    else:
        # the schema error names the value (elided when long: a deep tmp path) and the relpath rule
        assert lines[0].startswith(f"{ERROR}{rt_file}: ") and " does not match '^(?!/)" in lines[0], lines[0]


def test_the_policy_ships_the_smallest_accepted_build_of_the_format_not_the_lowest_precision_name():
    """A repaired build that kept most blocks in float is larger than the plain w8a16 one: w8a16 ships,
    not w8a8-mixed (the order of names alone picked it on Spark's demo); a rejected smaller one never."""
    from omni_export.artifacts.bundle import choose

    def b(fmt, prec, kb, status="accepted"):
        return {"name": f"x-{prec}-{fmt}", "component": "decode", "format": fmt, "precision": prec, "status": status,
                "files": [{"path": f"x-{prec}.{fmt}", "bytes": kb * 1024}]}

    m = {"target": {"htp_arch": "v79"}, "components": {"decode": {}},
         "builds": [b("ctx", "fp16", 726), b("ctx", "w8a16", 510), b("ctx", "w8a8-mixed", 710),
                    b("ctx", "w4a16", 402, "rejected"), b("onnx", "w8a8", 100)]}
    assert choose(m)["decode"][0]["precision"] == "w8a16"
    m["builds"].append(b("ctx", "w8a8", 510))                      # a tie: the lower precision
    assert choose(m)["decode"][0]["precision"] == "w8a8"
