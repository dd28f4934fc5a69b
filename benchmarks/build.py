"""Build benchmark: one `omni-export qwen3-tts` run as a monitored subprocess, and what its manifest
recorded about time and artifacts. The harness adds only what the manifest cannot know: the
wall time seen from outside (Python start-up and imports included) and the process tree's peak
RssAnon. Stages the manifest does not time are listed as not recorded, never derived by
subtraction (MEASURING.md rule 7).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

# The budgets (random weights at real shapes, this 2-core / 24 GiB machine); GB = 1e9 bytes.
BUDGETS = {"1.7b": {"peak_rss_anon_bytes": 12e9, "wall_s": 20 * 60},
           "0.6b": {"peak_rss_anon_bytes": 6e9, "wall_s": 8 * 60}}
REBUILD_BUDGET_S = 5
NOT_RECORDED = ("load checkpoint (incl. writing the random-weight checkpoint)", "end-to-end parity",
                "writing parity.json / report.md / report.html")


def command(size: str, out: Path, extra: list[str]) -> list[str]:
    """The user's command, run from this source tree (`python -m omni_export.cli` is `omni-export`)."""
    cmd = [sys.executable, "-m", "omni_export.cli", "qwen3-tts", "--target", "s25-htp", "--json", "--out", str(out)]
    if size != "tiny":
        cmd += ["--random-weights", "--size", size]
    return cmd + list(extra)


def summarize(manifest: dict) -> dict:
    """Timings and artifact sizes exactly as the manifest records them, grouped for reading."""
    from omni_export.reports.parity import parity_json

    lowest = {(p["component"], p["format"], p["precision"]): p.get("min_snr_db")
              for p in parity_json(manifest)["builds"]}
    builds = []
    for b in manifest.get("builds", []):
        files = [{"path": f["path"], "bytes": f["bytes"]} for f in b.get("files", [])]
        builds.append({"name": b["name"], "component": b["component"], "format": b["format"],
                       "precision": b["precision"], "status": b["status"],
                       "min_snr_db": lowest.get((b["component"], b["format"], b["precision"])),
                       "timings": b.get("timings", {}),
                       "files": files, "bytes": sum(f["bytes"] for f in files),
                       **({"cache": b["cache"]} if "cache" in b else {}),
                       **({"error": b["error"]} if b.get("error") else {})})
    comps = {}
    for name, info in manifest.get("components", {}).items():
        mine = [b for b in builds if b["component"] == name]
        comps[name] = {"timings": info.get("timings", {}),
                       "lower_s_sum": round(sum(b["timings"].get("lower_s", 0) for b in mine), 3),
                       "run_wait_s_sum": round(sum(b["timings"].get("run_wait_s", 0) for b in mine), 3),
                       "artifact_bytes": sum(b["bytes"] for b in mine),
                       "builds": len(mine), "accepted": sum(b["status"] == "accepted" for b in mine)}
        if info.get("repair"):          # precision repair's searches: each step's score, share and seconds
            comps[name]["repair"] = {p: {k: v for k, v in s.items() if k not in ("sensitivity", "attribution")}
                                     for p, s in info["repair"].items()}
    return {
        "timings": manifest.get("timings", {}),
        "components": comps,
        "builds": builds,
        "artifact_bytes": {"accepted": sum(b["bytes"] for b in builds if b["status"] == "accepted"),
                           "rejected": sum(b["bytes"] for b in builds if b["status"] != "accepted")},
        "summary": manifest.get("summary"),
        "end_to_end": [{k: r.get(k) for k in ("runner", "precision", "verdict", "reason")}
                       for r in manifest.get("end_to_end", [])],
        "checkpoint": {k: manifest.get("checkpoint", {}).get(k) for k in ("label", "weights", "config", "options")},
        "toolchain": manifest.get("toolchain"),
        "host": manifest.get("host"),
        "options": manifest.get("options"),
        "jobs": {k: v for k, v in (manifest.get("jobs") or {}).items() if k != "graph"},
        "what_if": what_if(manifest, ((manifest.get("jobs") or {}).get("memory_gate") or {}).get("budget_bytes")),
        "not_recorded_by_the_manifest": list(NOT_RECORDED),
    }


WHAT_IF_WORKERS = (2, 4, 8, 16)


def what_if(manifest: dict, budget_bytes: int | None = None) -> dict | None:
    """The recorded job graph's critical path and its wall at 2 / 4 / 8 / 16 workers: a projection by
    list scheduling over the real DAG, the recorded job durations and memory estimates (driver jobs in
    their own lane; heavy jobs under `budget_bytes` as the build's memory gate would), not a measurement."""
    from omni_export.jobs.graph import Job, JobGraph, project_wall

    records = ((manifest or {}).get("jobs") or {}).get("graph") or []
    timed = [r for r in records if r.get("seconds") is not None]
    if not timed:
        return None
    ids = {r["id"] for r in timed}
    g, added, pending = JobGraph(), set(), list(timed)
    while pending:                        # jobs added under way (repair steps) are recorded after the
        later = []                        # rows they hold: add each once its dependencies are in
        for r in pending:
            deps = tuple(d for d in r["deps"] if d in ids)
            if all(d in added for d in deps):
                g.add(Job(r["id"], r["kind"], deps, seconds=r["seconds"]))
                added.add(r["id"])
            else:
                later.append(r)
        if len(later) == len(pending):
            raise ValueError(f"the recorded job graph has a cycle through {later[0]['id']}")
        pending = later
    crit, path = g.critical_path()
    by_kind: dict = {}
    for r in timed:
        k = by_kind.setdefault(r["kind"], {"jobs": 0, "seconds": 0.0})
        k["jobs"] += 1
        k["seconds"] = round(k["seconds"] + r["seconds"], 3)
    return {"projection": True, "jobs": len(timed), "job_seconds": round(sum(r["seconds"] for r in timed), 3),
            "critical_path_s": round(crit, 3), "critical_path": path,
            "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]["seconds"])),
            "memory_budget_bytes": budget_bytes,
            "wall_s_at_workers": {str(n): round(project_wall(timed, n, budget_bytes), 3) for n in WHAT_IF_WORKERS}}


def tree_bytes(root: Path) -> dict:
    """Bytes on disk under the output directory, by top-level entry (checkpoint, artifacts, ...)."""
    out = {}
    if not root.exists():
        return out
    for entry in sorted(root.iterdir()):
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        out[entry.name] = sum(p.stat().st_size for p in files if not p.is_symlink())
    return out


def disk_needed(results: Path, size: str) -> tuple[int, str] | None:
    """Bytes the newest completed build of this size left in its output directory (`disk_bytes` of
    its result), and that result's name; with no completed one, the most a stopped run had written."""
    done, stopped = None, None
    for f in sorted(results.glob(f"build-{size}-*.json")):            # names sort by time
        try:
            d = json.loads(f.read_text())
            total = int(sum(v for v in (d.get("disk_bytes") or {}).values() if isinstance(v, (int, float))))
        except (OSError, ValueError, AttributeError):
            continue
        if d.get("status") == "ok":
            done = (total, f.name)
        elif stopped is None or total > stopped[0]:
            stopped = (total, f.name)
    return done or stopped


def disk_shortfall(work: Path, results: Path, size: str, margin: float = 1.1) -> str | None:
    """Why this build would run out of disk, or None: the free space where it writes against what
    an earlier run of this size wrote (`disk_needed`), plus 10 %. A 1.7B build writes ~52 GB;
    two of ours stopped on a full disk after 58 and 48 minutes."""
    need = disk_needed(results, size)
    if need is None:
        return None
    probe = work
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free >= need[0] * margin:
        return None
    return (f"{free / 1e9:.1f} GB free under {probe}, and a {size} build wrote {need[0] / 1e9:.1f} GB "
            f"({need[1]}): free {need[0] * margin / 1e9 - free / 1e9:.1f} GB more, or --work "
            f"elsewhere, or --no-disk-check to run anyway")


def largest_tensors(out: Path, n: int = 12) -> list[dict]:
    """The checkpoint's biggest tensors by the fp32 bytes the loader holds them in (read from the
    safetensors headers only): what the resident part of the peak is made of, by name."""
    import struct

    rows = []
    for st in sorted(out.rglob("*.safetensors")):
        with open(st, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            numel = 1
            for d in info["shape"]:
                numel *= d
            rows.append({"file": st.relative_to(out).as_posix(), "tensor": name, "shape": info["shape"],
                         "dtype": info["dtype"], "fp32_bytes": 4 * numel})
    total = sum(r["fp32_bytes"] for r in rows)
    top = sorted(rows, key=lambda r: -r["fp32_bytes"])[:n]
    return [{**r, "share_of_checkpoint": round(r["fp32_bytes"] / total, 4)} for r in top]


def read_manifest(out: Path) -> dict | None:
    try:
        return json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def budget(size: str, wall_s: float, memory: dict, exit_code: int | None) -> dict | None:
    b = BUDGETS.get(size)
    if b is None:
        return None
    ran = exit_code in (0, 3)
    cap = b["peak_rss_anon_bytes"]
    return {"peak_rss_anon_bytes_max": cap, "wall_s_max": b["wall_s"],
            "peak_within": ran and memory["peak_rss_anon_bytes"] <= cap,
            "peak_pss_anon_within": ran and memory["peak_pss_anon_bytes"] <= cap,
            "wall_within": ran and wall_s <= b["wall_s"],
            "note": "GB = 1e9 bytes; peak_within judges the RssAnon sum (the issue's figure), "
                    "peak_pss_anon_within the Pss_Anon sum (copy-on-write pages of forks counted once); "
                    "a run that did not complete meets no budget"}


def env() -> dict:
    from .provenance import ROOT

    e = dict(os.environ)
    # a build benchmark measures the whole build, capture included: never read captures kept by earlier runs
    e["OMNI_EXPORT_CAPTURE_CACHE"] = "off"
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    return e
