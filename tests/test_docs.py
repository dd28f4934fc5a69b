"""The docs site and the front page: `mkdocs build --strict` passes (every page of docs/ in the nav, every
link and anchor resolving), README.md's relative links name files that exist, and --help teaches
(what an option does and its default) rather than recording how long something once took."""
import os
import re
import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
README_MAX_BYTES = 15 * 1024


def test_mkdocs_build_strict_passes_and_builds_every_page(tmp_path):
    # not --quiet: it hides the warnings that --strict counts, and the build passes whatever they say
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    pages = sorted(p.relative_to(ROOT / "docs").with_suffix("") for p in (ROOT / "docs").rglob("*.md"))
    for page in pages:
        built = site / ("index.html" if page.name == "index" else page / "index.html")
        assert built.is_file(), f"docs/{page}.md was not built"


def _links(markdown: str) -> list[str]:
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)          # links in code blocks are not links
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_readme_is_short_and_its_relative_links_resolve():
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= README_MAX_BYTES, f"README.md is {readme.stat().st_size} bytes"
    links = _links(readme.read_text())
    relative = [u for u in links if not re.match(r"[a-z]+:", u) and not u.startswith("#")]
    assert relative, "README.md links nowhere into the repository"
    missing = [u for u in relative if not (ROOT / u.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def _help_texts(cmd: click.Command, path: str, parent=None):
    ctx = click.Context(cmd, info_name=path.rsplit(" ", 1)[-1], parent=parent)
    yield path, cmd.help or ""
    for p in cmd.params:
        if isinstance(p, click.Option):
            yield f"{path} {p.opts[0]}", p.help or ""
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            yield from _help_texts(cmd.get_command(ctx, name), f"{path} {name}", ctx)


# A duration in --help is an audio length ("100 = 4 s", "80 ms frames", "10 s by default"), never a
# timing; no commit SHAs, no "took" / "measured".
_HISTORY = re.compile(r"\btook\b|\bmeasured\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
_DURATION = re.compile(r"(?<![\d.])(?<!= )\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:s|ms|min|minutes|seconds)\b"
                       r"(?! frames| by default)")


def test_help_texts_teach_without_timings_or_commit_shas():
    from omni_export.cli import main

    found = []
    for where, text in _help_texts(main, "omni-export"):
        flat = " ".join(text.split())
        for rx in (_HISTORY, _DURATION):
            found += [f"{where}: ...{flat[max(m.start() - 40, 0):m.end() + 20]}..." for m in rx.finditer(flat)]
    assert not found, "\n".join(found)
    assert _DURATION.search("1 prepares fast (the frame: 23 s)") and _HISTORY.search("at 1b0db06")
