"""report.md: the verdicts in one screen, for $GITHUB_STEP_SUMMARY, a PR comment or a terminal.

Every build is one table row; every rejected build is named with its reason. Plots, audio,
per-block tables and full provenance live in report.html.

Every string that comes from a manifest (component, runner, reason, path, option, toolchain
version) goes through md(): a crafted one cannot end its table cell, code span or line, nor open
a link or an HTML tag.
"""
from __future__ import annotations

import re
import unicodedata

from . import hub
from .view import (E2E_GATE_NOTE, BuildRow, build_rows, caveats, components_without_accepted, fmt_db,
                   human_bytes, raised_text, short_sha, weakest_blocks)

VERDICT = {"accepted": "✅ accepted", "rejected": "❌ rejected"}

# Backslash-escaped in text: a backslash before punctuation (it would escape ours), a backtick (a
# code span), a pipe (a table cell), `<` opening a tag, autolink or comment, `]` closing a link's
# text. Line breaks and other control characters become spaces; bidi overrides are dropped.
_TEXT_ESCAPE = re.compile(r"\\(?=[!-/:-@\[-`{-~])|[`|]|<(?=[A-Za-z/!?])|\](?=[(\[])")
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def md(value, code: bool = False) -> str:
    """`value` (from a manifest) as report.md text that stays where it is put: one line, no markup
    of its own. `code`: as a whole code span, its fence longer than any run of backticks inside (code
    spans stand outside tables here, where a pipe is plain text)."""
    text = "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c
                   for c in str(value) if c not in _BIDI)
    if not code:
        return _TEXT_ESCAPE.sub(lambda x: "\\" + x.group(0), text)
    fence = "`" * (max(map(len, re.findall(r"`+", text)), default=0) + 1)
    pad = " " if (text[:1] == "`" or text[-1:] == "`" or not text.strip()
                  or (text[:1] == " " and text[-1:] == " ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def summary(m: dict, regated: dict | None = None) -> str:
    rows = build_rows(m, regated)
    lines = [_title(m, rows, regated), "", _provenance(m)]
    if regated:
        lines += ["", _regated_note(regated)]
    lines += ["", "| component | format | precision | runner | gated SNR dB | PSNR dB | gate dB | verdict | size |",
              "|---|---|---|---|---:|---:|---:|---|---:|"]
    lines += [_table_row(r) for r in rows]
    lines += [f"\n> ⚠️ {md(c)}" for c in caveats(m, rows)]
    lines += _rejected(rows, regated)
    lines += _fail_under(regated)
    lines += _weakest(m)
    lines += _repair(m)
    lines += _end_to_end(m)
    lines += hub.markdown(m)
    lines += _bundle(m)
    if m.get("skipped"):
        lines += ["", "Not built: " + "; ".join(_skipped_groups(m["skipped"]))]
    accepted = sum(r.accepted for r in rows)
    reused = sum(bool((b.get("cache") or {}).get("hit")) for b in m.get("builds", []))
    cached = f" ({reused} unchanged, reused from the build cache)" if reused else ""
    lines += ["", f"**{accepted} accepted, {len(rows) - accepted} rejected**{cached} in {m['timings']['total_s']:.0f} s. "
                  "Plots, audio, per-block fidelity and provenance: `report.html`."]
    return "\n".join(lines) + "\n"


def _bundle(m: dict) -> list[str]:
    """OUT/bundle/ (artifacts/bundle.py): its size and graphs in one line, or why there is none (the
    summary fits one screen: its files are listed in report.html)."""
    b = m.get("bundle")
    if not isinstance(b, dict):
        return []
    if b.get("error"):
        return ["", f"**Bundle:** none: {md(b['error'])}"]
    files = [f for f in b.get("files") or [] if isinstance(f, dict)]
    graphs = ", ".join(f"{md(c)} {md(g)}" for c, g in (b.get("graphs") or {}).items())
    lines = ["", f"**Bundle** {md(b.get('path'), code=True)}: {human_bytes(b.get('bytes') or 0)} in {len(files)} files, "
                 f"one accepted graph per component ({graphs}), `runtime.json` and a README (docs/bundle.md)."
             + (f" {md(b['note'])}." if b.get("note") else "")]
    return lines


def _title(m: dict, rows: list[BuildRow], regated: dict | None) -> str:
    missing = components_without_accepted(m, rows)
    below = (regated or {}).get("summary", {}).get("below_fail_under") or []
    head = f"omni-export · {md(m['recipe']['name'])} → {md(m['target']['name'])}"
    if missing:
        return f"## ❌ {head}: no accepted build for {', '.join(map(md, missing))} (exit 3)"
    if below:
        return f"## ❌ {head}: {len(below)} accepted build(s) under --fail-under {regated['fail_under_db']:g} dB (exit 3)"
    return f"## ✅ {head}: every component has an accepted build"


def _provenance(m: dict) -> str:
    ck, tc = m["checkpoint"], m["toolchain"]
    return (f"Checkpoint **{md(ck['label'])}** ({md(ck['path'], code=True)}) · omni-export "
            f"{md(short_sha(tc.get('omni-export-git')), code=True)} · onnxruntime-qnn {md(tc.get('onnxruntime-qnn'))} "
            f"(QNN {md(tc.get('qnn'))}) · executorch {md(tc.get('executorch'))} · "
            f"host {md(m['host'].get('hostname'))} · {md(m['created'])}")


def _regated_note(regated: dict) -> str:
    gates = ", ".join(f"{md(p)}={v:g}" for p, v in regated["gates_db"].items()) or "the build-time gates"
    changed = regated["summary"]["changed"]
    return (f"> **Re-gated** by `omni-export parity` against {gates} ({regated['created']}): verdicts below are "
            f"against these gates; `manifest.json` keeps the build-time verdicts and no file moved. "
            f"Changed: {', '.join(map(md, changed)) if changed else 'none'}.")


def _table_row(r: BuildRow) -> str:
    verdict = VERDICT[r.verdict] + (f" (was {r.built_verdict})" if r.verdict_changed else "") + \
        (f" ({md(r.proxy)})" if r.proxy else "")
    runner = f"{md(r.runner)} ({r.scored})" if r.scored else md(r.runner)
    return (f"| {md(r.component)} | {md(r.format)} | {md(r.precision)} | {runner} | {_snr_cell(r)} | "
            f"{fmt_db(r.worst.get('psnr_db'))} | {fmt_db(r.threshold_db)} | {verdict} | {human_bytes(r.bytes)} |")


def _snr_cell(r: BuildRow) -> str:
    """The lowest gated SNR; outputs gated by agreement (codes) give their agreement instead of "—"."""
    if not r.agreement:
        return fmt_db(r.min_snr_db)
    return (f"{fmt_db(r.min_snr_db)}; " if r.min_snr_db is not None else "") + md(r.agreement)


def _rejected(rows: list[BuildRow], regated: dict | None) -> list[str]:
    rejected = [r for r in rows if not r.accepted]
    if not rejected:
        return []
    where = "files where the build put them" if regated else "files under `rejected/`, never deployable"
    lines = ["", f"**Rejected** ({where}):"]
    return lines + [f"- {md(r.key, code=True)} ({_where(r)}): {md(r.reason)}" for r in rejected]


def _where(r: BuildRow) -> str:
    return f"{md(r.runner)}, {md(r.files[0]['path'], code=True)}" if r.files else "no file written"


def _fail_under(regated: dict | None) -> list[str]:
    if not regated or regated.get("fail_under_db") is None:
        return []
    below = regated["summary"]["below_fail_under"]
    floor = regated["fail_under_db"]
    if not below:
        return ["", f"`--fail-under {floor:g}`: every accepted build is at or above {floor:g} dB."]
    return ["", f"**`--fail-under {floor:g}` failed**: accepted builds below {floor:g} dB: "
                + ", ".join(md(k, code=True) for k in below)]


def _end_to_end(m: dict) -> list[str]:
    rows = m.get("end_to_end") or []
    rows = [rows] if isinstance(rows, dict) else rows
    if not rows:
        return []
    unit = "tokens" if any("token_agreement" in r for r in rows) else "codes"   # an LLM's rows: greedy tokens
    lines = ["", "End to end (held-out prompts through the exported graphs, driven by the host loop):", "",
             f"| precision | runner | teacher-forced {unit} | free-running {unit} | wav SNR dB | verdict |",
             "|---|---|---:|---:|---:|---|"]
    pct = lambda v: "—" if v is None else f"{100 * v:.1f}%"       # noqa: E731
    for r in rows:
        if r.get("verdict") == "skipped":
            lines.append(f"| {md(r.get('precision'))} | {md(r.get('runner'))} | — | — | — | "
                         f"skipped: {md(r.get('reason', ''))} |")
            continue
        flips = f" ({r['near_tie_flips']}/{r['flips']} flips near-tie)" if "flips" in r else ""
        repaired = r.get("repaired") if isinstance(r.get("repaired"), dict) else {}
        through = f" ({', '.join(f'{g} at {p}' for g, p in repaired.items())})" if repaired else ""
        if isinstance(r.get("predictor"), dict) and r["predictor"].get("graphs") == "step":
            through += f" (predictor step graphs: {r['predictor'].get('why') or 'no fused frame'})"
        lines.append(f"| {md(str(r.get('precision', '—')) + through)} | {md(r.get('runner', '—'))} | "
                     f"{pct(r.get('code_agreement', r.get('token_agreement')))}{flips} | "
                     f"{pct(r.get('free_running_agreement'))} | {fmt_db(r.get('wav_snr_db'))} | "
                     f"{VERDICT.get(r.get('verdict')) or md(r.get('verdict') or '—')} |")
    if any(r.get("verdict") != "skipped" and "code_agreement" in r for r in rows):
        lines += ["", E2E_GATE_NOTE]
    return lines


def _repair(m: dict) -> list[str]:
    """Precision repair (jobs/repair.py): per searched component x precision, its result and search table."""
    out = []
    for comp, rec in sorted((m.get("components") or {}).items()):
        for pv, search in sorted(((rec or {}).get("repair") or {}).items()):
            r = search.get("result")
            if r:
                share = r.get("integer_share")
                head = (f"{md(comp)} {md(pv)} rejected → **{md(r['precision'])}** accepted at step {r['step']}: "
                        + _kept(r)
                        + ("" if share is None else f", {100 * share:.1f} % of weight bytes still quantized")
                        + (f" ({100 * r['base_share']:.1f} % at the base width)"
                           if r.get("base_share") is not None and share is not None and r["base_share"] < share else ""))
                sizes = r.get("bytes") or {}
                parts = [f"{md(f)} " + " / ".join(f"{md(p)} {human_bytes(b)}" for p, b in sorted(v.items()))
                         for f, v in sorted(sizes.items())]
                if parts:
                    head += " (sizes: " + "; ".join(parts) + ")"
            else:
                head = f"{md(comp)} {md(pv)} rejected; repair found no passing variant: {md(search.get('stopped') or '')}"
            if search.get("htp_optimization"):
                head += (f"; its steps compiled at --htp-optimization {md(search['htp_optimization'])}: "
                         f"{md(search.get('htp_optimization_why') or '')}")
            out += ["", f"Precision repair: {head}"] + (["", *_repair_table(search)] if search.get("steps") else [])
    return out


def _kept(step: dict) -> str:
    """What a repair step (or its result) changed: the modules kept in float, and its weight scheme."""
    kept = raised_text(step, md)
    return kept + (f"; {md(step['scheme'])}" if step.get("scheme") else "")


def _repair_table(search: dict) -> list[str]:
    """A precision-repair search (jobs/repair.py) as markdown table lines."""
    lines = ["| step | change | gated SNR | verdict | weight bytes still quantized |",
             "|---|---|---|---|---|"]
    for s in search.get("steps", []):
        db = "—" if s.get("snr_db") is None else f"{s['snr_db']:.1f} dB"
        share = "—" if s.get("integer_share") is None else f"{100 * s['integer_share']:.1f} %"
        if s.get("base_share") is not None and s.get("integer_share") is not None and s["base_share"] < s["integer_share"]:
            share += f" ({100 * s['base_share']:.1f} % at the base width)"
        kept = _kept(s)
        lines.append(f"| {s['step']} | {kept} | {db} | {s.get('verdict', s.get('error', ''))} | {share} |")
    return lines


def _weakest(m: dict) -> list[str]:
    found = weakest_blocks(m)
    if not found:
        return []
    items = [f"{md(w['component'])} {md(w['precision'])} {md(w['block'], code=True)} "
             + (f"{fmt_db(w['snr_db'])} dB" if w["snr_db"] is not None else f"failed ({md(w['note'][:60])})")
             for w in found]
    return ["", "Weakest block, each lowered alone and fed fp32 activations: " + " · ".join(items)]


# -------------------------------------------------------------------------------------------- diff

ICON = {"accepted": "✅", "rejected": "❌", None: "—"}


def diff_summary(result: dict, a: str, b: str) -> str:
    """The `omni-export diff` table: B against A per build and output, regressions flagged."""
    n = len(result["regressions"])
    tol = result["tolerance_db"]
    head = (f"## ❌ omni-export diff: {n} regression{'s' if n != 1 else ''} (tolerance {tol:g} dB)" if n
            else f"## ✅ omni-export diff: no regression (tolerance {tol:g} dB)")
    lines = [head, "", f"A: {md(a, code=True)} · B: {md(b, code=True)}"]
    changes = result["provenance"]
    if changes:
        lines += ["", "Also differs: " + "; ".join(f"{md(c['field'])} {md(_short(c['a']))} → {md(_short(c['b']))}"
                                                    for c in changes)]
    lines += ["", "| build | output | A SNR dB | B SNR dB | Δ dB | A → B | |", "|---|---|---:|---:|---:|---|---|"]
    for r in result["rows"]:
        delta = "—" if r["delta_db"] is None else f"{r['delta_db']:+.1f}"
        flag = ("⚠️ " if r["regression"] else "") + r["flag"]
        lines.append(f"| {md(r['key'])} | {md(r['output'] or '—')} | {fmt_db(r['a_db'])} | {fmt_db(r['b_db'])} | "
                     f"{delta} | {ICON[r['a_verdict']]} → {ICON[r['b_verdict']]} | {flag} |")
    return "\n".join(lines) + "\n"


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _skipped_groups(skipped: list[dict]) -> list[str]:
    """One entry per component, format and reason, its precisions joined: the same reason for the
    fp32, fp16 and w8a16 builds of a graph is said once."""
    groups: dict = {}
    for s in skipped:
        groups.setdefault((s["component"], s["format"], s["reason"]), []).append(s["precision"])
    return [f"{md(c)} {md(f)} {', '.join(map(md, p))} ({md(reason)})" for (c, f, reason), p in groups.items()]
