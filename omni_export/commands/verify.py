"""`omni-export verify OUT_DIR`: re-hash every artifact against the manifest; --rescore re-runs parity.

Exit codes: 0 clean, 3 drift (missing / changed / unlisted files, an unfinished run, scores that
moved), 2 bad input (OUT is not a build directory).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EXIT_CLEAN, EXIT_USAGE, EXIT_DRIFT = 0, 2, 3


@click.command("verify")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--rescore", is_flag=True,
              help="also re-run every listed artifact on its runner with the held-out inputs kept in "
                   "OUT/parity-inputs and compare with the recorded scores")
@click.option("--tolerance-db", type=float, default=0.1, show_default=True,
              help="--rescore: largest SNR change (dB) that is not drift")
@click.option("--json", "as_json", is_flag=True, help="print the findings as JSON on stdout")
@click.option("--debug", is_flag=True, help="show tracebacks")
def verify(out_dir: Path, rescore: bool, tolerance_db: float, as_json: bool, debug: bool):
    """Check a build directory against its manifest: every listed file and report (parity.json,
    report.md, report.html) present with its sha256, no unlisted files, no unfinished run.
    Exit 0 clean, 3 drift, 2 bad input."""
    from ..artifacts.integrity import check_files, load_manifest
    from ..core import UsageError

    try:
        manifest, findings = load_manifest(out_dir)
    except UsageError as e:
        if debug:
            raise
        click.echo(f"omni-export: error: {e}", err=True)
        sys.exit(EXIT_USAGE)
    rows = []
    if manifest is not None:
        findings += check_files(out_dir, manifest)
        if rescore and not any(f.kind in ("missing", "changed") for f in findings):
            from ..parity.rescore import rescore as run_rescore

            more, rows = run_rescore(out_dir, manifest, tolerance_db)
            findings += more
        elif rescore:
            findings.append(_not_rescored())
    _print(out_dir, manifest, findings, rows, as_json)
    sys.exit(EXIT_DRIFT if findings else EXIT_CLEAN)


def _not_rescored():
    from ..artifacts.integrity import Finding

    return Finding("rescore", ".", "not rescored: files differ from the manifest (fix or rebuild first)")


def _print(out: Path, manifest, findings, rows, as_json: bool) -> None:
    n_files, n_reports = None, 0
    if manifest is not None:
        from ..artifacts.store import listed_files

        n_files = len(listed_files(manifest))
        docs = manifest.get("documents")
        n_reports = len(docs) if isinstance(docs, list) else 0
    if as_json:
        click.echo(json.dumps({"out": str(out), "clean": not findings, "files_checked": n_files,
                               "reports_checked": n_reports,
                               "findings": [f.to_json() for f in findings], "rescored": rows}, indent=2))
        return
    for f in findings:
        click.echo(f.line())
    for r in rows:
        if r.get("skipped"):
            click.echo(f"rescore    {r['name']} ({r['format']}): skipped, {r['skipped']}")
        elif r.get("outputs"):
            dbs = ", ".join([f"{n} {db} dB" for n, db in r["outputs"].items()]
                            + [f"{n} agreement {100 * a:.1f}%" for n, a in (r.get("agreement") or {}).items()])
            click.echo(f"rescore    {r['name']} ({r['format']}): {dbs}")
    verdict = "clean" if not findings else f"{len(findings)} finding(s): drift"
    reports = f" and {n_reports} reports" if n_reports else ""
    click.echo(f"{out}: {n_files if n_files is not None else 'no'} listed files{reports} checked; {verdict}")
