"""Reports of a run, all derived from manifest.json: parity.json, report.md and report.html.

`write_reports` is called at the end of every build and by `omni-export report` / `parity`.
Heavy imports (matplotlib, jinja2, scipy) happen inside, so importing this package is instant.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..artifacts.store import REPORT_FILES
from ..core import UsageError


def write_reports(root: Path, manifest: dict, regated: dict | None = None, write=None) -> list[Path]:
    """Write the three reports into `root` atomically; a re-gating record, when given, is shown
    beside the manifest's verdicts (and stored in parity.json's "regated"). `write(name, text)` is
    the build's store during a run (so its journal knows the files). Without it (`omni-export
    report` / `parity` on a finished build) the writes take OUT's lock and manifest.json is
    rewritten with the new reports' hashes, so `verify` stays clean and catches later edits."""
    from ..artifacts.store import Store
    from .parity import parity_json
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


def refresh_reports(root: Path, manifest: dict, write=None) -> list[Path]:
    """write_reports, keeping the re-gating a previous `omni-export parity` recorded in parity.json."""
    from ..parity.regate import regate

    old = recorded_regate(Path(root))
    return write_reports(root, manifest, regate(manifest, old["gates_db"], old.get("fail_under_db")) if old else None,
                         write=write)


def recorded_regate(root: Path) -> dict | None:
    """The re-gating a previous `omni-export parity` stored in parity.json, if any (a parity.json that
    is not a regular file of OUT, or not JSON, holds none; a damaged re-gating record is an error)."""
    from ..artifacts.manifest import MANIFEST_BYTES

    path = root / "parity.json"
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MANIFEST_BYTES:
        return None
    try:
        p = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    old = p.get("regated") if isinstance(p, dict) and p.get("schema_version") == 2 else None
    if old is None:
        return None
    gates, floor = old.get("gates_db") if isinstance(old, dict) else None, (old or {}).get("fail_under_db")
    if not (isinstance(gates, dict) and all(_finite_number(v) for v in gates.values())
            and (floor is None or _finite_number(floor))):
        raise UsageError(f"{path}: its \"regated\" record is damaged (gates_db must map precisions to dB, "
                         f"fail_under_db a number or null); `omni-export parity {root}` rewrites it")
    return old


def _finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
