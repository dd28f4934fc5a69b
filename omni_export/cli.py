"""omni-export command line: flags -> options -> pipeline.run(). Nothing else lives here."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import click

from . import __version__, qnn_ep
from .commands import hub as hub_cli
from .commands import reports
from .commands.bundle import bundle
from .commands.group import OneLineErrors
from .commands.latency import latency
from .commands.verify import verify
from .core import UNITS, Format, Precision, UsageError, strict_json
from .parity.gate import parse_gates
from .recipes import REGISTRY, get_recipe
from .targets import FORMAT_PRECISIONS, REWRITE_NAMES, TARGETS, get_target, parse_place

EXIT_USAGE, EXIT_REJECTED = 2, 3


class _Console:
    """Progress on stderr (rich), silent with --quiet: one line per finished stage or job, and one
    live line below them with the jobs done of all and what runs now, with its elapsed time."""

    def __init__(self, quiet: bool):
        import threading

        from rich.console import Console

        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)   # a log keeps whole lines
        self._status = None
        self._lock = threading.RLock()          # stages run in the driver thread, jobs end in the main one
        self._stages: list[str] = []
        self._jobs = ""

    def _show(self) -> None:
        with self._lock:
            text = " | ".join([*self._stages, *([self._jobs] if self._jobs else [])])
            if text and self._status is None:
                self._status = self.console.status(text)
                self._status.start()
            elif text:
                self._status.update(text)
            elif self._status is not None:
                self._status.stop()
                self._status = None

    @contextlib.contextmanager
    def stage(self, text: str):
        from rich.markup import escape

        from .progress import StageNote

        note = StageNote()
        if self.quiet:
            yield note
            return
        t0 = time.time()
        with self._lock:
            self._stages.append(escape(text))
            self._show()
        try:
            yield note
        except BaseException:
            self.console.print(f"[red]✗[/red] {escape(text)} ({time.time() - t0:.1f}s)")
            raise
        finally:
            with self._lock:
                self._stages.remove(escape(text))
                self._show()
        found = f": {escape(note.text)}" if note.text else ""
        took = f"ran {note.seconds:.1f}s" if note.seconds is not None else f"{time.time() - t0:.1f}s"
        mark = "[yellow]✗[/yellow]" if note.failed else "[green]✓[/green]"
        self.console.print(f"{mark} {escape(text)}{found} [dim]({took})[/dim]")

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)

    def job_started(self, text: str) -> None:
        pass

    def job_finished(self, text: str, note) -> None:
        from rich.markup import escape

        if self.quiet:
            return
        found = f": {escape(note.text)}" if note.text else ""
        mark = "[yellow]✗[/yellow]" if note.failed else "[green]✓[/green]"
        self.console.print(f"{mark} {escape(text)}{found} [dim](ran {note.seconds or 0:.1f}s)[/dim]")

    def jobs_status(self, running, done: int, total: int) -> None:
        if self.quiet:
            return
        from rich.markup import escape

        with self._lock:
            self._jobs = (f"[{done}/{total} jobs] " + "; ".join(f"{escape(label)} {t:.0f}s" for label, t in running[:3])
                          if running else "")
            self._show()


@contextlib.contextmanager
def _native_stdout_to_stderr():
    """Native libraries (QNN) print to fd 1; keep stdout for our report and --json only."""
    import os

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _fail(message: str, debug: bool, code: int = EXIT_USAGE):
    if debug:
        import traceback

        traceback.print_exc()
    click.echo(f"omni-export: error: {message}", err=True)
    sys.exit(code)


def _csv(enum_cls, text: str | None) -> tuple:
    if not text:
        return ()
    return tuple(enum_cls.parse(t) for t in text.split(",") if t.strip())


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="omni-export")
def main():
    """Export on-device speech and language models to ExecuTorch, ONNX and QNN, score every build
    against fp32 on real runtimes, and reject the broken ones.

    \b
    Try it on the embedded demo checkpoint (tiny, random weights):
      omni-export qwen3-tts --target s25-htp
    Then on your own checkpoint:
      omni-export qwen3-tts --target s25-htp --checkpoint ./Qwen3-TTS-12Hz-0.6B-CustomVoice
    An LLM (prefill + decode graphs, ring-buffer KV), then text through its graphs:
      omni-export spark --target s25-htp --checkpoint ./Spark-X2.5-1.7B
      omni-export synth spark --build artifacts/spark-s25-htp --runner htp --prompt "Hi"
    MiniCPM-o's voice path (TTS head, flow encoder, DiT step, HiFT vocoder), hidden states to codes:
      omni-export minicpm-o --target s25-htp
      omni-export synth minicpm-o --build artifacts/minicpm-o-s25-htp --runner htp --codes-out c.npy

    Exit codes: 0 every component has an accepted build; 2 bad input; 3 some component has none;
    130 interrupted. `omni-export COMMAND --help` explains every option.
    """
    import warnings

    # torch/executorch deprecation chatter is for their developers, not for our users
    # (pytest keeps its own filters; --debug does not restore these, tracebacks do not need them)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from .quiet import quiet_library_logs

    quiet_library_logs()


@main.command("list")
def list_cmd():
    """Recipes, components, targets, precisions and formats."""
    click.echo("recipes:")
    for name in REGISTRY:
        r = get_recipe(name)
        click.echo(f"  {name:12s} {r.doc}")
        if r.also_attempt:
            click.echo(f"  {'':12s} default plan also attempts {','.join(p.value for p in r.also_attempt)} "
                       f"(gated; where the unit runs them)")
        width = max(len(c.name) for c in r.components)           # one column per recipe, aligned
        for c in r.components:
            click.echo(f"    {c.name:{width}s}  {c.doc}")
    click.echo("targets:")
    for t in TARGETS.values():
        click.echo(f"  {t.name:12s} {t.device}; formats {','.join(f.value for f in t.formats)}; "
                   f"default precisions {','.join(p.value for p in t.default_precisions)}")
        rest = t.place("")
        roles = "".join(f"{role}s on the {t.units[unit].unit_name}, " for role, unit in t.roles.items())
        click.echo(f"  {'':12s} placement: {roles}{'the other components' if roles else 'every component'} on the "
                   f"{rest.unit_name} (--place COMPONENT=UNIT moves one)")
        for unit, place in t.units.items():
            click.echo(f"  {'':12s}   {UNITS[unit]}: {','.join(f.value for f in place.formats if f in t.formats)} at "
                       f"{','.join(p.value for p in place.precisions)} (AI Hub --compute_unit "
                       f"{place.hub_compute_unit})")
    click.echo("precisions: " + ", ".join(p.value for p in Precision.requestable())
               + " (and <precision>-mixed: precision repair's, from a rejected build)")
    click.echo("formats:")
    for f in Format:
        click.echo(f"  {f.value:5s} .{f.extension:9s} precisions {','.join(p.value for p in FORMAT_PRECISIONS[f])}")


def _recipe_command(name: str) -> click.Command:
    recipe = get_recipe(name)

    def callback(target, checkpoint, components, precision, formats, out, as_json, force, attribution, no_attribution,
                 rewrites, jobs, executor, shared_dir, gate, sim_samples, htp_optimization, max_memory, quiet, debug, summary_to,
                 keep_sources, repair, repair_steps, place, **recipe_opts):
        from .faults import interrupted_by, interrupts_latched
        from .hf import resolve_checkpoint
        from .pipeline import RunOptions, run

        try:
            hub_opts = hub_cli.take_options(recipe_opts)
            tgt = get_target(target)
            comps = tuple(c.strip() for c in components.split(",")) if components else ()
            for c in comps:
                recipe.component(c)
            opts = RunOptions(
                recipe=recipe, target=tgt,
                out=Path(out) if out else Path("artifacts") / f"{name}-{tgt.name}",
                checkpoint=Path(resolve_checkpoint(checkpoint)) if checkpoint else None, components=comps,
                precisions=_csv(Precision, precision), formats=_csv(Format, formats),
                recipe_options={k.replace("_", "-"): v for k, v in recipe_opts.items()},
                attribution="off" if no_attribution else attribution, rewrites=_rewrites(rewrites, tgt), force=force,
                jobs=jobs or 0, executor=executor, shared_dir=shared_dir, gates=parse_gates(gate), sim_samples=sim_samples,
                htp_finalize=htp_optimization,
                max_memory=int(max_memory * 1e9) if max_memory else None,
                keep_sources=keep_sources or hub_opts is not None, repair=repair, repair_steps=repair_steps,
                place=parse_place(place))
            pre = hub_cli.preflight(hub_opts, tgt, opts.out)
            console = _Console(quiet)           # --json: progress on stderr, stdout only the JSON
            with _native_stdout_to_stderr(), interrupts_latched():
                result = run(opts, console)
                result.manifest, result.exit_code, notes = hub_cli.after_build(result, hub_opts, pre, console)
            reports.append_summary(summary_to, (result.out / "report.md").read_text())
        except UsageError as e:
            _fail(str(e), debug)
        except hub_cli.HubInterrupted as e:
            _fail(str(e), debug, 130)
        except KeyboardInterrupt:
            import signal

            from .artifacts.store import interrupted_message

            by = interrupted_by()
            _fail(interrupted_message(Path(out) if out else Path("artifacts") / f"{name}-{target}", by), debug,
                  128 + signal.Signals[by].value)
        m = result.manifest
        if as_json:
            click.echo(json.dumps(strict_json({"out": str(result.out), "exit_code": result.exit_code,
                                   "summary": m["summary"],
                                   "builds": [_json_build(m, b) for b in m["builds"]]}), indent=2, allow_nan=False))
        else:
            _print_report(result.out)
            for n in notes:
                click.echo(n)
        sys.exit(result.exit_code)

    params = [
        click.Option(["--target", "-t"], default="s25-htp", show_default=True,
                     help=f"device to build for: {', '.join(TARGETS)}"),
        click.Option(["--checkpoint", "-c"], type=click.Path(), default=None,
                     help="checkpoint directory in the official layout, or a Hugging Face repository "
                          "ORG/NAME[@REVISION] (safetensors, JSON and tokenizer files fetched into the HF "
                          "cache; HF_HUB_OFFLINE=1 reads the cache only); default: a tiny seeded demo "
                          "checkpoint (random weights) written into the output directory"),
        click.Option(["--components"], default=None,
                     help=f"comma-separated subset of: {', '.join(c.name for c in recipe.components)}"),
        click.Option(["--precision", "-p"], default=None,
                     help="comma-separated precisions (fp32, fp16, w8a16, w8a8, w4a16); default: the target's ladder"),
        click.Option(["--formats", "-f"], default=None,
                     help="comma-separated formats (onnx, pte, dlc, ctx); default: all the target builds"),
        click.Option(["--out", "-o"], type=click.Path(), default=None,
                     help=f"output directory [default: artifacts/{name}-TARGET]"),
        click.Option(["--json", "as_json"], is_flag=True,
                     help="print a JSON summary on stdout: each build's verdict, and the lowest SNR and "
                          "agreement over the outputs its gate read"),
        click.Option(["--force"], is_flag=True, help="rebuild every build (skip the build cache) and replace an output directory "
                                                       "holding another recipe's or target's build; inputs captured "
                                                       "from the fp32 model are still read from the capture cache "
                                                       "(OMNI_EXPORT_CAPTURE_CACHE=off captures them again)"),
        click.Option(["--attribution"], type=click.Choice(["auto", "all", "off"]), default="auto", show_default=True,
                     help="per-block fidelity (each block lowered alone, fed fp32 activations): auto runs it "
                          "for the precisions that have a rejected build, to say which block lost the dB, on "
                          "ORT CPU when that precision's ONNX build already scored low there and no build failed (else on the "
                          "target's runner: the HTP simulator); all runs every precision on the target's runner"),
        click.Option(["--no-attribution"], is_flag=True, help="same as --attribution off"),
        click.Option(["--rewrites"], default=None, metavar="LIST",
                     help="HTP-safe graph rewrites: comma-separated names, or 'none' to see what they "
                          f"fix; default: the target's. Known: {', '.join(REWRITE_NAMES)}"),
        click.Option(["--gate"], default=None, metavar="PREC=DB,...",
                     help="override the recipe's gates in dB of SNR, e.g. --gate fp16=45,w8a16=32"),
        click.Option(["--jobs", "-j"], type=click.IntRange(0, 1024), default=None, envvar="OMNI_EXPORT_JOBS",
                     help="worker processes: every job of the build (ONNX export, quantization, QNN compiles, "
                          ".pte lowering, one scoring run per build) runs on one, across components, longest "
                          "chain first [default, or 0: one per core, as memory allows; 1: everything in the "
                          "build process; env OMNI_EXPORT_JOBS]"),
        click.Option(["--executor"], default="local", show_default=True, metavar="local|ray[:ADDRESS]",
                     help="where the jobs run: worker processes on this machine, or a Ray cluster (pip install "
                          "'omni-export[ray]'; ray:ADDRESS joins a running one, e.g. ray:auto)"),
        click.Option(["--shared-dir"], default=None, metavar="DIR",
                     help="with --executor ray: a directory every node can read and write (mounted at this "
                          "path on each); the files jobs read and write (checkpoint, graphs, artifacts) go "
                          "there by content hash instead of through Ray's object store [default: the object "
                          "store]; a node that already holds a file at its path is not sent it"),
        click.Option(["--sim-samples"], type=click.IntRange(min=0), default=None, metavar="N",
                     help="held-out samples each build scores on the slow runners (the HTP simulator; "
                          "ExecuTorch portable kernels for w8a16 .pte). Default: all of them, except 2 for "
                          "graphs past 256 MB of weights (a recipe may ask for more: Qwen3-TTS's fused predictor "
                          "frame, 4), those the ONNX build scored worst on ORT CPU (else evenly spread); 0: all. ORT CPU always scores every held-out sample. "
                          "Example: --sim-samples 0 to gate a real-size build on every sample"),
        click.Option(["--htp-optimization"], type=click.Choice(list(qnn_ep.FINALIZE_MODES)),
                     default=qnn_ep.DEFAULT_FINALIZE, show_default=True,
                     help="QNN HTP graph finalization for context binaries and simulator runs: 1 prepares "
                          "fastest, 2 (QNN's default) and 3 search longer for a faster on-device graph. "
                          "Use 2 or 3 for the context binaries you ship; DLCs are the same at every level. A "
                          "repair step whose simulator crashes at 1 runs again at 2, as do its later steps"),
        click.Option(["--max-memory"], type=FINITE_GB, default=None, metavar="GB",
                     help="let the heavy steps of big graphs (QNN compile and quantizer children, simulator "
                          "and ONNX Runtime scoring workers, .pte lowering) overlap while their estimated peaks "
                          "fit in about this many GB (1e9 bytes) of process tree: faster with room to spare, "
                          "one after another when tight. Default: a QNN compile or quantization that reserves "
                          "2 GiB or more runs only beside steps that fit with it within the largest such "
                          "reservation (the tree peaks at the largest step), and the other steps overlap "
                          "while they fit in the memory free at the build's start"),
        click.Option(["--keep-sources"], is_flag=True,
                     help="keep sources/: the ONNX each accepted build is compiled from, which `omni-export hub "
                          "submit` uploads to AI Hub [default: off; --hub keeps them]"),
        click.Option(["--repair"], type=click.Choice(["auto", "off"]), default="auto", show_default=True,
                     envvar="OMNI_EXPORT_REPAIR",
                     help="precision repair: when a quantized build (w8a16, w8a8, w4a16) is rejected, keep its "
                          "worst blocks (per-block attribution) in float, one more per step, until the graph "
                          "passes the same gate on the same runner (a real-size transformer: its linears per "
                          "output channel first, then the layers an estimate says it needs at 16-bit weights; w4a16: "
                          "blocks raised to 8-bit weights, mixing 4- and 8-bit); the result is a build of its own "
                          "precision, e.g. w8a16-mixed, with the blocks kept and the share of weights still at the base "
                          "width; off: the "
                          "rejection stands [env OMNI_EXPORT_REPAIR]"),
        click.Option(["--repair-steps"], type=click.IntRange(0, 64), default=4, show_default=True, metavar="N",
                     help="precision repair's budget: at most N re-quantize, compile and score steps per rejected "
                          "precision of a component; a search that adds one block per step stops sooner when, at "
                          "the gain of its steps so far, the steps left could not reach the gate"),
        click.Option(["--place"], multiple=True, metavar="COMPONENT=UNIT",
                     help="run COMPONENT on UNIT of the target: npu (the Hexagon NPU; scored on the HTP simulator), "
                          "gpu (the Adreno GPU; judged on ONNX Runtime CPU at the same precision by proxy, re-judged "
                          "on the device with --hub) or cpu; repeatable or comma-separated, e.g. --place code2wav=npu. "
                          "Default: each component's role on the target (s25, s24: vocoders on the GPU), else the "
                          "target's NPU (the CPU for --target cpu)"),
        click.Option(["--quiet", "-q"], is_flag=True, help="no progress output"),
        click.Option(["--debug"], is_flag=True, help="show tracebacks"),
        reports.summary_param(),
        *hub_cli.build_params(),
    ]
    for o in recipe.options:
        if o.type is bool:
            params.append(click.Option([f"--{o.name}"], is_flag=True, default=o.default, help=o.help))
        else:
            kind = click.IntRange(*o.range) if o.type is int and o.range else o.type
            params.append(click.Option([f"--{o.name}"], type=kind, default=o.default,
                                       show_default=o.default is not None, help=o.help))
    return click.Command(name, callback=callback, params=params,
                         help=f"Export {recipe.doc}: every component, format and precision the target "
                              f"asks for, each scored against fp32 and gated.",
                         context_settings={"max_content_width": 100})


class _FiniteGB(click.ParamType):
    """A positive, finite number of GB, at most 1e6 (nan and inf pass click's FloatRange)."""
    name = "GB"

    def convert(self, value, param, ctx):
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of GB", param, ctx)
        if not (0 < x <= 1e6):           # also false for nan
            self.fail(f"{value!r} is not a positive, finite number of GB (at most 1e6)", param, ctx)
        return x


FINITE_GB = _FiniteGB()


def _rewrites(text: str | None, target) -> tuple[str, ...]:
    if text is None:
        return target.rewrites
    if text.strip().lower() == "none":
        return ()
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    for n in names:
        if n not in REWRITE_NAMES:
            raise UsageError(f"unknown rewrite '{n}'; valid: {', '.join(REWRITE_NAMES)}, none")
    return names


def _json_build(m: dict, b: dict) -> dict:
    """A build in --json: its verdict and the scores the gate read (as report.md shows them): the
    lowest SNR and the lowest agreement over the gated outputs (named in `gated_outputs`), None where
    no gated output has one."""
    from .artifacts.scores import gated, gated_outputs, min_snr_db

    outs = (b.get("parity") or {}).get("outputs") or []
    names = gated_outputs(m, b["component"])
    agree = [o["agreement"] for o in gated(outs, names) if o.get("agreement") is not None]
    return {"name": b["name"], "component": b["component"], "format": b["format"], "precision": b["precision"],
            "status": b["status"], "snr_db": min_snr_db(outs, names), "agreement": min(agree) if agree else None,
            "gated_outputs": [o["name"] for o in gated(outs, names)], "reason": b["parity"]["reason"]}


def _print_report(out: Path) -> None:
    from rich.console import Console
    from rich.markdown import Markdown

    text = (out / "report.md").read_text()
    if sys.stdout.isatty():
        Console(highlight=False).print(Markdown(text))
    else:
        click.echo(text)
    click.echo(f"\nArtifacts, manifest.json, parity.json, report.md and report.html in {out}")


@main.group("synth")
def synth_group():
    """Generate audio or text through a checkpoint's fp32 modules or a build's exported graphs."""


def _record_latency(kw: dict, summary: dict) -> None:
    """synth --build OUT --record-latency: the run's timing into OUT's manifest (hub/latency.py), its
    reports refreshed; a run that did not stream has nothing to record."""
    from .hub.latency import record
    from .reports import refresh_reports

    if summary.get("ttfa_ms") is None:
        summary.setdefault("notes", []).append("--record-latency: nothing recorded, this run did not stream "
                                               "(it has no time to first audio)")
        return
    record(Path(kw["build"]), summary, kw["runner"], refresh_reports=refresh_reports)
    summary["recorded_in"] = str(Path(kw["build"]) / "manifest.json")


def _synth_command(name: str, module_path: str) -> click.Command:
    import importlib

    module = importlib.import_module(module_path)

    def callback(as_json, debug, **kw):
        from .progress import frame_lines

        try:   # frames done / total with an ETA on stderr (progress.frame_lines)
            with _native_stdout_to_stderr(), frame_lines(lambda text: click.echo(text, err=True)):
                summary = module.run(**kw)
                if kw.get("record_latency"):
                    _record_latency(kw, summary)
        except UsageError as e:
            _fail(str(e), debug)
        for note in summary.get("notes") or []:
            click.echo(f"omni-export: note: {note}", err=True)
        if as_json:
            click.echo(json.dumps(strict_json(summary), indent=2, allow_nan=False))
        else:
            for k, v in summary.items():
                if v is not None and k != "notes":
                    click.echo(f"{k:11s} {v}")

    params = module.options() + [click.Option(["--debug"], is_flag=True, help="show tracebacks")]
    return click.Command(name, callback=callback, params=params, help=module.HELP,
                         context_settings={"max_content_width": 100})


for _name in REGISTRY:
    main.add_command(_recipe_command(_name))
    if get_recipe(_name).synth:
        synth_group.add_command(_synth_command(_name, get_recipe(_name).synth))
reports.register(main)
main.add_command(verify)
main.add_command(bundle)
main.add_command(latency)
hub_cli.register(main)


if __name__ == "__main__":  # pragma: no cover
    main()
