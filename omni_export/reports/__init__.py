"""Reports of a run, all derived from manifest.json: parity.json, report.md and report.html.

`write_reports` is called at the end of every build and by `omni-export report` / `parity`.
Heavy imports (matplotlib, jinja2, scipy) happen inside, so importing this package is instant.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..artifacts.store import REPORT_FILES


def write_reports(root: Path, manifest: dict, regated: dict | None = None, write=None) -> list[Path]:
    """Write the three reports into `root` atomically; a re-gating record, when given, is shown
    beside the manifest's verdicts (and stored in parity.json's "regated"). `write(name, text)` is
    the build's store during a run (so its journal knows the files). Without it (`omni-export
    report` / `parity` on a finished build) the writes take OUT's lock and manifest.json is
    rewritten with the new reports' hashes, so `verify` stays clean and catches later edits."""
    from ..artifacts.store import Store
    from ..parity.report import parity_json
    from . import html, markdown

    root = Path(root)
    texts = {
        "parity.json": json.dumps(parity_json(manifest, regated), indent=2, allow_nan=False) + "\n",
        "report.md": markdown.summary(manifest, regated),
        "report.html": html.render(root, manifest, regated),
    }
    if write is not None:
        for name, text in texts.items():
            write(name, text)
    else:
        Store(root).rewrite_reports(manifest, lambda put: [put(name, text) for name, text in texts.items()])
    return [root / n for n in REPORT_FILES]
