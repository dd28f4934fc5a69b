"""`omni-export report | parity | diff`: reports and CI gates from existing output directories.

Nothing here builds or runs a model: everything comes from manifest.json (and the WAVs under
samples/). Errors are one line on stderr with exit 2 (--debug for a traceback); a failed gate
is exit 3.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from ..core import UsageError

EXIT_OK, EXIT_USAGE, EXIT_FAILED = 0, 2, 3
MANIFEST_SCHEMA_VERSION = 1
CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

SUMMARY_TO = dict(type=click.Path(dir_okay=False), default=None, metavar="FILE",
                  help="append the Markdown summary (report.md) to FILE, e.g. "
                       "--summary-to \"$GITHUB_STEP_SUMMARY\"")
summary_option = click.option("--summary-to", **SUMMARY_TO)
debug_option = click.option("--debug", is_flag=True, help="show tracebacks")


def summary_param() -> click.Option:
    """--summary-to for commands built as click.Command objects (the recipe build commands)."""
    return click.Option(["--summary-to"], **SUMMARY_TO)


def register(group: click.Group) -> None:
    for command in (report_cmd, parity_cmd, diff_cmd):
        group.add_command(command)


# ------------------------------------------------------------------------------------------ helpers

@contextlib.contextmanager
def one_line_errors(debug: bool):
    """Bad input -> `omni-export: error: ...` on one line, exit 2 (as cli.py's _fail does)."""
    try:
        yield
    except (UsageError, OSError, ValueError, KeyError) as e:
        if debug:
            import traceback

            traceback.print_exc()
        message = f"manifest.json lacks the field {e}" if isinstance(e, KeyError) else str(e)
        click.echo(f"omni-export: error: {one_line(message)}", err=True)
        sys.exit(EXIT_USAGE)


def one_line(text) -> str:
    """A message as one line of printable text: the strings of a manifest it quotes can hold line
    breaks and terminal escapes."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())


def load_manifest(path: str | Path) -> tuple[Path, dict]:
    """(output directory, manifest) from an output directory or a manifest.json path, checked by
    artifacts.manifest.read_manifest (JSON, schema, every listed path inside OUT)."""
    from ..artifacts.manifest import read_manifest

    path = Path(path)
    root, file = (path.parent, path) if path.suffix == ".json" else (path, path / "manifest.json")
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"{path}: no such file or directory")
    if not file.exists() and not file.is_symlink():
        raise UsageError(f"{root}: no manifest.json; run a build first (omni-export qwen3-tts --out {root})")
    if (root / ".incomplete").exists():
        raise UsageError(f"{root} holds an unfinished run (.incomplete); rerun the build")
    return root, read_manifest(root, file)


def append_summary(path: str | None, text: str) -> None:
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\n\n")
    except OSError as e:
        raise UsageError(f"--summary-to {path}: cannot append ({e.strerror})") from None


def _gates(text: str | None) -> dict[str, float]:
    from ..parity.gate import parse_gates

    return {p.value: db for p, db in parse_gates(text).items()}


# ------------------------------------------------------------------------------------------ report

@click.command("report", context_settings=CTX)
@click.argument("out_dir", type=click.Path())
@summary_option
@debug_option
def report_cmd(out_dir, summary_to, debug):
    """Regenerate report.md, report.html and parity.json of OUT_DIR from its manifest.json.

    Nothing is rebuilt or rerun: scores, verdicts and provenance come from manifest.json, the
    audio figures from the WAVs under OUT_DIR/samples/. A re-gating recorded by `omni-export
    parity` is kept (run `omni-export parity OUT_DIR` without --gate to drop it).

    \b
    Example:
      omni-export report artifacts/qwen3-tts-s25-htp --summary-to "$GITHUB_STEP_SUMMARY"

    Exit codes: 0 written; 2 bad input (no manifest, unfinished run, unreadable file).
    """
    from ..reports import refresh_reports

    with one_line_errors(debug):
        root, m = load_manifest(out_dir)
        paths = refresh_reports(root, m)
        append_summary(summary_to, (root / "report.md").read_text())
    click.echo("wrote " + ", ".join(str(p) for p in paths))


# ------------------------------------------------------------------------------------------ parity

@click.command("parity", context_settings=CTX)
@click.argument("out_dir", type=click.Path())
@click.option("--gate", default=None, metavar="PREC=DB,...",
              help="new gates in dB of SNR, e.g. --gate fp16=45,w8a16=32; precisions not named keep "
                   "the gate they were built with")
@click.option("--fail-under", type=float, default=None, metavar="DB",
              help="also fail (exit 3) when an accepted build's lowest SNR is under DB")
@click.option("--json", "as_json", is_flag=True, help="print the re-gating record as JSON instead of the table")
@summary_option
@debug_option
def parity_cmd(out_dir, gate, fail_under, as_json, summary_to, debug):
    """Re-judge the builds in OUT_DIR against new gates, without rebuilding anything.

    The recorded per-output SNRs are compared with the new thresholds (a NaN/Inf output stays
    rejected, a build that failed to lower or run stays rejected). manifest.json keeps the
    build-time verdicts and no file moves; the re-gating is stored in parity.json under
    "regated" and shown by report.md and report.html. Without --gate and --fail-under the
    build-time gates apply again and a previous re-gating is dropped.

    \b
    Examples:
      omni-export parity artifacts/qwen3-tts-s25-htp --gate fp16=45,w8a16=32
      omni-export parity OUT --fail-under 35 --summary-to "$GITHUB_STEP_SUMMARY"

    Exit codes: 0 every component has a passing build (and none is under --fail-under);
    2 bad input; 3 some component has no passing build, or a build is under --fail-under.
    """
    from ..parity.regate import failed, regate
    from ..reports import write_reports

    with one_line_errors(debug):
        root, m = load_manifest(out_dir)
        gates = _gates(gate)
        if fail_under is not None and fail_under != fail_under:
            raise UsageError("--fail-under expects a number of dB")
        record = regate(m, gates, fail_under)
        write_reports(root, m, record if (gates or fail_under is not None) else None)
        text = (root / "report.md").read_text()
        append_summary(summary_to, text)
    click.echo(json.dumps(record, indent=2) if as_json else text)
    sys.exit(EXIT_FAILED if failed(record) else EXIT_OK)


# -------------------------------------------------------------------------------------------- diff

@click.command("diff", context_settings=CTX)
@click.argument("out_a", type=click.Path())
@click.argument("out_b", type=click.Path())
@click.option("--tolerance", type=float, default=1.0, show_default=True, metavar="DB",
              help="a drop larger than this many dB on any output is a regression")
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON instead of the table")
@summary_option
@debug_option
def diff_cmd(out_a, out_b, tolerance, as_json, summary_to, debug):
    """Compare the scores of two runs, build by build (B against A, e.g. a PR against main).

    Builds are matched by component, format and precision; the table gives each output's SNR in
    A and B and the change in dB, and says what else differs (weights, inputs, options,
    toolchain). A regression is a drop of more than --tolerance dB, an output that became
    NaN/Inf or was no longer scored, a build accepted in A and rejected in B, or an accepted
    build B did not build. OUT_A and OUT_B are output directories or manifest.json files.

    \b
    Example:
      omni-export diff baseline/ artifacts/qwen3-tts-s25-htp --tolerance 0.5

    Exit codes: 0 no regression; 2 bad input; 3 at least one regression.
    """
    from ..parity.diff import compare
    from ..core import strict_json
    from ..reports.markdown import diff_summary

    with one_line_errors(debug):
        if not tolerance >= 0:
            raise UsageError("--tolerance expects a non-negative number of dB")
        (root_a, a), (root_b, b) = load_manifest(out_a), load_manifest(out_b)
        if a["recipe"]["name"] != b["recipe"]["name"]:
            raise UsageError(f"A is a {a['recipe']['name']} run and B a {b['recipe']['name']} run; "
                             f"nothing to compare")
        result = compare(a, b, tolerance)
        text = diff_summary(result, str(root_a), str(root_b))
        append_summary(summary_to, text)
    click.echo(json.dumps(strict_json(result), indent=2, allow_nan=False) if as_json else text)
    sys.exit(EXIT_FAILED if result["regressions"] else EXIT_OK)
