"""Reports of a run, all derived from manifest.json: parity.json, report.md and report.html.

`write_reports` is called at the end of every build and by `omni-export report` / `parity`.
Heavy imports (matplotlib, jinja2, scipy) happen inside, so importing this package is instant.
"""
from __future__ import annotations

import json
from pathlib import Path

REPORT_FILES = ("parity.json", "report.md", "report.html")


def write_reports(root: Path, manifest: dict, regated: dict | None = None, write=None) -> list[Path]:
    """Write the three reports into `root` atomically; a re-gating record, when given, is shown
    beside the manifest's verdicts (and stored in parity.json's "regated"). `write(name, text)` is
    the build's store during a run (so its journal knows the files); plain atomic writes otherwise."""
    from ..artifacts.store import atomic_write_text
    from ..parity.report import parity_json
    from . import html, markdown

    root = Path(root)
    texts = {
        "parity.json": json.dumps(parity_json(manifest, regated), indent=2, allow_nan=False) + "\n",
        "report.md": markdown.summary(manifest, regated),
        "report.html": html.render(root, manifest, regated),
    }
    for name, text in texts.items():
        if write is not None:
            write(name, text)
        else:
            atomic_write_text(root / name, text)
    return [root / n for n in REPORT_FILES]
