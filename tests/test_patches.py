"""Every patch of a pinned upstream internal lives in omni_export/exporters/patches/ and names the version it
was written against: this fails loudly when an installed version differs or a patched name is gone."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from omni_export.exporters import patches

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", patches.MODULES)
def test_each_patch_matches_the_installed_versions_and_its_targets_exist(name):
    assert patches.problems(name) == []


def test_a_version_or_target_that_moved_is_named_in_one_line():
    got = patches.problems("ort_float16", pinned={"onnxruntime": "1.31.0"},
                           targets=("onnxruntime.transformers.float16:make_value_info_gone",))
    have = patches.installed_version("onnxruntime")
    assert got == [f"exporters/patches/ort_float16.py was written against onnxruntime==1.31.0; installed: {have}",
                   "exporters/patches/ort_float16.py patches onnxruntime.transformers.float16:make_value_info_gone, "
                   "which no longer exists"]


def test_every_package_listed_and_no_patch_outside_the_package():
    folder = ROOT / "omni_export" / "exporters" / "patches"
    assert sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__") == sorted(patches.MODULES)
    # outside patches/: no assignment to an attribute of an imported upstream module or class
    upstream = ("torch", "onnx", "onnxruntime", "onnxscript", "executorch")
    for path in (ROOT / "omni_export").rglob("*.py"):
        if folder in path.parents:
            continue
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name.split(".")[0]: (getattr(n, "module", None) or a.name)
                    for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        names = {k for k, v in imported.items() if v.split(".")[0] in upstream}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in names:
                    pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} sets {t.value.id}.{t.attr}: "
                                f"patches of upstream internals live in exporters/patches/")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "object" and \
                    getattr(getattr(node.func, "value", None), "attr", "") == "patch":
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} mock.patch.object: move it to exporters/patches/")
