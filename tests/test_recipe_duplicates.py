"""No run of six or more lines is repeated between two recipe folders: what two families share lives once
below them (runtime/, modeling/). Lines are compared normalized (white space folded, comments, blank lines,
imports and lone punctuation dropped), as 6-line windows hashed per folder; a window in two folders fails."""
from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "omni_export" / "recipes"
WINDOW = 6


def normalized(text: str) -> list[tuple[int, str]]:
    """(line number, normalized text) of the lines that count."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        s = re.sub(r"\s+", " ", line.split("#", 1)[0] if not re.search(r"[\"'].*#", line) else line).strip()
        if not s or re.fullmatch(r"[()\[\]{},:;]+", s) or re.match(r"(from \S+ )?import ", s):
            continue
        out.append((i, s))
    return out


def windows(folder: Path) -> dict[str, str]:
    """sha256 of each 6-line window of the folder's .py files -> where it first stands (file:line)."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        lines = normalized(path.read_text())
        for k in range(len(lines) - WINDOW + 1):
            digest = hashlib.sha256("\n".join(s for _, s in lines[k:k + WINDOW]).encode()).hexdigest()
            found.setdefault(digest, f"{path.relative_to(folder.parent)}:{lines[k][0]}")
    return found


def shared(recipes: Path) -> list[str]:
    """One line per window that stands in two recipe folders."""
    seen: dict[str, str] = {}
    out = []
    for folder in sorted(p for p in recipes.iterdir() if p.is_dir() and p.name != "__pycache__"):
        for digest, where in windows(folder).items():
            if digest in seen:
                out.append(f"{where} repeats {seen[digest]}")
            else:
                seen[digest] = where
    return out


def test_no_six_line_run_is_shared_between_recipe_folders():
    found = shared(RECIPES)
    assert not found, f"{len(found)} shared 6-line windows; move the code below the recipes:\n" + "\n".join(found[:20])


def test_the_check_fails_when_a_block_is_pasted_into_two_recipes(tmp_path):
    copy = tmp_path / "recipes"
    shutil.copytree(RECIPES, copy, ignore=shutil.ignore_patterns("__pycache__"))
    block = "".join(f"    total_{i} = weights[{i}] * scale + offset  # step {i}\n" for i in range(WINDOW))
    pasted = f"\n\ndef pasted(weights, scale, offset):\n{block}    return total_0\n"
    for family in ("spark", "minicpm_o"):
        with open(copy / family / "model.py", "a") as f:
            f.write(pasted)
    found = shared(copy)
    # the pasted function's 8 counted lines make 3 windows of its own (more with the files' last lines)
    assert len(found) >= 3, found
    assert all(f.startswith("spark/model.py:") and " repeats minicpm_o/model.py:" in f for f in found), found
    assert shared(RECIPES) == []                # the tree itself stays clean
