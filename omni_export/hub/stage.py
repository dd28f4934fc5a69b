"""`omni-export hub submit OUT` (and `--hub` after a build): accepted builds -> AI Hub -> verdicts.

Everything comes from OUT: manifest.json (accepted builds, gates, placement), sources/ (the ONNX
to upload), parity-inputs/ (held-out inputs and fp32 references, calibration inputs). The results
go back into OUT through the Store (amend mode: journal, atomic writes): each build's "hub" and
the top-level "hub" in manifest.json (rewritten after every change), result files under hub/,
the reports. A build whose device outputs fall under its gate is rejected like a local one:
status "rejected", rejected_by "device", its files moved under rejected/.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import UsageError
from . import records
from .client import DeviceInfo, Hub, HubUsageError
from .jobs import BuildJobs, Context, LinkJobs, link_state
from .routes import link_plan, plan

DEFAULT_TIMEOUT_S = 6 * 3600.0


@dataclass
class SubmitOptions:
    device: str | None = None            # AI Hub device name; default: the target's hub_device
    qairt: str | None = None             # QAIRT version to pin; default: see pin_qairt()
    quantize_on: str = "local"           # quantized builds: local QDQ, or AI Hub's quantize job
    resubmit: bool = False               # retry builds whose job failed
    timeout_s: float = DEFAULT_TIMEOUT_S  # stop waiting (jobs keep running; rerun to keep waiting)
    components: tuple = ()
    formats: tuple = ()
    precisions: tuple = ()


@dataclass
class Outcome:
    manifest: dict
    exit_code: int
    notes: list = field(default_factory=list)


class _Silent:
    def note(self, text: str) -> None:
        pass


def submit(out: Path, opts: SubmitOptions, progress=None, hub: Hub | None = None,
           previous: dict | None = None, *, refresh_reports) -> Outcome:
    """Submit the accepted builds of OUT and wait for their jobs (up to opts.timeout_s).

    `previous` is the manifest OUT held before a rebuild: the AI Hub jobs of builds whose uploaded
    ONNX is byte-identical are adopted (waited on, their results downloaded again), not resubmitted.
    `refresh_reports(root, manifest, write)` rewrites OUT's reports through the store's `write` when the
    manifest changed (the caller's: reports are a layer above hub, see docs/layers.md)."""
    from ..artifacts.manifest import read_manifest
    from ..artifacts.store import MANIFEST, Store
    from ..recipes import get_recipe
    from ..targets import placed_on

    progress = progress or _Silent()
    store = Store(Path(out))
    if hub is None or hub.client is None:
        hub = (hub or Hub()).connect()          # the token is checked before OUT is touched
    if (store.root / MANIFEST).exists():
        no_sources(store.root, read_manifest(store.root))   # damaged, or listing a file outside OUT: refused untouched
    m = store.amend("hub")
    start = _content(m)
    try:
        target, recipe = placed_on(m["target"]["name"], m["target"].get("placement") or {}), get_recipe(m["recipe"]["name"])
        section = m.get("hub") or records.new_section(hub.label)
        if previous and previous.get("hub") and not m.get("hub"):
            section["uploads"] = copy.deepcopy(previous["hub"].get("uploads") or section["uploads"])
            for k in ("device", "qairt_version"):
                section[k] = copy.deepcopy(previous["hub"].get(k))
        m["hub"] = section
        section["client"] = hub.label
        device = pin_device(hub, m, target, opts.device)
        qairt = pin_qairt(hub, m, opts.qairt)
        routes, left = plan(m, target, opts.quantize_on, tuple(opts.components), tuple(opts.formats),
                            tuple(opts.precisions), recipe.links)
        link_routes, link_left = link_plan(routes, recipe.links)
        left = left + link_left
        if not routes and not records.submitted(m):
            raise UsageError("nothing to submit to AI Hub: " + ("; ".join(f"{x['key']}: {x['reason']}" for x in left[:4])
                                                               or "no build matches"))
        section["left_out"] = left
        builds = {records.key(b): b for b in m["builds"]}
        if previous:
            _adopt(builds, previous, routes, device, qairt)
        stale: list[str] = []

        def save() -> None:
            stale.extend(apply(store, m, recipe))
            store.write_manifest(m)
            store.remove(stale)
            stale.clear()

        ctx = Context(hub, store, m, device, qairt, recipe, save)
        tasks = [BuildJobs(ctx, r, builds[r.key], opts.resubmit) for r in routes]
        tasks += [LinkJobs(ctx, r, builds, opts.resubmit) for r in link_routes]
        save()
        _wait(tasks, hub, opts.timeout_s, progress)
        save()
        if _content(m) != start or store.recovered is not None or not _reports_exist(store.root):
            refresh_reports(store.root, m, store.write_text)   # (a rerun that changed nothing keeps its reports)
        store.finish(m)
    except BaseException:
        store.abort()
        raise
    return Outcome(m, exit_code(m), notes(m))


def no_sources(out: Path, m: dict) -> None:
    """A build made without --keep-sources (or --hub) kept no sources/: nothing AI Hub could compile."""
    if (m.get("options") or {}).get("keep_sources") is False and \
            not any("sources" in c for c in (m.get("components") or {}).values()):
        raise UsageError(f"{out} was built without sources/ (the ONNX AI Hub compiles from); rebuild it with "
                         f"--keep-sources (or --hub)")


def _wait(tasks: list[BuildJobs], hub: Hub, timeout_s: float, progress) -> None:
    deadline = time.time() + max(0.0, timeout_s)
    seen: dict[str, str] = {}
    while True:
        for t in [t for t in tasks if not t.finished]:
            t.step()
            _announce(t, seen, progress)
        if all(t.finished for t in tasks) or time.time() >= deadline:
            return
        time.sleep(hub.poll_seconds)


def _announce(t: BuildJobs, seen: dict, progress) -> None:
    for s in t.rec["steps"]:
        key = f"{t.route.key}:{s['name']}"
        state = s["state"] if s["state"] in ("success", "failed") else ("submitted" if s.get("id") else "")
        if state and seen.get(key) != state:
            seen[key] = state
            what = f"{t.route.key} {s['kind']}"
            if state == "submitted":
                progress.note(f"AI Hub: {what} job {s['id']} ({s['url']})")
            elif state == "success":
                progress.note(f"AI Hub: {what} job {s['id']} succeeded")
            else:
                progress.note(f"AI Hub: {what} job {s.get('id') or '(not created)'} FAILED: {s['message']}")
    for g, r in (t.rec.get("graphs") or {}).items():
        if r.get("parity") and seen.get(f"{t.route.key}:{g}") != "scored":
            seen[f"{t.route.key}:{g}"] = "scored"
            p = r["parity"]
            progress.note(f"AI Hub: {t.route.key} graph {g} on the device: {p['verdict']} ({p['reason']})")
    if t.rec.get("parity") and seen.get(t.route.key) != "scored":
        seen[t.route.key] = "scored"
        p = t.rec["parity"]
        progress.note(f"AI Hub: {t.route.key} on the device: {p['verdict']} ({p['reason']})")


def _adopt(builds: dict, previous: dict, routes, device: DeviceInfo, qairt: str) -> None:
    """Take over the jobs of the build OUT held before a rebuild, for builds whose uploaded ONNX,
    route, device and QAIRT are unchanged. Finished jobs are polled again so their results
    (downloaded files were pruned with the old build) come back without a new submission."""
    old = {records.key(b): b.get("hub") for b in previous.get("builds", []) if isinstance(b.get("hub"), dict)}
    for r in routes:
        rec, b = old.get(r.key), builds[r.key]
        if not rec or b.get("hub"):
            continue
        route = rec.get("route") or {}
        if (route.get("upload_sha256") != r.upload_sha256 or route.get("runtime") != r.runtime
                or route.get("compute_unit") != r.compute_unit or route.get("device") != device.name
                or route.get("qairt_version") != qairt or list(route.get("steps") or []) != list(r.steps)):
            continue
        rec = copy.deepcopy(rec)
        for s in rec.get("steps", []):
            if s["state"] == "success":
                s["state"] = "submitted"         # results are fetched again from the same job
        rec.pop("parity", None)
        rec.pop("profile", None)
        rec["files"] = []
        rec["adopted"] = records.now()
        b["hub"] = rec


# ------------------------------------------------------------------------------------------ pinning

def pin_device(hub: Hub, m: dict, target, requested: str | None) -> DeviceInfo:
    """The device every job of this directory runs on: recorded at the first submission."""
    section = m["hub"]
    recorded = section.get("device")
    if recorded and records.has_jobs(m):
        if requested and requested != recorded["name"]:
            raise HubUsageError(f"the AI Hub jobs recorded in manifest.json ran on '{recorded['name']}'; "
                                f"to run on '{requested}', copy the build to another directory first")
        return DeviceInfo(recorded["name"], recorded["os"], recorded["attributes"])
    name = requested or target.hub_device
    if not name:
        raise HubUsageError(f"target {target.name} names no AI Hub device; pass --device "
                            f"(omni-export hub devices lists them)")
    info = hub.device(name)
    section["device"] = info.to_json()
    return info


def pin_qairt(hub: Hub, m: dict, requested: str | None) -> str:
    """The QAIRT version every compile and inference job pins (--qairt_version), recorded once.

    Default: the major.minor of the QNN the local toolchain ships (onnxruntime-qnn's, which the HTP
    simulator, the DLC and the context binaries use), when AI Hub offers it, so the device runs the
    QNN release the local verdicts came from; else AI Hub's default version."""
    section = m["hub"]
    pinned = (section.get("qairt_version") or {}).get("pinned")
    if pinned and records.has_jobs(m):
        if requested and requested != pinned:
            raise HubUsageError(f"the AI Hub jobs recorded in manifest.json pinned QAIRT {pinned}; "
                                f"to use {requested}, copy the build to another directory first")
        return pinned
    frameworks = [f for f in hub.frameworks() if f.name.upper() == "QAIRT"]
    offered = {f.api_version: f for f in frameworks}
    if requested:
        if requested not in offered:
            raise HubUsageError(f"AI Hub offers QAIRT {', '.join(sorted(offered)) or 'nothing'}; "
                                f"--qairt-version {requested} is not one of them")
        version, why = requested, "--qairt-version"
    else:
        local = ".".join(str(m["toolchain"].get("qnn") or "").split(".")[:2])
        default = next((f.api_version for f in frameworks if "default" in f.api_tags), None)
        if local in offered:
            version, why = local, f"the QNN of the local toolchain (onnxruntime-qnn's QNN {local})"
        elif default:
            version, why = default, f"AI Hub's default; the local toolchain's QNN {local or 'unknown'} is not offered"
        else:
            raise HubUsageError("AI Hub lists no default QAIRT version; pass --qairt-version")
    section["qairt_version"] = {"pinned": version, "full": offered[version].full_version, "why": why,
                                "offered": sorted(offered)}
    return version


# ------------------------------------------------------------------------------------------ results

def apply(store, m: dict, recipe) -> list[str]:
    """Fold the jobs' results into the manifest: device rejections, summaries, the RTF estimate.
    Returns the paths a device rejection moved away from (removed once the manifest is written)."""
    from .rtf import estimate

    moved = []
    for b in m["builds"]:
        verdict = ((b.get("hub") or {}).get("parity") or {}).get("verdict")
        if verdict == "rejected" and b["status"] == "accepted":
            moved += _reject_on_device(store, b)
        if verdict and (b.get("parity") or {}).get("proxy"):
            _rejudged(m, b)
    for name, info in m["components"].items():
        info["accepted"] = any(b["status"] == "accepted" for b in m["builds"] if b["component"] == name)
    m["summary"].update({
        "accepted": sum(b["status"] == "accepted" for b in m["builds"]),
        "rejected": sum(b["status"] == "rejected" for b in m["builds"]),
        "components_without_accepted_build": sorted(c for c, i in m["components"].items() if not i["accepted"]),
    })
    section = m["hub"]
    subs = records.submitted(m)
    comps = sorted({k.split("/")[0] for k in subs})
    verified = {b["component"] for b in m["builds"]
                if ((b.get("hub") or {}).get("parity") or {}).get("verdict") == "accepted"}
    section["updated"] = records.now()
    section["summary"] = {**records.summary(m), "components": comps,
                          "components_without_device_accepted_build": [c for c in comps if c not in verified]}
    if section.get("links"):
        section["summary"]["links"] = link_summary(section["links"])
    section["rtf"] = estimate(m, recipe.realtime, m["options"].get("recipe_options") or {},
                              source=section["client"])
    return moved


def _rejudged(m: dict, b: dict) -> None:
    """A build judged locally by proxy (runtime.runners.proxy_verdict) now has the device's verdict: its
    proxy note says so, with the device's lowest gated SNR."""
    import math

    from ..artifacts.scores import as_json_db, gated_outputs, min_snr_db

    proxy, dev = b["parity"]["proxy"], b["hub"]["parity"]
    db = min_snr_db(dev.get("outputs") or [], gated_outputs(m, b["component"]))
    where = f"{(m['hub'].get('device') or {}).get('name', 'the device')} via {m['hub'].get('client')}"
    proxy["device"] = {"verdict": dev["verdict"], "min_snr_db": None if db is None else as_json_db(db), "on": where}
    said = "" if db is None else ", exact" if db == math.inf else f", {db:.1f} dB" if math.isfinite(db) else ", NaN/Inf"
    proxy["note"] = (f"judged on {proxy['runner']} at {proxy['precision']} by proxy for the {proxy['for']}; "
                     f"re-judged on {where}: {dev['verdict']}{said}")


def _reject_on_device(store, b: dict) -> list[str]:
    """Rejected on the device: the same fate as a local rejection (files under rejected/). The files
    are linked there first; the old paths go once the manifest naming the new ones is written."""
    old = []
    for f in b["files"]:
        if f["path"].startswith("rejected/"):
            continue
        rec = store.put_file(f"rejected/{Path(f['path']).name}", store.root / f["path"])
        old.append(f["path"])
        f["path"] = rec.path
    b["status"] = "rejected"
    b["rejected_by"] = "device"
    return old


def link_summary(links: dict) -> dict:
    """Per linked binary: its state, and per graph the device verdict, SNR and time."""
    out = {}
    for key, rec in links.items():
        graphs = {}
        for g in (rec.get("route") or {}).get("graphs") or []:
            r = (rec.get("graphs") or {}).get(g) or {}
            p, prof = r.get("parity") or {}, r.get("profile") or {}
            dbs = [o["snr_db"] for o in p.get("outputs") or [] if isinstance(o.get("snr_db"), (int, float))]
            graphs[g] = {"verdict": p.get("verdict"), "min_snr_db": min(dbs) if dbs else None,
                         "inference_ms": prof.get("inference_ms"), "peak_memory_mb": prof.get("peak_memory_mb")}
        failed = next((s["message"] for s in rec.get("steps") or [] if s["state"] == "failed"), None)
        out[key] = {"state": link_state(rec), "graphs": graphs, "failure": failed,
                    "bytes": rec.get("linked_bytes")}
    return out


def exit_code(m: dict) -> int:
    hub = m.get("hub") or {}
    failed = (m["summary"]["components_without_accepted_build"] or m["summary"].get("end_to_end_failed")
              or (hub.get("summary") or {}).get("components_without_device_accepted_build")
              or any(g["verdict"] == "rejected" for link in ((hub.get("summary") or {}).get("links") or {}).values()
                     for g in link["graphs"].values()))        # a failed link job is a note, like a failed build job
    return 3 if failed else 0


def notes(m: dict) -> list[str]:
    s = (m.get("hub") or {}).get("summary") or {}
    out = []
    if s.get("waiting"):
        out.append(f"{s['waiting']} build(s) still waiting on AI Hub; rerun `omni-export hub submit` to keep "
                   f"waiting (recorded jobs are not submitted again)")
    if s.get("failed"):
        out.append(f"{s['failed']} build(s) have a FAILED job; `omni-export hub submit --resubmit` retries them")
    for key, link in (s.get("links") or {}).items():
        if link["state"] == "failed":
            out.append(f"{key}: FAILED ({link['failure']}); `omni-export hub submit --resubmit` retries it")
        elif link["state"] in ("pending", "running"):
            out.append(f"{key}: still waiting on AI Hub; rerun `omni-export hub submit` to keep waiting")
        else:
            rejected = [g for g, r in link["graphs"].items() if r["verdict"] != "accepted"]
            if rejected:
                out.append(f"{key}: graph(s) {', '.join(rejected)} of the linked binary under the gate on the device")
    return out


def _content(m: dict) -> str:
    """The manifest without the time of its last save (what the reports are derived from)."""
    m = {**m, "hub": {k: v for k, v in (m.get("hub") or {}).items() if k != "updated"}}
    return json.dumps(m, sort_keys=True, default=str)


def _reports_exist(root: Path) -> bool:
    from ..artifacts.store import REPORT_FILES

    return all((root / name).is_file() for name in REPORT_FILES)
