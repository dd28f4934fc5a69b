"""The layer contracts of pyproject.toml ([tool.importlinter], docs/layers.md), checked by import-linter's
own `lint-imports` on this tree, and shown to fail on a copy of the package given one forbidden import
or a contract with a layer left out. Function-level imports count (import-linter reads every import)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"


def lint_imports(root: Path, config: Path = CONFIG) -> subprocess.CompletedProcess:
    """`lint-imports` of this venv on the omni_export package under `root` (cwd and PYTHONPATH: that
    copy, not the installed one), no cache written."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.fail(f"{exe} is missing: pip install -e '.[test]' installs import-linter")
    env = {**os.environ, "PYTHONPATH": str(root), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([str(exe), "--config", str(config), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def copy_package(dest: Path) -> Path:
    shutil.copytree(ROOT / "omni_export", dest / "omni_export", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_the_tree_keeps_every_contract():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("omni_export layers (lower layers never import upper ones) KEPT", "nothing imports the CLI KEPT",
                 "a recipe imports no other recipe KEPT", "no import cycle between the exporters' modules KEPT"):
        assert name in r.stdout
    assert "0 broken" in r.stdout


def test_a_forbidden_import_or_a_missing_layer_breaks_the_contract(tmp_path):
    # an exporter importing a recipe (exporters sit below recipes), inside a function as most imports are
    bad = copy_package(tmp_path / "import")
    lower = bad / "omni_export" / "exporters" / "lower.py"
    lower.write_text(lower.read_text() + "\n\ndef _wrong_way():\n    from ..recipes import get_recipe\n\n"
                                          "    return get_recipe\n")
    r = lint_imports(bad)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "omni_export.exporters is not allowed to import omni_export.recipes" in r.stdout
    assert "omni_export.exporters.lower -> omni_export.recipes" in r.stdout
    assert "layers (lower layers never import upper ones) BROKEN" in r.stdout

    # the same tree with the layers line `"exporters | trace",` deleted from the contract: the layers
    # contract is exhaustive, so a package no layer names is a failure too
    text = CONFIG.read_text()
    assert '    "exporters | trace",\n' in text
    config = tmp_path / "pyproject.toml"
    config.write_text(text.replace('    "exporters | trace",\n', ""))
    r = lint_imports(copy_package(tmp_path / "layer"), config)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "The following modules are not listed as layers" in r.stdout
    assert "- omni_export.exporters" in r.stdout and "- omni_export.trace" in r.stdout


def test_every_internal_import_names_a_module_that_exists():
    """lint-imports skips an import of a module that does not exist (a function-level import left behind
    by a move fails only when that function runs): every `omni_export` import here names a file."""
    import ast

    pkg = ROOT / "omni_export"

    def exists(dotted: str) -> bool:
        path = ROOT.joinpath(*dotted.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    missing = []
    for file in sorted(pkg.rglob("*.py")):
        here = file.relative_to(ROOT).with_suffix("").parts
        package = here[:-1]          # a module's package; an __init__'s is its own
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
                name = ".".join(p for p in (base, node.module or "") if p)
                names = [name] if node.module else [f"{name}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for n in names:
                if n.startswith("omni_export") and not exists(n):
                    # `from pkg import attr`: the attribute of an existing module is fine
                    if not (isinstance(node, ast.ImportFrom) and node.module is None and exists(name)):
                        missing.append(f"{file.relative_to(ROOT)}:{node.lineno} imports {n}")
    assert not missing, "\n".join(missing)
