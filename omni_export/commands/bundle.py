"""`omni-export bundle OUT_DIR`: what to ship (artifacts/bundle.py; docs/bundle.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EXIT_USAGE = 2


@click.command("bundle", context_settings={"max_content_width": 100})
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--into", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="where to write the bundle [default: OUT_DIR/bundle, which every build also writes]; an "
                   "existing DIR must be empty or an older bundle (it is replaced)")
@click.option("--pick", multiple=True, metavar="COMPONENT=FORMAT:PRECISION",
              help="ship this accepted build for COMPONENT instead of the policy's choice, e.g. "
                   "--pick code2wav=onnx:fp16 (repeat for more components)")
@click.option("--json", "as_json", is_flag=True, help="print the bundle's record (files, sha256, bytes) as JSON")
@click.option("--debug", is_flag=True, help="show tracebacks")
def bundle(out_dir: Path, into: Path | None, pick: tuple, as_json: bool, debug: bool):
    """Gather what an app ships from build OUT_DIR: per component the ONE accepted artifact the
    target should run, runtime.json (graphs, I/O names, shapes and dtypes, KV-cache layout and
    update rule, sampling defaults, Code2Wav streaming, speakers and languages, tokenizer files,
    sample rate, toolchain versions, and the parity evidence and sha256 of exactly these files;
    schema: omni_export/schemas/runtime.schema.json) and a README.md for app developers.

    \b
    Policy, per component: the accepted build in the format its unit runs best
    (HTP: context binary > DLC > ONNX > .pte; GPU: ONNX; CPU: .pte > ONNX), the
    smallest accepted in that format (a tie: the lower precision).
    Rejected builds are never bundled. Files are hard-linked inside OUT_DIR, else copied.

    \b
      omni-export bundle artifacts/qwen3-tts-s25-htp
      omni-export bundle artifacts/qwen3-tts-s25-htp --into ship/ --pick code2wav=ctx:fp16
      omni-export synth qwen3-tts --bundle ship/ --text "Hello." --wav hello.wav

    Exit 0 written; 2 bad input (one line)."""
    from ..artifacts import bundle as bd
    from ..artifacts.manifest import read_manifest
    from ..artifacts.store import MARKER
    from ..core import UsageError
    from ..recipes import bundle_host

    try:
        if not (out_dir / "manifest.json").exists():
            raise UsageError(f"{out_dir}: no manifest.json (not an omni-export build directory)")
        if (out_dir / MARKER).exists():
            raise UsageError(f"{out_dir} holds an unfinished run ({MARKER}); rerun the build")
        m = read_manifest(out_dir)
        picks = bd.parse_picks(pick)
        default = out_dir / "bundle"
        if into is not None and bd.within(into, out_dir) and Path(into).resolve() != default.resolve():
            raise UsageError(f"--into {into} lies inside {out_dir}, whose manifest lists only its bundle/ (verify "
                             f"would report the files as unlisted); omit --into, or pass a directory outside it")
        rec = bd.write(out_dir, m, bundle_host, into or default, picks)
        if into is None or Path(into).resolve() == default.resolve():
            _record(out_dir, m, rec)
    except UsageError as e:
        if debug:
            raise
        click.echo(f"omni-export: error: {e}", err=True)
        sys.exit(EXIT_USAGE)
    if as_json:
        click.echo(json.dumps(rec, indent=2))
        return
    from ..reports.view import human_bytes

    for comp, what in rec["graphs"].items():
        click.echo(f"{comp:22s} {what}")
    if rec.get("note"):
        click.echo(f"note: {rec['note']}")
    click.echo(f"{into or out_dir / 'bundle'}: {len(rec['graphs'])} graph(s), {len(rec['files'])} files, "
               f"{human_bytes(rec['bytes'])} (runtime.json, README.md)")


def _record(out: Path, m: dict, rec: dict) -> None:
    """OUT's own bundle is recorded in its manifest and reports (verify checks its files)."""
    from ..reports import refresh_reports

    m["bundle"] = rec
    refresh_reports(out, m)
