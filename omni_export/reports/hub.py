"""The AI Hub part of the reports: device dB beside simulator dB, profiles, jobs and the RTF estimate.

Computed from the manifest alone (its top-level "hub" and each submitted build's "hub"), shared
by report.md, report.html, parity.json and `omni-export hub submit`'s own summary.
"""
from __future__ import annotations

from ..artifacts.scores import as_json_db, gated_outputs, min_snr_db
from ..hub.profile import split
from ..hub.records import build_state, key
from ..hub.rtf import lines as rtf_lines
from .view import fmt_db

VERDICT = {"accepted": "✅ accepted", "rejected": "❌ rejected", None: "—"}


def device_rows(m: dict) -> list[dict]:
    """One row per submitted build: the local (simulator) score beside the device's."""
    out = []
    for b in m.get("builds", []):
        rec = b.get("hub")
        if not isinstance(rec, dict):
            continue
        names = gated_outputs(m, b["component"])
        local = b.get("parity") or {}
        dev = rec.get("parity") or {}
        prof = rec.get("profile") or {}
        route = rec.get("route") or {}
        out.append({
            "key": key(b), "component": b["component"], "format": b["format"], "precision": b["precision"],
            "local_runner": (local.get("runner") or {}).get("short", "—"),
            "local_min_snr_db": min_snr_db(local.get("outputs") or [], names),
            "device_min_snr_db": min_snr_db(dev.get("outputs") or [], names) if dev.get("outputs") else None,
            "device_outputs": dev.get("outputs") or [],
            "threshold_db": local.get("threshold_db"), "device_verdict": dev.get("verdict"),
            "device_reason": dev.get("reason") or _waiting(rec), "device_runner": (dev.get("runner") or {}).get("label"),
            "state": build_state(rec), "runtime": route.get("runtime"), "compute_unit": route.get("compute_unit"),
            "quantized_by": route.get("quantized_by"), "inference_ms": prof.get("inference_ms"),
            "peak_memory_mb": prof.get("peak_memory_mb"), "compute_units": prof.get("compute_units") or {},
            "jobs": [{"kind": s["kind"], "id": s.get("id"), "url": s.get("url"), "state": s["state"],
                      "message": s.get("message")} for s in rec.get("steps", [])],
        })
    return out


def _waiting(rec: dict) -> str:
    failed = next((s for s in rec.get("steps", []) if s["state"] == "failed"), None)
    if failed:
        return f"{failed['kind']} job FAILED: {failed.get('message')}"
    running = [s for s in rec.get("steps", []) if s["state"] != "success"]
    return f"waiting on the {running[-1]['kind']} job" if running else "not scored"


def markdown(m: dict) -> list[str]:
    """The AI Hub section of report.md (empty when nothing was submitted)."""
    from .markdown import md        # markdown.py imports this module

    h = m.get("hub")
    rows = device_rows(m)
    if not h or not rows:
        return []
    dev, q = h.get("device") or {}, h.get("qairt_version") or {}
    lines = ["", f"### On device: {md(dev.get('name', '?'))} via {md(h['client'])}", "",
             f"QAIRT {md(q.get('pinned'))} pinned ({md(q.get('why'))}); device outputs on the held-out inputs, scored "
             f"with the local gate.", "",
             "| build | local runner | local SNR dB | device SNR dB | gate dB | device verdict | ms/inference "
             "| peak MB | ops NPU·GPU·CPU |",
             "|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        verdict = VERDICT.get(r["device_verdict"], md(r["state"])) if r["device_verdict"] else md(r["state"])
        lines.append(f"| {md(r['key'])} | {md(r['local_runner'])} | {fmt_db(r['local_min_snr_db'])} | "
                     f"{fmt_db(r['device_min_snr_db'])} | {fmt_db(r['threshold_db'])} | {verdict} | "
                     f"{_num(r['inference_ms'], 2)} | {_num(r['peak_memory_mb'], 1)} | {md(split(r['compute_units']))} |")
    bad = [r for r in rows if r["device_verdict"] != "accepted"]
    if bad:
        lines += [""] + [f"- {md(r['key'], code=True)} on the device: {md(r['device_reason'])}" for r in bad]
    jobs = [f"{md(r['key'])} {md(j['kind'])} [{md(j['id'])}](<{_url(j['url'])}>)" for r in rows for j in r["jobs"]
            if j.get("url")]
    if jobs:
        lines += ["", "Jobs: " + " · ".join(jobs)]
    links = (h.get("summary") or {}).get("links") or {}
    if links:
        lines += ["", "Linked context binaries (AI Hub link job over the graphs' compiled DLCs, weights shared; "
                      "each graph selected with context_enable_graphs and profiled):", "",
                  "| link | state | graph | device SNR dB | device verdict | ms/inference | peak MB |",
                  "|---|---|---|---:|---|---:|---:|"]
        for key, link in links.items():
            for g, r in link["graphs"].items():
                lines.append(f"| {md(key)} | {md(link['state'])} | {md(g)} | {fmt_db(r['min_snr_db'])} | "
                             f"{VERDICT.get(r['verdict'], '—') if r['verdict'] else '—'} | "
                             f"{_num(r['inference_ms'], 2)} | {_num(r['peak_memory_mb'], 1)} |")
            if link.get("failure"):
                lines.append(f"| {md(key)} | failed: {md(link['failure'])} | | | | | |")
    if h.get("rtf"):
        lines += ["", f"Real time ({md(h['rtf']['doc'])}):", ""] + [f"- {md(x)}" for x in rtf_lines(h["rtf"])]
    projected = latency_lines(m)
    if projected:
        lines += ["", "Latency projected on the device (`omni-export latency`; host work measured here):", ""]
        lines += [("  - " if x.startswith("  ") else "- ") + md(x.strip()) for x in projected]
    return lines


def latency_lines(m: dict) -> list[str]:
    """hub/latency.py's projection of a submitted build, as lines (sub-items indented); [] before any
    submission or for a recipe this omni-export does not know."""
    from ..core import UsageError
    from ..hub.latency import lines, project
    from ..recipes import get_recipe

    if not m.get("hub"):
        return []
    try:
        recipe = get_recipe(m["recipe"]["name"])
    except UsageError:
        return []
    return lines(project(m, recipe))


def _url(url) -> str:
    """A job link as a markdown link destination: an https URL with nothing that closes it."""
    text = str(url)
    return text if text.startswith("https://") and not any(c in text for c in "<> \n\r\t`") else "#"


def _num(x, digits: int) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# -------------------------------------------------------------------------------------- parity.json

def parity_device(m: dict, b: dict) -> dict | None:
    """parity.json's "device" of one build: null when it was never submitted."""
    rec = b.get("hub")
    if not isinstance(rec, dict):
        return None
    dev = rec.get("parity") or {}
    low = min_snr_db(dev.get("outputs") or [], gated_outputs(m, b["component"])) if dev.get("outputs") else None
    route = rec.get("route") or {}
    return {"state": build_state(rec), "runner": (dev.get("runner") or {}).get("label"),
            "device": route.get("device"), "runtime": route.get("runtime"),
            "compute_unit": route.get("compute_unit"), "qairt_version": route.get("qairt_version"),
            "quantized_by": route.get("quantized_by"),
            "threshold_db": dev.get("threshold_db"), "verdict": dev.get("verdict"), "reason": dev.get("reason"),
            "min_snr_db": None if low is None else as_json_db(low), "outputs": dev.get("outputs") or [],
            "profile": rec.get("profile"),
            "jobs": [{"kind": s["kind"], "id": s.get("id"), "url": s.get("url"), "state": s["state"]}
                     for s in rec.get("steps", [])]}


def parity_hub(m: dict) -> dict | None:
    h = m.get("hub")
    if not h:
        return None
    return {"client": h.get("client"), "device": (h.get("device") or {}).get("name"),
            "qairt_version": (h.get("qairt_version") or {}).get("pinned"), "summary": h.get("summary") or {},
            "rtf": h.get("rtf")}
