"""Latency on the target, projected: time to first audio (TTFA) and the real-time factor (RTF) from
AI Hub's profile of each graph, the host work measured here, and the pipelined schedule of the study.

Pure functions of the manifest (and the recipe's RealTime page): `omni-export latency OUT`, report.md
and report.html show the same figures, each labelled by where it came from.

  graphs      each graph's time per call: AI Hub's estimated_inference_time of its fastest build the
              device accepted (hub/rtf.py fastest_on_device); a graph not profiled is missing
  host        host work per unit of output (sampling, embedding gathers, KV-cache copies, chunk windows):
              `synth --json` on this machine, recorded in OUT by `synth --build OUT --record-latency`
              (manifest["latency"]["synth"]); measured on this CPU, not the phone's
  RTF         per unit of output, one lane per compute unit: the graphs on it (hub/rtf.py) and, on the
              unit of the generation loop (its first graph: the talker), the host work, which runs between
              its calls. Pipelined RTF = slowest lane / unit duration (the vocoder on its unit works on
              one chunk while the loop makes the next); one lane: the sum
  TTFA        the prompt's graphs (RealTime.prompt; the recorded run's call counts when there is one),
              the graph calls that generate the units before the first audio and the graph that decodes
              them (RealTime.first_audio), plus the host work of those units: nothing overlaps yet
  slowest ops each profiled graph's slowest ops (hub/profile.py slowest_ops)
"""
from __future__ import annotations

from .rtf import calls_per_unit, estimate, fastest_on_device

OPS_SHOWN = 5          # slowest ops per graph in the text and the reports (the manifest keeps profile.SLOWEST)
ARITHMETIC = "projection: arithmetic on the figures above"


def project(m: dict, recipe) -> dict:
    """The projection of build manifest `m` of `recipe` (its RealTime page); `needs` says in one line what
    is missing when nothing can be projected."""
    hub = m.get("hub") or {}
    device = (hub.get("device") or {}).get("name") or m["target"].get("hub_device") or "the device"
    out = {"recipe": m["recipe"]["name"], "target": m["target"]["name"], "device": device,
           "client": hub.get("client"), "profiles": None, "needs": None, "rtf": None, "ttfa": None,
           "host": host_record(m), "slowest_ops": slowest_ops(m)}
    rt = recipe.realtime
    if rt is None:
        out["needs"] = (f"{recipe.name} declares no real-time unit of output (its recipe page has no RealTime): "
                        f"there is no TTFA or RTF to project")
        return out
    options = {**{o.name: o.default for o in recipe.options},           # an older manifest may lack some
               **{k: v for k, v in ((m.get("options") or {}).get("recipe_options") or {}).items() if v is not None}}
    best = fastest_on_device(m)
    fa = first_audio(rt, options)
    if not best:
        wanted = [c for c, _ in rt.calls] + [c for c, _ in rt.prompt] + ([fa["graph"]] if fa else [])
        out["needs"] = (f"no AI Hub profile times in this build: submit it (`omni-export hub submit OUT`, or build "
                        f"with --hub) to profile {', '.join(dict.fromkeys(wanted))} on {device}")
        return out
    out["profiles"] = f"{hub.get('client')} on {device}"
    jobs = profile_jobs(m)
    out["rtf"] = _rtf(m, rt, options, out["host"], jobs)
    out["ttfa"] = _ttfa(m, rt, options, best, fa, out["host"], jobs) if fa else None
    return out


def profile_jobs(m: dict) -> dict[str, str]:
    """{build key: the AI Hub inference job whose profile gave its time}."""
    out = {}
    for b in m.get("builds", []):
        step = next((s for s in ((b.get("hub") or {}).get("steps") or []) if s.get("kind") == "inference"), None)
        if step and step.get("id"):
            out[f"{b['component']}/{b['format']}/{b['precision']}"] = step["id"]
    return out


def _source(builds: list[str], jobs: dict) -> str:
    ids = [jobs[b] for b in builds if b in jobs]
    return "AI Hub profile" + (f", job {', '.join(ids)}" if ids else "")


def first_audio(rt, options: dict) -> dict | None:
    from ..recipes import load_callable

    return load_callable(rt.first_audio)(options) if rt.first_audio else None


def host_record(m: dict) -> dict | None:
    """The latest synth run recorded in OUT (record()), with its host work per unit of output."""
    runs = [r for r in ((m.get("latency") or {}).get("synth") or []) if isinstance(r, dict)]
    if not runs:
        return None
    r = max(runs, key=lambda r: str(r.get("recorded", "")))
    lat = r.get("latency") or {}
    per = (lat.get("per_frame_ms") or {}).get("host")
    return {"ms_per_unit": per, "run": r,
            "source": (f"synth --json, {lat.get('timed_on')}; recorded {r.get('recorded')} at omni-export "
                       f"{str(r.get('omni_export_git') or '?')[:10]}")}


def _rtf(m: dict, rt, options: dict, host: dict | None, jobs: dict) -> dict:
    est = estimate(m, rt, options, source="AI Hub profiles")
    for g in est["graphs"]:
        g["source"] = _source([g["build"]], jobs)
    lanes = [{"compute_unit": u, "graphs_ms": ms, "host_ms": 0.0, "ms": ms} for u, ms in est["by_compute_unit"].items()]
    out = {"device": est, "lanes": lanes, "host_ms_per_unit": None, "rtf": None, "mode": None,
           "missing": est["missing"], "source": ARITHMETIC}
    per = (host or {}).get("ms_per_unit")
    if est["graphs"] and isinstance(per, (int, float)):
        loop = est["graphs"][0]["compute_unit"]          # the generation loop's unit (its first graph's)
        lane = next(x for x in lanes if x["compute_unit"] == loop)
        lane["host_ms"], lane["ms"] = round(per, 3), round(lane["graphs_ms"] + per, 3)
        out["host_ms_per_unit"] = per
    if lanes and not est["missing"]:
        total = [x["ms"] for x in lanes]
        out["mode"] = "pipelined" if len(lanes) > 1 else "sequential"
        out["rtf"] = round((max(total) if len(lanes) > 1 else sum(total)) / rt.unit_ms, 4)
    return out


def device_ms(best: dict, rt, component: str, options: dict) -> tuple[float, list[str], str] | None:
    """(ms per call, the builds it comes from, compute unit) of `component` on the device, from its own
    profile or its stand-ins (RealTime.alternatives: the predictor's prefill + 14 steps for the frame)."""
    if component in best:
        b = best[component]
        return b["ms"], [b["key"]], b["compute_unit"]
    alt = rt.alternatives.get(component) or ()
    if alt and all(c in best for c, _ in alt):
        ms = sum(best[c]["ms"] * calls_per_unit(e, options) for c, e in alt)
        return round(ms, 3), [best[c]["key"] for c, _ in alt], best[alt[0][0]]["compute_unit"]
    return None


def _ttfa(m: dict, rt, options: dict, best: dict, fa: dict, host: dict | None, jobs: dict) -> dict:
    run = (host or {}).get("run") or {}
    stages = (run.get("latency") or {}).get("stages_ms") or {}
    terms, missing = [], []

    def add(component: str, calls: float, why: str) -> None:
        if calls <= 0:
            return
        got = device_ms(best, rt, component, options)
        if got is None:
            missing.append(component)
            return
        ms, builds, unit = got
        terms.append({"what": component, "calls": calls, "why": why, "ms_per_call": ms,
                      "ms": round(ms * calls, 3), "compute_unit": unit, "builds": builds,
                      "source": _source(builds, jobs)})

    for comp, expr in rt.prompt:
        counted = _calls(stages, comp, rt)
        if counted is not None:
            add(comp, counted, "the prompt, as often as the recorded synth run called it")
        else:
            add(comp, calls_per_unit(expr, options), "the prompt; one call assumed, no synth run recorded")
    for comp, n in fa["calls"]:
        add(comp, n, f"to generate the {fa['frames']} {rt.unit}(s) of the first chunk")
    add(fa["graph"], 1, f"decodes the first chunk ({fa['frames']} {rt.unit}(s))")
    per = (host or {}).get("ms_per_unit")
    if isinstance(per, (int, float)):
        terms.append({"what": "host", "calls": fa["frames"], "why": f"host work of {fa['frames']} {rt.unit}(s)",
                      "ms_per_call": per, "ms": round(per * fa["frames"], 3), "compute_unit": "host",
                      "source": host["source"]})
    return {"frames": fa["frames"], "graph": fa["graph"], "terms": terms, "missing": missing,
            "host": "included" if isinstance(per, (int, float)) else
                    "not included: no synth run recorded in OUT (`omni-export synth ... --build OUT --record-latency`)",
            "ms": round(sum(t["ms"] for t in terms), 3) if not missing else None, "source": ARITHMETIC}


def _calls(stages: dict, component: str, rt) -> int | None:
    """How many calls the recorded run made of `component` (or of its stand-ins' first graph)."""
    for name in (component, *(c for c, _ in (rt.alternatives.get(component) or ())[:1])):
        n = (stages.get(name) or {}).get("calls")
        if isinstance(n, int):
            return n
    return None


def slowest_ops(m: dict, n: int = OPS_SHOWN) -> list[dict]:
    """Per profiled graph (each submitted build, each graph of a linked binary), its slowest ops."""
    out = []
    for b in m.get("builds", []):
        prof = (b.get("hub") or {}).get("profile") or {}
        if prof.get("slowest_ops"):
            out.append({"graph": f"{b['component']}/{b['format']}/{b['precision']}",
                        "compute_unit": ((b.get("hub") or {}).get("route") or {}).get("compute_unit"),
                        "inference_ms": prof.get("inference_ms"), "ops": prof["slowest_ops"][:n]})
    for key, link in ((m.get("hub") or {}).get("links") or {}).items():
        for g, r in (link.get("graphs") or {}).items():
            prof = (r or {}).get("profile") or {}
            if prof.get("slowest_ops"):
                out.append({"graph": f"{key} {g}", "compute_unit": "npu", "inference_ms": prof.get("inference_ms"),
                            "ops": prof["slowest_ops"][:n]})
    return out


# ---------------------------------------------------------------------------------------- for people

def lines(p: dict) -> list[str]:
    """The projection, one fact per line, each figure with its source (stdout, report.md, report.html)."""
    if p["needs"]:
        return [p["needs"]]
    out = []
    r = p["rtf"]
    if r:
        est = r["device"]
        unit, ms = est["unit"], est["unit_ms"]
        out.append(f"AI Hub profiles: {p['profiles']}")
        out.append(f"Per {unit} of {ms:g} ms:")
        out += [f"  {g['component']} ({g['build'].split('/', 1)[1]}, {g['compute_unit'].upper()}): {g['ms_per_call']:.2f} ms "
                f"per {g.get('call', 'call')} × {g['calls']} = {g['ms_per_unit']:.2f} ms [{g['source']}]"
                for g in est["graphs"]]
        host = p["host"]
        if r["host_ms_per_unit"] is not None:
            out.append(f"  host work: {r['host_ms_per_unit']:.2f} ms per {unit} [{host['source']}]")
        else:
            out.append("  host work: not included (no synth run recorded in OUT: `omni-export synth ... --build OUT "
                       "--json --record-latency` measures it here)")
        if r["missing"]:
            out.append(f"  RTF not projected: no device-accepted profile for {', '.join(r['missing'])}")
        else:
            lanes = " · ".join(f"{x['compute_unit'].upper()} {x['ms']:.2f} ms"
                               + (f" (graphs {x['graphs_ms']:.2f} + host {x['host_ms']:.2f})" if x["host_ms"] else "")
                               for x in r["lanes"])
            how = "slowest lane" if r["mode"] == "pipelined" else "one lane"
            out.append(f"  lanes: {lanes}; RTF ({r['mode']}, {how} / {ms:g} ms) = {r['rtf']:.3f} [{r['source']}]")
    t = p["ttfa"]
    if t:
        out.append(f"Time to first audio (after {t['frames']} {p['rtf']['device']['unit'] if r else 'unit'}(s), "
                   f"first chunk by {t['graph']}):")
        out += [f"  {x['what']}: {x['calls']:g} × {x['ms_per_call']:.2f} ms = {x['ms']:.2f} ms ({x['why']}) [{x['source']}]"
                for x in t["terms"]]
        if t["missing"]:
            out.append(f"  TTFA not projected: no device-accepted profile for {', '.join(t['missing'])}")
        else:
            out.append(f"  TTFA = {t['ms']:.2f} ms, host work {t['host']} [{t['source']}]")
    if p["slowest_ops"]:
        out.append("Slowest ops on the device [AI Hub profile, per op]:")
        for g in p["slowest_ops"]:
            total = f", {g['inference_ms']:.2f} ms per inference" if isinstance(g["inference_ms"], (int, float)) else ""
            ops = " · ".join(f"{o['type']} {o['name']} {o['ms']:.3f} ms ({o['compute_unit']})" for o in g["ops"])
            out.append(f"  {g['graph']} ({str(g['compute_unit']).upper()}{total}): {ops}")
    return out


# ---------------------------------------------------------------------------------------- record

def record(out, summary: dict, runner: str, *, refresh_reports) -> dict:
    """`synth --build OUT --record-latency`: this run's timing into OUT's manifest.json
    (manifest["latency"]["synth"], one entry per runner and graphs, the newest kept), where the
    projection takes the host work from; the reports are rewritten by `refresh_reports(root, manifest,
    write)` (the caller's: reports are a layer above hub, docs/layers.md). Returns the entry."""
    from pathlib import Path

    from ..artifacts.manifest import git_sha
    from ..artifacts.store import Store
    from .records import now

    keep = ("frames", "seconds", "graphs", "predictor", "ttfa_ms", "first_audio_after_frames", "rtf", "latency")
    entry = {"runner": runner, "recorded": now(), "omni_export_git": git_sha(),
             "prompt_tokens": len(summary.get("text_ids") or ()) or None, **{k: summary.get(k) for k in keep}}
    store = Store(Path(out))
    m = store.amend("latency")
    try:
        runs = [r for r in ((m.get("latency") or {}).get("synth") or [])
                if isinstance(r, dict) and (r.get("runner"), r.get("graphs")) != (runner, entry["graphs"])]
        m["latency"] = {"synth": runs + [entry]}
        refresh_reports(store.root, m, store.write_text)
        store.finish(m)
    except BaseException:
        store.abort()
        raise
    return entry
