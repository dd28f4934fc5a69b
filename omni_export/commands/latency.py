"""`omni-export latency OUT`: time to first audio and real-time factor on the target, projected from the
build's AI Hub profile times, the host work a recorded synth run measured here, and the pipelined
schedule (hub/latency.py); each graph's slowest ops on the device. Reads manifest.json only."""
from __future__ import annotations

import json

import click

from .reports import CTX, debug_option, load_manifest, one_line_errors


@click.command("latency", context_settings=CTX)
@click.argument("out", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="print the projection as JSON on stdout")
@debug_option
def latency(out: str, as_json: bool, debug: bool):
    """Project time to first audio (TTFA) and the real-time factor (RTF) on the target from OUT's AI Hub
    profile times (`omni-export hub submit OUT` or --hub records them): the generation loop's graphs and
    the host work between them on one unit, the vocoder on its own, overlapped as a stream. Host work is
    taken from a synth run recorded in OUT (`omni-export synth qwen3-tts --build OUT --json
    --record-latency`), timed on this machine. Lists each profiled graph's slowest ops. Every figure
    is labelled by its source. Without profile times it says, in one line, what it needs. Exit 0, or 2
    for bad input."""
    from ..core import strict_json
    from ..hub.latency import lines, project
    from ..recipes import get_recipe

    with one_line_errors(debug):
        _, m = load_manifest(out)
        p = project(m, get_recipe(m["recipe"]["name"]))
    if as_json:
        click.echo(json.dumps(strict_json(p), indent=2, allow_nan=False))
        return
    click.echo(f"omni-export latency: {m['recipe']['name']} → {m['target']['name']} ({p['device']})")
    for line in lines(p):
        click.echo(line)
