"""`omni-export hub submit OUT` (and `--hub` after a build): accepted builds -> AI Hub -> verdicts.

Everything comes from OUT: manifest.json (accepted builds, gates, placement), sources/ (the ONNX
to upload), parity-inputs/ (held-out inputs and fp32 references, calibration inputs). The result
goes back into OUT: hub/jobs.json, each build's "hub" dict and a top-level "hub" in
manifest.json, the reports. A build whose device outputs fall under its gate is rejected like a
local one: status "rejected" (rejected_by "device"), its files moved to rejected/.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import UsageError
from . import records
from .client import DeviceInfo, Hub, HubUsageError
from .jobs import BuildJobs, Context
from .routes import plan

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


@dataclass
class Outcome:
    manifest: dict
    exit_code: int
    notes: list = field(default_factory=list)


class _Silent:
    def note(self, text: str) -> None:
        pass


def submit(out: Path, opts: SubmitOptions, progress=None, hub: Hub | None = None) -> Outcome:
    from ..commands.reports import load_manifest
    from ..recipes import get_recipe
    from ..targets import get_target

    progress = progress or _Silent()
    root, m = load_manifest(out)
    target = get_target(m["target"]["name"])
    recipe = get_recipe(m["recipe"]["name"])
    if hub is None or hub.client is None:
        hub = (hub or Hub()).connect()
    with records.lock(root):
        record = records.load(root) or records.new(hub.label)
        record["client"] = hub.label
        device = pin_device(hub, record, target, opts.device)
        qairt = pin_qairt(hub, record, m, opts.qairt)
        routes, left = plan(m, target, opts.quantize_on, tuple(opts.components), tuple(opts.formats))
        if not routes and not record["builds"]:
            raise UsageError("nothing to submit to AI Hub: " +
                             "; ".join(f"{x['key']}: {x['reason']}" for x in left[:4]) if left else
                             "nothing to submit to AI Hub: no build matches")
        record["left_out"] = left

        def save() -> None:
            records.save(root, record)
            apply(root, m, record, recipe)
            from ..artifacts.store import atomic_write_json

            atomic_write_json(root / "manifest.json", m)

        ctx = Context(hub, root, m, record, device, qairt, recipe, save)
        tasks = [BuildJobs(ctx, r, opts.resubmit) for r in routes]
        save()
        _wait(tasks, hub, opts.timeout_s, progress)
        save()
        _reports(root, m)
    return Outcome(m, exit_code(m), notes(m))


def _wait(tasks: list[BuildJobs], hub: Hub, timeout_s: float, progress) -> None:
    deadline = time.time() + max(0.0, timeout_s)
    seen: dict[str, str] = {}
    while True:
        live = [t for t in tasks if not t.finished]
        for t in live:
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
                progress.note(f"AI Hub: {what} job {s['id']} submitted ({s['url']})")
            elif state == "success":
                progress.note(f"AI Hub: {what} job {s['id']} succeeded")
            else:
                progress.note(f"AI Hub: {what} job {s.get('id') or '(not created)'} FAILED: {s['message']}")


# ------------------------------------------------------------------------------------------ pinning

def pin_device(hub: Hub, record: dict, target, requested: str | None) -> DeviceInfo:
    """The device every job of this directory runs on: recorded at the first submission."""
    recorded = record.get("device")
    has_jobs = any(b.get("steps") for b in record["builds"].values())
    if recorded and has_jobs:
        if requested and requested != recorded["name"]:
            raise HubUsageError(f"the AI Hub jobs recorded in hub/jobs.json ran on '{recorded['name']}'; "
                                f"to run on '{requested}', copy the build to another directory first")
        return DeviceInfo(recorded["name"], recorded["os"], recorded["attributes"])
    name = requested or target.hub_device
    if not name:
        raise HubUsageError(f"target {target.name} names no AI Hub device; pass --device "
                            f"(omni-export hub devices lists them)")
    info = hub.device(name)
    record["device"] = info.to_json()
    return info


def pin_qairt(hub: Hub, record: dict, manifest: dict, requested: str | None) -> str:
    """The QAIRT version every compile and inference job pins (--qairt_version), recorded once.

    Default: the QNN major.minor the local HTP simulator scored with, when AI Hub offers it (the
    device then runs the same QNN release as the local verdict), else AI Hub's default version."""
    pinned = (record.get("qairt_version") or {}).get("pinned")
    has_jobs = any(b.get("steps") for b in record["builds"].values())
    if pinned and has_jobs:
        if requested and requested != pinned:
            raise HubUsageError(f"the AI Hub jobs recorded in hub/jobs.json pinned QAIRT {pinned}; "
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
        local = ".".join(str(manifest["toolchain"].get("qnn") or "").split(".")[:2])
        default = next((f.api_version for f in frameworks if "default" in f.api_tags), None)
        if local in offered:
            version, why = local, f"the QNN release the local HTP simulator scored with (QNN {local})"
        elif default:
            version, why = default, (f"AI Hub's default; the local simulator's QNN {local or 'unknown'} "
                                     f"is not offered")
        else:
            raise HubUsageError("AI Hub lists no default QAIRT version; pass --qairt-version")
    record["qairt_version"] = {"pinned": version, "full": offered[version].full_version, "why": why,
                               "offered": sorted(offered)}
    return version


# ------------------------------------------------------------------------------------------ results

def apply(root: Path, m: dict, record: dict, recipe) -> None:
    """Merge the record into the manifest: each build's "hub", device rejections, summaries, RTF."""
    from .rtf import estimate

    for b in m["builds"]:
        r = record["builds"].get(f"{b['component']}/{b['format']}/{b['precision']}")
        if r is None:
            continue
        b["hub"] = copy.deepcopy(r)
        if (r.get("parity") or {}).get("verdict") == "rejected" and b["status"] == "accepted":
            _reject_on_device(root, b)
    for name, info in m["components"].items():
        info["accepted"] = any(b["status"] == "accepted" for b in m["builds"] if b["component"] == name)
    m["summary"].update({
        "accepted": sum(b["status"] == "accepted" for b in m["builds"]),
        "rejected": sum(b["status"] == "rejected" for b in m["builds"]),
        "components_without_accepted_build": sorted(c for c, i in m["components"].items() if not i["accepted"]),
    })
    submitted = sorted({r.split("/")[0] for r in record["builds"]})
    verified = {b["component"] for b in m["builds"]
                if ((b.get("hub") or {}).get("parity") or {}).get("verdict") == "accepted"}
    m["hub"] = {
        "client": record["client"], "record": records.RECORD, "device": record["device"],
        "qairt_version": record["qairt_version"], "updated": records.now(),
        "summary": {**records.summary(record), "components": submitted,
                    "components_without_device_accepted_build": [c for c in submitted if c not in verified]},
        "left_out": record.get("left_out", []),
        "rtf": estimate(m, recipe.realtime, m["options"].get("recipe_options") or {}, source=record["client"]),
    }


def _reject_on_device(root: Path, b: dict) -> None:
    """Rejected on the device: the same fate as a local rejection (files under rejected/)."""
    (root / "rejected").mkdir(exist_ok=True)
    for f in b["files"]:
        src = root / f["path"]
        dest = root / "rejected" / Path(f["path"]).name
        if src.exists() and src != dest:
            os.replace(src, dest)
        f["path"] = dest.relative_to(root).as_posix()
    b["status"] = "rejected"
    b["rejected_by"] = "device"


def exit_code(m: dict) -> int:
    hub = m.get("hub") or {}
    failed = (m["summary"]["components_without_accepted_build"] or m["summary"].get("end_to_end_failed")
              or (hub.get("summary") or {}).get("components_without_device_accepted_build"))
    return 3 if failed else 0


def notes(m: dict) -> list[str]:
    s = (m.get("hub") or {}).get("summary") or {}
    out = []
    if s.get("waiting"):
        out.append(f"{s['waiting']} build(s) still waiting on AI Hub; rerun `omni-export hub submit` to keep "
                   f"waiting (recorded jobs are not submitted again)")
    if s.get("failed"):
        out.append(f"{s['failed']} build(s) have a FAILED job; `omni-export hub submit --resubmit` retries them")
    return out


def _reports(root: Path, m: dict) -> None:
    from ..commands.reports import recorded_regate
    from ..parity.regate import regate
    from ..reports import write_reports

    old = recorded_regate(root)
    write_reports(root, m, regate(m, old["gates_db"], old.get("fail_under_db")) if old else None)
