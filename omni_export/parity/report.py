"""parity.json and the Markdown summary, both derived from the manifest alone."""
from __future__ import annotations

PARITY_SCHEMA_VERSION = 1


def parity_json(m: dict) -> dict:
    return {
        "schema_version": PARITY_SCHEMA_VERSION,
        "recipe": m["recipe"]["name"],
        "target": m["target"]["name"],
        "checkpoint": {"path": m["checkpoint"]["path"], "label": m["checkpoint"]["label"]},
        "builds": [
            {"name": b["name"], "component": b["component"], "format": b["format"],
             "precision": b["precision"], "verdict": b["status"], **_parity_fields(b)}
            for b in m["builds"]
        ],
        "attribution": {c: info.get("attribution", {}) for c, info in m["components"].items()},
        "summary": m["summary"],
    }


def _parity_fields(b: dict) -> dict:
    p = b.get("parity") or {}
    runner = p.get("runner") or {}
    return {"runner": runner.get("label"), "threshold_db": p.get("threshold_db"),
            "reason": p.get("reason"), "outputs": p.get("outputs", [])}


def _db(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, str):
        return x
    return f"{x:.1f}"


def markdown(m: dict) -> str:
    ck = m["checkpoint"]
    lines = [
        f"# omni-export: {m['recipe']['name']} for {m['target']['name']}",
        "",
        f"Checkpoint: **{ck['label']}**  ",
        f"Path: `{ck['path']}`  ",
        f"Target: {m['target']['device']} (soc_model {m['target']['soc_model']}, "
        f"HTP v{m['target']['htp_arch']})  " if m["target"]["soc_model"] else f"Target: {m['target']['device']}  ",
        f"Toolchain: torch {m['toolchain'].get('torch')}, executorch {m['toolchain'].get('executorch')}, "
        f"onnxruntime {m['toolchain'].get('onnxruntime')}, onnxruntime-qnn {m['toolchain'].get('onnxruntime-qnn')} "
        f"(QNN {m['toolchain'].get('qnn')}), omni-export {m['toolchain'].get('omni-export-git') or m['toolchain'].get('omni-export')}",
        "",
        "| component | format | precision | runner | SNR dB | PSNR dB | gate | verdict |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for b in m["builds"]:
        p = b.get("parity") or {}
        outs = [o for o in (p.get("outputs") or []) if o.get("snr_db") is not None]
        worst = min(outs, key=lambda o: _num(o["snr_db"])) if outs else {}
        agree = [o for o in (p.get("outputs") or []) if o.get("agreement") is not None]
        if agree:
            worst = dict(worst, agreement=min(o["agreement"] for o in agree))
        runner = (p.get("runner") or {}).get("short", "—")
        verdict = "✅ accepted" if b["status"] == "accepted" else "❌ rejected"
        snr = _db(worst.get("snr_db"))
        if worst.get("agreement") is not None:
            snr += f" ({100 * worst['agreement']:.0f}% codes)"
        lines.append(f"| {b['component']} | {b['format']} | {b['precision']} | {runner} | "
                     f"{snr} | {_db(worst.get('psnr_db'))} | "
                     f"{_db(p.get('threshold_db'))} | {verdict} |")
    rejected = [b for b in m["builds"] if b["status"] == "rejected"]
    if rejected:
        lines += ["", "**Rejected** (kept under `rejected/`, never deployable):"]
        lines += [f"- `{b['name']}` ({b['format']}): {(b.get('parity') or {}).get('reason', b.get('error'))}"
                  for b in rejected]
    for comp, info in m["components"].items():
        for prec, rows in (info.get("attribution") or {}).items():
            if not rows:
                continue
            lines += ["", f"Per-block fidelity, {comp} {prec} (each block alone, fed fp32 activations; "
                          f"{next((r['runner'] for r in rows if r.get('runner')), '')}):", "",
                      "| block | SNR dB |", "|---|---:|"]
            lines += [f"| {r['block']} | {_db(r.get('snr_db')) if not r.get('error') else 'failed: ' + r['error'][:60]} |"
                      for r in rows]
        for r in info.get("rewrites") or []:
            lines.append(f"\nRewrite `{r['rewrite']}` on {comp}: {r['ops_replaced']} ops, "
                         f"{r['fp32_snr_db']} dB from the original in fp32 "
                         f"({'applied' if r['applied'] else 'NOT applied: under 100 dB'})")
    e2e = m.get("end_to_end") or []
    if e2e:
        lines += ["", "End to end (held-out prompts, greedy, through the built graphs vs the fp32 pipeline):", "",
                  "| runner | precision | code agreement | waveform SNR dB | verdict |", "|---|---|---:|---:|---|"]
        for r in e2e:
            agree = f"{100 * r['code_agreement']:.1f}%" if r.get("code_agreement") is not None else "—"
            lines.append(f"| {r['runner']} | {r['precision']} | {agree} | {_db(r.get('wav_snr_db'))} | "
                         f"{r['verdict']}: {r['reason']} |")
    if m.get("skipped"):
        lines += ["", "Not built: " + "; ".join(f"{s['component']} {s['format']}@{s['precision']} "
                                                 f"({s['reason']})" for s in m["skipped"])]
    s = m["summary"]
    lines += ["", f"**{s['accepted']} accepted, {s['rejected']} rejected** in {m['timings']['total_s']:.0f} s."]
    if s["components_without_accepted_build"]:
        lines.append(f"Components with no accepted build: {', '.join(s['components_without_accepted_build'])} "
                     f"(exit 3).")
    return "\n".join(lines) + "\n"


def _num(x) -> float:
    if isinstance(x, (int, float)):
        return float(x)
    return {"inf": float("inf"), "-inf": float("-inf")}.get(x, float("nan"))
