"""report.html: one self-contained page (inline PNG figures and CSS, no scripts, no network).

The page is the jinja2 template reports/templates/report.html.j2 filled from the manifest; audio
clips are linked as files under samples/ so a person can listen.
"""
from __future__ import annotations

import functools
import time
from pathlib import Path

from ..hub.profile import split
from ..hub.rtf import lines as rtf_lines
from . import audio, figures
from .hub import device_rows, latency_lines
from .view import (E2E_GATE_NOTE, BuildRow, agreement_note, build_rows, caveats, components_without_accepted,
                   fmt_db, human_bytes, raised_text, short_sha, weakest_blocks)


def render(root: Path, m: dict, regated: dict | None = None) -> str:
    rows = build_rows(m, regated)
    return _environment().get_template("report.html.j2").render(
        m=m, rows=rows, regated=regated,
        missing=components_without_accepted(m, rows),
        components=[_component(m, name, info, [r for r in rows if r.component == name])
                    for name, info in m["components"].items()],
        audio=audio.sections(root, m, rows),
        weakest=weakest_blocks(m),
        hub=m.get("hub"), hub_rows=device_rows(m), latency_lines=latency_lines(m),
        rtf_lines=rtf_lines(m["hub"]["rtf"]) if (m.get("hub") or {}).get("rtf") else [],
        end_to_end=m.get("end_to_end"), caveats=caveats(m, rows), e2e_gate_note=E2E_GATE_NOTE,
        generated=time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
    )


@functools.lru_cache(maxsize=1)
def _environment():
    """Built once per process: compiling the template is most of a report's cost after the figures."""
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("omni_export.reports", "templates"),
                      autoescape=select_autoescape(["html", "j2"]), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(db=fmt_db, size=human_bytes, sha=short_sha, units=split, agreement=agreement_note,
                       raised=raised_text)
    return env


def _component(m: dict, name: str, info: dict, rows: list[BuildRow]) -> dict:
    return {"name": name, "info": info, "rows": rows,
            "snr_figure": figures.snr_chart(_bars(rows)) if rows else "",
            "attribution": _attribution(info.get("attribution") or {}, rows)}


def _bars(rows: list[BuildRow]) -> list[dict]:
    bars = []
    for r in rows:
        outs = [o for o in r.outputs if not r.gated or o["name"] in r.gated] or [
            {"name": "not scored", "snr_db": "nan", "psnr_db": "nan", "finite": False, "note": "not scored"}]
        for o in outs:
            suffix = f" · {o['name']}" if len(outs) > 1 else ""
            bars.append({"label": f"{r.format} {r.precision} · {r.runner}{suffix}", "snr_db": o["snr_db"],
                         "psnr_db": o["psnr_db"], "finite": o.get("finite", True),
                         "threshold_db": r.threshold_db, "accepted": r.accepted,
                         "note": _no_snr_note(o)})
    return bars


def _no_snr_note(o: dict) -> str:
    """What a bar without an SNR says: an output gated by agreement (codes) gives its agreement."""
    return o.get("note", "NaN/Inf") if o.get("agreement") is None else agreement_note(o)


def _attribution(att: dict, rows: list[BuildRow]) -> dict | None:
    att = {p: r for p, r in att.items() if r}
    if not att:
        return None
    blocks = list(dict.fromkeys(r["block"] for rs in att.values() for r in rs))    # every precision's, in order
    att = {p: [next((x for x in rs if x["block"] == b), {"block": b, "snr_db": None}) for b in blocks]
           for p, rs in att.items()}                    # a block one precision has no row for: "—"
    series = {p: [x.get("snr_db") for x in rs] for p, rs in att.items()}
    gates = {r.precision: r.threshold_db for r in rows if r.threshold_db is not None}
    return {"figure": figures.attribution_chart(blocks, series, gates), "blocks": blocks, "table": att,
            "runners": {p: next((x.get("runner") for x in rs if x.get("runner")), "") for p, rs in att.items()}}
