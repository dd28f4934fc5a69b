"""Build cache: an unchanged build is served from the cache with its recorded scores, a changed
option rebuilds only the components it affects, a changed weight file rebuilds, --force rebuilds."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import jsonschema

import pytest

from conftest import read_manifest, run_cli

SCHEMAS = Path(__file__).resolve().parents[1] / "omni_export" / "schemas"
BUILD = ["qwen3-tts", "--components", "code2wav,text_projection", "--formats", "onnx", "--precision", "fp16",
         "--left-context", "2", "--chunk-frames", "2", "--no-attribution", "--json"]
# two of the quickest graphs to export, for the tests that need any two components
SMALL = ["qwen3-tts", "--components", "text_projection,predictor_decode", "--formats", "onnx", "--precision", "fp16",
         "--no-attribution", "--json"]


def hits(m: dict) -> dict[str, bool]:
    return {b["component"]: b["cache"]["hit"] for b in m["builds"]}


def shas(m: dict) -> dict[str, str]:
    return {f["path"]: f["sha256"] for b in m["builds"] for f in b["files"]}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_checkpoint):
    dst = tmp_path_factory.mktemp("cache") / "ckpt"
    shutil.copytree(tiny_checkpoint, dst)          # this test rewrites a weight file
    return dst


def test_unchanged_build_is_reused_and_changes_rebuild_what_they_affect(ckpt, tmp_path):
    out = tmp_path / "out"
    args = [*BUILD, "--checkpoint", str(ckpt), "--out", str(out)]
    run_cli(*args, check=True)
    first = read_manifest(out)
    assert hits(first) == {"code2wav": False, "text_projection": False}
    assert first["cache"]["built_components"] == ["code2wav", "text_projection"]

    # nothing changed: every build reused, with its recorded scores and files
    run_cli(*args, check=True)
    second = read_manifest(out)
    assert hits(second) == {"code2wav": True, "text_projection": True}
    assert [b["parity"] for b in second["builds"]] == [b["parity"] for b in first["builds"]]
    assert shas(second) == shas(first)
    assert all(b["cache"]["built"] == first["created"] for b in second["builds"])
    assert "reused from the build cache" in (out / "report.md").read_text()
    assert run_cli("verify", str(out)).returncode == 0

    # the same bytes rewritten (new mtime, new inode): the key is the content, still reused
    st = next(ckpt.rglob("model.safetensors"))
    data = st.read_bytes()
    st.unlink()
    st.write_bytes(data)
    run_cli(*args, check=True)
    assert hits(read_manifest(out)) == {"code2wav": True, "text_projection": True}

    # an option of Code2Wav only: Code2Wav rebuilt, the text projection reused
    run_cli(*args, "--chunk-frames", "3", check=True)          # the last value of a flag wins
    third = read_manifest(out)
    # (at 3 frames a chunk, the default --chunk-schedule 2 adds Code2Wav's first-chunk graph)
    assert hits(third) == {"code2wav": False, "code2wav_n2": False, "text_projection": True}
    assert third["components"]["code2wav"]["inputs"][0]["shape"][-1] == 2 + 3

    # from here the text projection alone (its key does not depend on which other components run)
    one = [*args, "--components", "text_projection"]
    run_cli(*one, check=True)
    assert hits(read_manifest(out)) == {"text_projection": True}

    # an artifact truncated behind the manifest's back is rebuilt, not served
    victim = out / read_manifest(out)["builds"][0]["files"][0]["path"]
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) // 2)
    run_cli(*one, check=True)
    assert hits(read_manifest(out)) == {"text_projection": False}
    jsonschema.validate(read_manifest(out), json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    assert run_cli("verify", str(out)).returncode == 0

    # --force rebuilds an unchanged build, and the next run reuses what it built; its ETA comes from
    # the job seconds the runs above left in the cost model (jobs/eta.py); --json: progress on stderr
    proc = run_cli(*one, "--force", check=True)
    assert json.loads(proc.stdout)["exit_code"] == 0
    timed = re.search(r"^ETA \S+, about \S+: 0/(\d+) jobs done \((\d+) of (\d+) jobs timed by past runs", proc.stderr, re.M)
    assert timed and timed[1] == timed[2] == timed[3], proc.stderr[-2000:]
    forced = read_manifest(out)
    assert hits(forced) == {"text_projection": False} and forced["cache"]["reuse"] == "off (--force)"
    run_cli(*one, check=True)
    assert hits(read_manifest(out)) == {"text_projection": True}

    # one bit of a weight changed: rebuilt
    header_len = int.from_bytes(data[:8], "little")
    changed = bytearray(data)
    changed[8 + header_len + 3] ^= 0x01
    st.write_bytes(bytes(changed))
    run_cli(*one, check=True)
    assert hits(read_manifest(out)) == {"text_projection": False}
    jsonschema.validate(read_manifest(out), json.loads((SCHEMAS / "manifest.schema.json").read_text()))


def test_htp_optimization_reaches_the_context_binary_and_its_cache_key(ckpt, tmp_path):
    """--htp-optimization is the QNN finalization mode of the context binary (recorded per build and
    in the options) and part of the key: a different level rebuilds, the same one is reused."""
    out = tmp_path / "out"
    args = ["qwen3-tts", "--components", "text_projection", "--formats", "ctx", "--precision", "fp16",
            "--no-attribution", "--json", "--checkpoint", str(ckpt), "--out", str(out)]
    run_cli(*args, "--htp-optimization", "2", check=True)
    m = read_manifest(out)
    assert m["options"]["htp_optimization"] == "2"
    assert [b["details"]["htp_graph_finalization"] for b in m["builds"]] == ["2"]
    run_cli(*args, "--htp-optimization", "2", check=True)
    assert hits(read_manifest(out)) == {"text_projection": True}
    run_cli(*args, check=True)                                   # the default, 1
    m = read_manifest(out)
    assert hits(m) == {"text_projection": False}
    assert m["options"]["htp_optimization"] == "1" and m["builds"][0]["details"]["htp_graph_finalization"] == "1"
    assert m["builds"][0]["status"] == "accepted"


def test_an_edit_that_changes_no_output_reuses_everything_and_a_graph_change_rebuilds_that_graph(ckpt, tmp_path):
    """Keys hold the versions of the code that decides outputs (omni_export/numerics.py, recipe and
    component versions), not omni-export's source: a docstring and the report code edited in a copy of
    the package reuse every build and score; one component's version bumped rebuilds that one alone."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    shutil.copytree(root / "omni_export", src / "omni_export", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    args = [*SMALL, "--checkpoint", str(ckpt), "--out", str(out)]

    def run_from(tree: Path) -> dict:
        proc = subprocess.run([sys.executable, "-m", "omni_export.cli", *args], cwd=tree, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return read_manifest(out)

    first = run_from(src)
    assert hits(first) == {"predictor_decode": False, "text_projection": False}

    def edit(rel: str, old: str, new: str) -> None:
        p = src / "omni_export" / rel
        text = p.read_text()
        assert old in text
        p.write_text(text.replace(old, new, 1))

    edit("pipeline.py", '"""The driver:', '"""The driver (edited docstring):')
    edit("reports/markdown.py", "\n", "\n# an edit of the report code\n")
    second = run_from(src)
    assert hits(second) == {"predictor_decode": True, "text_projection": True}
    assert shas(second) == shas(first) and [b["parity"] for b in second["builds"]] == [b["parity"] for b in first["builds"]]

    recipe = src / "omni_export" / "recipes" / "qwen3_tts" / "recipe.py"      # predictor_decode's version bumped
    text = recipe.read_text()
    at = text.index('version="', text.index('name="predictor_decode",')) + len('version="')
    recipe.write_text(text[:at] + "bumped-" + text[at:])
    third = run_from(src)
    assert hits(third) == {"predictor_decode": False, "text_projection": True}


def test_a_killed_build_resumes_with_the_components_it_finished(ckpt, tmp_path):
    """Killed (no cleanup) once its first component is in OUT: the rerun reuses that component's builds
    and scores, builds the other, and leaves exactly what its manifest lists."""
    out = tmp_path / "out"
    args = [a for a in SMALL if a != "--json"] + ["--checkpoint", str(ckpt), "--out", str(out), "--jobs", "1"]
    killed = run_cli(*args, env={"OMNI_EXPORT_CRASH_AT": "component-done"})
    assert killed.returncode == 137 and (out / ".incomplete").exists()
    marker = json.loads((out / ".incomplete").read_text())
    (done,) = marker["finished"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"the components it finished are reused ({done})" in proc.stderr
    m = read_manifest(out)
    assert hits(m) == {done: True, ({"predictor_decode", "text_projection"} - {done}).pop(): False}
    assert run_cli("verify", str(out)).returncode == 0
