"""`omni-export hub devices | submit | status`, and `--hub` on the build commands.

Credentials are the qai-hub client's own (~/.qai_hub/client.ini or QAIHUB_CLIENT_INI); a missing
or rejected token is one line on stderr with exit 2. Exit codes of submit (and of a build with
--hub): 0 every submitted component has a build accepted on the device (and every component an
accepted build); 2 bad input; 3 otherwise (rejected on the device, a FAILED job, or jobs still
running when --timeout ran out: rerun to keep waiting).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import click

from .reports import CTX, EXIT_USAGE, append_summary, debug_option, one_line, summary_option

QUANTIZE_ON = click.Choice(["local", "hub"])


def register(group: click.Group) -> None:
    group.add_command(hub_group)


@click.group("hub", context_settings=CTX)
def hub_group():
    """Qualcomm AI Hub: compile, profile and run accepted builds on real phones and gate their outputs.

    \b
    Configure the token once (the qai-hub client's own config, never copied by omni-export):
      qai-hub configure --api_token YOUR_TOKEN      # or QAIHUB_CLIENT_INI=/path/client.ini
    \b
      omni-export hub devices                       # what AI Hub can run on
      omni-export hub submit artifacts/qwen3-tts-s25
      omni-export hub status artifacts/qwen3-tts-s25
    """


def _errors(debug: bool):
    """One line on stderr, exit 2, token blanked out (also from --debug tracebacks)."""
    import contextlib
    import traceback

    from ..core import UsageError
    from ..hub.client import HubError

    @contextlib.contextmanager
    def guard(redact=lambda s: s):
        try:
            yield
        except (UsageError, HubError, OSError, ValueError, KeyError) as e:
            if debug:
                click.echo(redact(traceback.format_exc()), err=True)
            message = f"manifest.json lacks the field {e}" if isinstance(e, KeyError) else str(e)
            click.echo(f"omni-export: error: {one_line(redact(message))}", err=True)
            sys.exit(EXIT_USAGE)
    return guard


# ---------------------------------------------------------------------------------------- devices

@hub_group.command("devices", context_settings=CTX)
@click.option("--name", default="", help="only devices with exactly this name")
@click.option("--attribute", "attributes", multiple=True, metavar="ATTR",
              help="only devices with this attribute, e.g. chipset:qualcomm-snapdragon-8gen3 (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="print the devices as JSON")
@debug_option
def devices_cmd(name, attributes, as_json, debug):
    """List the devices AI Hub offers (name, OS, chipset, attributes) and the targets that use them."""
    from ..hub.client import Hub
    from ..targets import TARGETS

    hub = None
    with _errors(debug)():
        hub = Hub().connect()
        found = hub.devices(name=name, attributes=list(attributes))
    users = {}
    for t in TARGETS.values():
        if t.hub_device:
            users.setdefault(t.hub_device, []).append(t.name)
    if as_json:
        click.echo(json.dumps([{**d.to_json(), "targets": users.get(d.name, [])} for d in found], indent=2))
        return
    for d in sorted(found, key=lambda d: (d.name, d.os)):
        targets = f"  [targets: {', '.join(users[d.name])}]" if d.name in users else ""
        click.echo(f"{d.name} · Android {d.os} · {d.chipset or 'chipset ?'}{targets}")
        click.echo("    " + " ".join(sorted(a for a in d.attributes if not a.startswith("chipset:"))))
    click.echo(f"{len(found)} device(s) from {hub.label}")


# ----------------------------------------------------------------------------------------- submit

@hub_group.command("submit", context_settings=CTX)
@click.argument("out_dir", type=click.Path())
@click.option("--device", default=None, help="AI Hub device name [default: the target's, e.g. "
                                             "'Samsung Galaxy S25 (Family)']")
@click.option("--qairt-version", default=None, metavar="X.Y",
              help="QAIRT version every job pins [default: the local simulator's QNN if AI Hub has it, "
                   "else AI Hub's default]; recorded")
@click.option("--quantize-on", type=QUANTIZE_ON, default="local", show_default=True,
              help="quantized builds: upload the local QDQ ONNX, or the fp32 ONNX and run AI Hub's "
                   "quantize job on the captured calibration set")
@click.option("--resubmit", is_flag=True, help="retry the builds whose job FAILED (from the failed job on)")
@click.option("--timeout", type=float, default=6 * 3600, show_default=True, metavar="SECONDS",
              help="stop waiting after this long (jobs keep running; rerun to keep waiting); 0 submits only")
@click.option("--components", default=None, help="comma-separated components to submit [default: all]")
@click.option("--formats", default=None, help="comma-separated formats to submit [default: all AI Hub takes]")
@click.option("--precisions", default=None, help="comma-separated precisions to submit [default: all]")
@click.option("--json", "as_json", is_flag=True, help="print the hub summary as JSON")
@click.option("--quiet", "-q", is_flag=True, help="no progress output")
@summary_option
@debug_option
def submit_cmd(out_dir, device, qairt_version, quantize_on, resubmit, timeout, components, formats, precisions,
               as_json, quiet, summary_to, debug):
    """Compile, profile and run the accepted builds of OUT_DIR on a phone through AI Hub, and gate
    the phone's outputs with the same metrics and gates as the local builds.

    Every job id and URL is written to OUT_DIR/manifest.json (atomically) as soon as it
    exists; a rerun waits on the recorded jobs instead of submitting them again.

    Exit codes: 0 every submitted component has a build accepted on the device; 2 bad input
    (no token, unknown device, not a build directory); 3 otherwise.
    """
    from ..hub.client import Hub
    from ..hub.stage import SubmitOptions, submit
    from ..reports import refresh_reports

    opts = SubmitOptions(device=device, qairt=qairt_version, quantize_on=quantize_on, resubmit=resubmit,
                         timeout_s=timeout, components=_csv(components), formats=_csv(formats),
                         precisions=_csv(precisions))
    hub = Hub()
    with _errors(debug)(hub.redact):
        outcome = submit(out_dir, opts, _Progress(quiet or as_json), hub, refresh_reports=refresh_reports)
    _print_outcome(outcome, as_json, summary_to)
    sys.exit(outcome.exit_code)


def _csv(text: str | None) -> tuple:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


class _Progress:
    def __init__(self, quiet: bool):
        self.quiet = quiet

    def note(self, text: str) -> None:
        if not self.quiet:
            click.echo(text, err=True)


def _print_outcome(outcome, as_json: bool, summary_to: str | None) -> None:
    from ..reports.hub import markdown

    m = outcome.manifest
    text = "\n".join(markdown(m)) + "\n"
    append_summary(summary_to, text)
    if as_json:
        click.echo(json.dumps({"exit_code": outcome.exit_code, "hub": m.get("hub"),
                               "builds": {f"{b['component']}/{b['format']}/{b['precision']}": b["hub"]
                                          for b in m["builds"] if b.get("hub")}}, indent=2))
        return
    click.echo(text)
    for n in outcome.notes:
        click.echo(n)


# ----------------------------------------------------------------------------------------- status

@hub_group.command("status", context_settings=CTX)
@click.argument("out_dir", type=click.Path())
@click.option("--refresh", is_flag=True, help="ask AI Hub for the current state of every recorded job "
                                              "(read only: nothing is submitted or recorded)")
@click.option("--json", "as_json", is_flag=True, help="print the jobs as JSON")
@debug_option
def status_cmd(out_dir, refresh, as_json, debug):
    """The AI Hub jobs recorded in OUT_DIR/manifest.json: build, kind, job id, state, URL and
    failure messages. Reads the manifest only (--refresh also asks AI Hub); never submits."""
    from pathlib import Path

    from ..hub import records

    hub = None
    with _errors(debug)(lambda s: hub.redact(s) if hub else s):
        root = Path(out_dir)
        m = _read_manifest(root)
        if not m.get("hub") or not records.submitted(m):
            raise _usage(f"{root} has no AI Hub jobs; submit its accepted builds with "
                         f"`omni-export hub submit {root}`")
        if refresh:
            from ..hub.client import Hub

            hub = Hub().connect()
        live = _live_states(hub, m) if refresh else {}
    section = m["hub"]
    rows = [{"build": key, "state": records.build_state(rec), "kind": s["kind"], "id": s.get("id"),
             "job_state": live.get(s.get("id")) or s.get("status") or s["state"], "url": s.get("url"),
             "message": s.get("message"), "attempt": s.get("attempt")}
            for key, rec in records.submitted(m).items() for s in rec.get("steps", [])]
    run = _hub_run(root)
    if as_json:
        click.echo(json.dumps({"client": section["client"], "device": section["device"],
                               "qairt_version": section["qairt_version"], "jobs": rows, "run": run,
                               "summary": records.summary(m)}, indent=2))
        return
    click.echo(f"{section['client']} · {section['device']['name']} · QAIRT {section['qairt_version']['pinned']}"
               + (" · live states" if refresh else " · recorded states (--refresh asks AI Hub)"))
    for r in rows:
        msg = f"  {r['message']}" if r["message"] else ""
        click.echo(f"{r['build']:34s} {r['kind']:9s} {r['id'] or '(not created)':14s} {r['job_state']:28s} "
                   f"{r['url'] or ''}{msg}")
    s = records.summary(m)
    click.echo(f"{s['builds']} build(s): {s['accepted_on_device']} accepted on the device, "
               f"{s['rejected_on_device']} rejected on the device, {s['failed']} failed, {s['waiting']} waiting")
    if run:
        click.echo(run)


def _usage(text: str):
    from ..core import UsageError

    return UsageError(text)


def _read_manifest(root):
    """The manifest of OUT as it is now (also while a `hub submit` runs: it is rewritten atomically),
    checked by artifacts.manifest.read_manifest."""
    from ..artifacts.manifest import read_manifest
    from ..artifacts.store import MARKER

    path = root / "manifest.json"
    if not path.exists() and not path.is_symlink():
        raise _usage(f"{root}: no manifest.json; not a build directory")
    m = read_manifest(root)
    if (root / MARKER).exists() and _marker(root).get("mode") != "hub":
        raise _usage(f"{root} holds an unfinished build (.incomplete); rerun the build")
    return m


def _marker(root) -> dict:
    from ..artifacts.store import Store

    return Store(root).read_marker() or {}


def _hub_run(root) -> str:
    """A line about a `hub submit` that is running here, or was killed."""
    import os

    from ..artifacts.store import MARKER

    if not (root / MARKER).exists():
        return ""
    pid = _marker(root).get("pid")
    try:
        os.kill(int(pid), 0)
        alive = True
    except (TypeError, ValueError, ProcessLookupError):
        alive = False
    except PermissionError:
        alive = True
    if alive:
        return f"a `hub submit` is running here (pid {pid}); these are the states it last recorded"
    return (f"a `hub submit` here was interrupted; `omni-export hub submit {root}` resumes it "
            f"(recorded jobs are waited on, not submitted again)")


def _live_states(hub, m: dict) -> dict:
    from ..hub import records

    out = {}
    for rec in records.submitted(m).values():
        for s in rec.get("steps", []):
            if s.get("id"):
                out[s["id"]] = hub.status(hub.get_job(s["id"])).code
    return out


# ------------------------------------------------------------------------ --hub on build commands

@dataclass
class BuildHubOptions:
    device: str | None
    qairt: str | None
    quantize_on: str
    timeout_s: float


def build_params() -> list[click.Option]:
    return [
        click.Option(["--hub"], is_flag=True,
                     help="after the local gate, compile, profile and run the accepted builds on the "
                          "target's phone through Qualcomm AI Hub and gate the phone's outputs too "
                          "(see `omni-export hub --help`)"),
        click.Option(["--device"], default=None, help="with --hub: the AI Hub device [default: the target's]"),
        click.Option(["--qairt-version"], default=None, metavar="X.Y",
                     help="with --hub: the QAIRT version to pin [default: the local QNN if AI Hub has it]"),
        click.Option(["--hub-quantize"], type=QUANTIZE_ON, default="local", show_default=True,
                     help="with --hub: quantized builds from local QDQ or AI Hub's quantize job"),
        click.Option(["--hub-timeout"], type=float, default=6 * 3600, show_default=True, metavar="SECONDS",
                     help="with --hub: stop waiting on AI Hub after this long (rerun `hub submit` to resume)"),
    ]


def take_options(kwargs: dict) -> BuildHubOptions | None:
    """Pop the --hub options from a build command's keyword arguments (None without --hub)."""
    enabled = kwargs.pop("hub", False)
    opts = BuildHubOptions(kwargs.pop("device", None), kwargs.pop("qairt_version", None),
                           kwargs.pop("hub_quantize", "local"), kwargs.pop("hub_timeout", 6 * 3600))
    if not enabled and (opts.device or opts.qairt):
        from ..core import UsageError

        raise UsageError("--device and --qairt-version only apply with --hub")
    return opts if enabled else None


@dataclass
class Preflight:
    hub: object                          # a connected hub.client.Hub
    previous: dict | None                # the manifest OUT held before this build (its AI Hub jobs)


def preflight(opts: BuildHubOptions | None, target, out):
    """Before building: the token works and the device exists (fail in seconds, not after the
    build), and the AI Hub jobs OUT already records (a rerun adopts them instead of resubmitting)."""
    if opts is None:
        return None
    from ..artifacts.store import Store
    from ..hub.client import Hub, HubUsageError

    hub = Hub().connect()
    name = opts.device or target.hub_device
    if not name:
        raise HubUsageError(f"target {target.name} names no AI Hub device; pass --device")
    hub.device(name)
    previous = Store(out).read_manifest() if out.is_dir() else None
    return Preflight(hub, previous if previous and previous.get("hub") else None)


def after_build(result, opts: BuildHubOptions | None, pre: Preflight | None, progress):
    """Submit the accepted builds of a finished run; returns (manifest, exit code, notes)."""
    if opts is None:
        return result.manifest, result.exit_code, []
    from ..core import UsageError
    from ..hub.client import HubError
    from ..hub.stage import SubmitOptions, submit
    from ..reports import refresh_reports

    if not any(b["status"] == "accepted" for b in result.manifest["builds"]):
        return result.manifest, result.exit_code, ["--hub: no accepted build to submit"]
    try:
        outcome = submit(result.out, SubmitOptions(device=opts.device, qairt=opts.qairt, quantize_on=opts.quantize_on,
                                                   timeout_s=opts.timeout_s), progress, pre.hub, pre.previous,
                         refresh_reports=refresh_reports)
    except HubError as e:
        raise UsageError(f"{pre.hub.redact(e)}; the build in {result.out} is complete: "
                         f"`omni-export hub submit {result.out}` retries") from None
    except KeyboardInterrupt:
        raise HubInterrupted(f"interrupted while waiting on AI Hub; the build in {result.out} is complete and "
                             f"the jobs submitted so far are in its manifest: `omni-export hub submit "
                             f"{result.out}` resumes them") from None
    return outcome.manifest, max(result.exit_code, outcome.exit_code), outcome.notes


class HubInterrupted(Exception):
    """Ctrl-C during the --hub stage of a build (exit 130 with this message)."""
