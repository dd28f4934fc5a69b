"""A fourth model family is its folder and one registry line (docs/adding-a-family.md).

tests/families/tinyvoc is a tiny vocoder-only family (a page, a module with its loader, seeded
checkpoint and end-to-end row). The test copies omni_export, drops the folder into recipes/, adds the
one registry line, checks that nothing else in the copy differs from this tree, and runs
`omni-export tinyvoc` from the copy in a fresh interpreter: the builds are scored on ONNX Runtime,
accepted, and the end-to-end rows (the host loop over the built graph) are in the manifest."""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILY = ROOT / "tests" / "families" / "tinyvoc"
LINE = '    "tinyvoc": "omni_export.recipes.tinyvoc.recipe",\n'


def add_family(dest: Path) -> Path:
    """A copy of omni_export with the tinyvoc folder and its registry line; returns the copy's root."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "omni_export", dest / "omni_export", ignore=ignore)
    shutil.copytree(FAMILY, dest / "omni_export" / "recipes" / "tinyvoc", ignore=ignore)
    registry = dest / "omni_export" / "recipes" / "__init__.py"
    text = registry.read_text()
    anchor = "REGISTRY: dict[str, str] = {\n"
    assert anchor in text
    registry.write_text(text.replace(anchor, anchor + LINE))
    return dest


def changed(a: Path, b: Path, rel: str = "") -> list[str]:
    """Files that differ, or stand on one side only, between trees a and b (caches ignored)."""
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = [f"{rel}{n}" for n in cmp.left_only + cmp.right_only + cmp.diff_files + cmp.funny_files]
    for sub in cmp.common_dirs:
        out += changed(a / sub, b / sub, f"{rel}{sub}/")
    return out


def test_a_fourth_family_is_its_folder_and_one_registry_line(tmp_path):
    copy = add_family(tmp_path / "pkg")
    assert sorted(changed(ROOT / "omni_export", copy / "omni_export")) == ["recipes/__init__.py", "recipes/tinyvoc"]
    old = (ROOT / "omni_export/recipes/__init__.py").read_text().splitlines(keepends=True)
    new = (copy / "omni_export/recipes/__init__.py").read_text().splitlines(keepends=True)
    assert [x for x in new if x not in old] == [LINE] and len(new) == len(old) + 1

    env = {**os.environ, "PYTHONPATH": str(copy), "OMNI_EXPORT_JOBS": "1"}
    # the layer contracts hold the new family too (recipes.* in the independence contract): no line to add
    lint = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--config", str(ROOT / "pyproject.toml"),
                           "--no-cache"], cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0 and "a recipe imports no other recipe KEPT" in lint.stdout, lint.stdout + lint.stderr

    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "omni_export.cli", "tinyvoc", "--target", "cpu", "--formats", "onnx",
                        "--precision", "fp32,fp16", "--no-attribution", "-q", "--out", str(out)],
                       cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["recipe"]["name"] == "tinyvoc" and m["checkpoint"]["demo"]
    assert [w["path"] for w in m["checkpoint"]["weights"]] == ["model.safetensors"]
    builds = {(b["component"], b["format"], b["precision"]): b for b in m["builds"]}
    assert set(builds) == {("vocoder", "onnx", "fp32"), ("vocoder", "onnx", "fp16")}
    for b in builds.values():
        assert b["status"] == "accepted", b
        assert b["parity"]["runner"]["kind"] == "ort-cpu" and b["parity"]["samples"] == 4
        assert (out / b["files"][0]["path"]).is_file()
    fp16 = builds["vocoder", "onnx", "fp16"]["parity"]
    assert fp16["threshold_db"] == 40.0 and fp16["outputs"][0]["snr_db"] >= 40
    rows = {(r["runner"], r["precision"]): r for r in m["end_to_end"]}
    assert set(rows) == {("ort", "fp32"), ("ort", "fp16")}
    assert all(r["verdict"] == "accepted" and r["wav_snr_db"] >= r["threshold"] for r in rows.values()), rows
    assert "tinyvoc" in (out / "report.md").read_text()


def test_a_loader_missing_an_interface_member_fails_in_one_line(tmp_path):
    """The pipeline uses the loaded model through omni_export.core.RecipeModel only; a loader whose model
    lacks a member (here TinyVoc without components()) is refused at load, naming the member: exit 2,
    one line, no AttributeError from inside the pipeline."""
    copy = add_family(tmp_path / "pkg")
    model = copy / "omni_export" / "recipes" / "tinyvoc" / "model.py"
    text = model.read_text()
    gone = '    def components(self) -> tuple[str, ...]:\n        return ("vocoder",)\n'
    assert gone in text
    model.write_text(text.replace(gone, ""))
    env = {**os.environ, "PYTHONPATH": str(copy), "OMNI_EXPORT_JOBS": "1"}
    r = subprocess.run([sys.executable, "-m", "omni_export.cli", "tinyvoc", "--target", "cpu", "--formats", "onnx",
                        "--precision", "fp32", "-q", "--out", str(tmp_path / "out")],
                       cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("recipe tinyvoc: its loader omni_export.recipes.tinyvoc.model:load returned a TinyVoc without "
            "components (omni_export.core.RecipeModel: ") in lines[0]
