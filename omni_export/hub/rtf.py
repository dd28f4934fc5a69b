"""Per-frame device figures and the real-time-factor estimate for the target's placement.

The recipe says which graphs one unit of output costs (core.RealTime; Qwen3-TTS: per 80 ms frame
one talker_decode, one predictor_frame, and 1/N of a Code2Wav chunk of N frames). Each graph's
time is AI Hub's estimated_inference_time of its fastest build that was accepted on the device.

    t(u)            = Σ over graphs placed on compute unit u of  calls per frame × ms per call
    sequential RTF  = Σ_u t(u) / frame_ms          (one unit after the other, nothing overlaps)
    pipelined RTF   = max_u t(u) / frame_ms         (each unit works on its own frame or chunk
                                                     while the others work on theirs: streaming)

The estimate for the placement is the pipelined RTF when the graphs run on more than one unit
(e.g. s25: LM on the NPU while the GPU vocodes the previous chunk), else the sequential one (the
two are then equal). RTF < 1 is faster than real time. Host work (sampling, embedding gathers,
copies between units) is not included.
"""
from __future__ import annotations

FORMULA = ("t(u) = Σ calls per {unit} × ms per call over the graphs on compute unit u; "
           "sequential RTF = Σ_u t(u) / {ms:g} ms; pipelined RTF = max_u t(u) / {ms:g} ms "
           "(units overlap on different {unit}s); the estimate is the pipelined RTF when graphs run on "
           "more than one unit")


def calls_per_unit(expr: str, options: dict) -> float:
    sizes = {k.replace("-", "_"): v for k, v in options.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return float(eval(expr, {"__builtins__": {}}, sizes))


def fastest_on_device(manifest: dict) -> dict[str, dict]:
    """Per component, the device-accepted build with the lowest AI Hub inference time."""
    best: dict[str, dict] = {}
    for b in manifest["builds"]:
        h = b.get("hub") or {}
        ms = (h.get("profile") or {}).get("inference_ms")
        if (h.get("parity") or {}).get("verdict") != "accepted" or ms is None:
            continue
        if b["component"] not in best or ms < best[b["component"]]["ms"]:
            best[b["component"]] = {"key": f"{b['component']}/{b['format']}/{b['precision']}", "ms": ms,
                                    "compute_unit": (h.get("route") or {}).get("compute_unit", "?"),
                                    "runtime": (h.get("route") or {}).get("runtime")}
    return best


def estimate(manifest: dict, realtime, options: dict, source: str = "") -> dict | None:
    if realtime is None:
        return None
    best = fastest_on_device(manifest)
    rows, missing = [], []
    for comp, expr in realtime.calls:
        chosen = [(comp, expr)] if comp in best else list(realtime.alternatives.get(comp, ()))
        if not chosen or any(c not in best for c, _ in chosen):
            missing.append(comp)
            continue
        for c, e in chosen:
            n = calls_per_unit(e, options)
            rows.append({"component": c, "build": best[c]["key"], "runtime": best[c]["runtime"],
                         "compute_unit": best[c]["compute_unit"], "ms_per_call": best[c]["ms"],
                         "call": realtime.call_names.get(c, "call"),
                         "calls": expr_text(e, n), "calls_per_unit": round(n, 6),
                         "ms_per_unit": round(best[c]["ms"] * n, 3)})
    by_unit: dict[str, float] = {}
    for r in rows:
        by_unit[r["compute_unit"]] = round(by_unit.get(r["compute_unit"], 0.0) + r["ms_per_unit"], 3)
    out = {"unit": realtime.unit, "unit_ms": realtime.unit_ms, "doc": realtime.doc, "graphs": rows,
           "by_compute_unit": by_unit, "missing": missing, "source": source,
           "formula": FORMULA.format(unit=realtime.unit, ms=realtime.unit_ms),
           "sequential_rtf": None, "pipelined_rtf": None, "rtf": None, "mode": None}
    if rows and not missing:
        seq = sum(by_unit.values()) / realtime.unit_ms
        pipe = max(by_unit.values()) / realtime.unit_ms
        out.update({"sequential_rtf": round(seq, 4), "pipelined_rtf": round(pipe, 4),
                    "mode": "pipelined" if len(by_unit) > 1 else "sequential",
                    "rtf": round(pipe if len(by_unit) > 1 else seq, 4)})
    return out


def expr_text(expr: str, value: float) -> str:
    return expr if expr.strip() == f"{value:g}" else f"{expr} = {value:g}"


def lines(r: dict) -> list[str]:
    """The estimate for people, one fact per line (report.md, stdout)."""
    unit, ms = r["unit"], r["unit_ms"]
    out = [f"{g['component']} ({g['build'].split('/', 1)[1]}, {g['compute_unit'].upper()}): "
           f"{g['ms_per_call']:.2f} ms per {g.get('call', 'call')} × {g['calls']} per {unit} = "
           f"{g['ms_per_unit']:.2f} ms per {unit}"
           for g in r["graphs"]]
    out.append("per " + unit + f" of {ms:g} ms: " + " · ".join(f"{u.upper()} {t:.2f} ms"
                                                            for u, t in r["by_compute_unit"].items()))
    if r["missing"]:
        out.append(f"RTF not estimated: no device-accepted profile for {', '.join(r['missing'])}")
        return out
    terms = " + ".join(f"{t:.2f}" for t in r["by_compute_unit"].values())
    out.append(f"sequential RTF = ({terms}) / {ms:g} = {r['sequential_rtf']:.3f}")
    if r["mode"] == "pipelined":
        terms = ", ".join(f"{t:.2f}" for t in r["by_compute_unit"].values())
        out.append(f"pipelined RTF = max({terms}) / {ms:g} = {r['pipelined_rtf']:.3f}")
    out.append(f"RTF estimate ({r['mode']}): {r['rtf']:.3f}" + (f" [{r['source']}]" if r["source"] else ""))
    return out
