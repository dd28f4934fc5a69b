"""omni-export benchmarks: build (time, peak RssAnon of the process tree, artifact sizes) and runtime
(exported graphs vs torch eager, side by side). Results go to benchmarks/results/ as JSON.

  python benchmarks/run.py build   --size {tiny,0.6b,1.7b} [-- extra omni-export flags]
  python benchmarks/run.py runtime --size {tiny,0.6b} [--passes N] [--threads N] [--dry-run]

See benchmarks/README.md for what each figure means and the rules applied.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:                    # `python benchmarks/run.py` from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks import build as bb          # noqa: E402
from benchmarks import provenance, proctree  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "benchmarks" / ".work"
SCHEMA = 1
WORKER_LOG = re.compile(r"^\[ *\d+\.\ds\] .*$", re.M)


def _option(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError("expected NAME=VALUE, e.g. context-length=512")
    k, v = text.split("=", 1)
    return k, int(v) if v.lstrip("-").isdigit() else v


def _subset(valid: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; valid: {', '.join(valid)}")
        return items
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--results", default=str(RESULTS), help="directory for the result JSON")
    common.add_argument("--work", default=str(WORK), help="scratch directory (checkpoints, exported graphs)")
    common.add_argument("--keep", action="store_true", help="keep the scratch files")
    common.add_argument("--interval", type=float, default=0.2, help="RssAnon sampling interval, seconds")
    common.add_argument("--timeout", type=float, default=None, help="kill the measured process tree after N s")

    b = sub.add_parser("build", parents=[common], help="time and memory of a full omni-export build")
    b.add_argument("--size", choices=("tiny", "0.6b", "1.7b"), required=True)
    b.add_argument("--extra", nargs="*", default=[], help=argparse.SUPPRESS)   # filled from what follows --
    b.add_argument("--no-rebuild", dest="rebuild", action="store_false",
                   help="skip the second, identical run into the same --out (the no-change rebuild the "
                        "cache serves; budget 5 s)")
    b.add_argument("--no-disk-check", dest="disk_check", action="store_false",
                   help="start even when --work has less free space than the newest completed build of "
                        "this size wrote (results/build-SIZE-*.json, disk_bytes) plus 10 %%")

    r = sub.add_parser("runtime", parents=[common], help="latency of exported graphs vs torch eager")
    r.add_argument("--size", choices=("tiny", "0.6b"), required=True)
    r.add_argument("--cases", default="talker,predictor,code2wav", type=_subset(("talker", "predictor", "code2wav")),
                   help="comma-separated subset of talker,predictor,code2wav")
    r.add_argument("--runners", default="ort,pte", type=_subset(("ort", "pte")),
                   help="exported runners to time beside torch eager: ort,pte (empty: eager only)")
    r.add_argument("--passes", type=int, default=15, help="timed passes; every arm runs once per pass")
    r.add_argument("--warmup", type=int, default=3, help="untimed calls per arm before the passes")
    r.add_argument("--min-pass-ms", type=float, default=50.0,
                   help="an arm repeats its call within a pass until the pass lasts about this long")
    r.add_argument("--max-calls-per-pass", type=int, default=200)
    r.add_argument("--samples", type=int, default=3, help="captured inputs per graph, cycled over the calls")
    r.add_argument("--threads", type=int, default=1,
                   help="threads for torch, ONNX Runtime (intra-op), XNNPACK and the read-rate measurement")
    r.add_argument("--bandwidth-mib", type=int, default=512, help="array size for the memory read rate")
    r.add_argument("--target", default="cpu", help="omni-export target whose graph rewrites the exports get")
    r.add_argument("--option", action="append", default=[], type=_option, metavar="NAME=VALUE",
                   help="recipe option, e.g. context-length=1024 (default: the recipe's defaults)")
    r.add_argument("--skip", action="append", default=[], metavar="GRAPH:RUNNER",
                   help="do not export GRAPH for RUNNER (e.g. predictor_frame:pte: ExecuTorch 1.5.1 ran out of "
                        "24 GiB lowering the 0.6B fused frame); its arms are recorded as unavailable")
    r.add_argument("--dry-run", action="store_true",
                   help="build every graph and call every arm (warm-up only), no timed passes")
    r.add_argument("--worker", default=None, help=argparse.SUPPRESS)   # internal: the measured child
    return p


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def dumps(data: dict) -> str:
    """Indented JSON with innermost lists of numbers on one line (timelines, per-pass figures)."""
    text = json.dumps(data, indent=1)
    flat = re.compile(r"\[\s+((?:-?[\d.eE+-]+|null)(?:,\s+(?:-?[\d.eE+-]+|null))*)\s+\]")
    return flat.sub(lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def write_result(results: Path, kind: str, size: str, data: dict) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    sha = (data["provenance"].get("git_sha") or "nogit")[:8]
    path = results / f"{kind}-{size}-{_stamp()}-{sha}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dumps(data))
    tmp.replace(path)
    return path


def run_build(args, argv: list[str]) -> int:
    extra = args.extra
    short = bb.disk_shortfall(Path(args.work), Path(args.results), args.size) if args.disk_check else None
    if short:
        print(f"benchmarks/run.py: not started, the build would stop on a full disk: {short}", file=sys.stderr)
        return 2
    out = Path(args.work) / f"build-{args.size}-{_stamp()}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = bb.command(args.size, out, extra)
    prov = provenance.collect(argv, {"size": args.size, "extra": extra, "interval_s": args.interval})
    print(f"build {args.size}: {' '.join(cmd)}", file=sys.stderr)
    logdir = out.with_name(out.name + "-logs")
    mon = proctree.run_monitored(cmd, cwd=ROOT, env={**bb.env(), "OMNI_EXPORT_STAGE_LOG": str(logdir / "stages.jsonl")},
                                 logdir=logdir,
                                 interval=args.interval, timeout=args.timeout)
    manifest = bb.read_manifest(out)
    failed = mon.exit_code not in (0, 3) or manifest is None
    try:
        stdout = json.loads(mon.stdout) if mon.stdout.strip() else None
    except ValueError:
        stdout = {"unparsed": mon.stdout[-2000:]}
    built_by = ((manifest or {}).get("toolchain") or {}).get("omni-export-git")
    data = {
        "schema": SCHEMA, "benchmark": "build", "size": args.size,
        "source_changed_during_run": bool(built_by and built_by != prov["git_sha"]),
        "status": "failed" if failed else "ok",
        "provenance": {**prov, "machine_at_end": provenance.machine_state()},
        "process": mon.to_json(include_stderr=failed),
        "budget": bb.budget(args.size, mon.wall_s, mon.memory, mon.exit_code),
        "cli_json": stdout,
        "disk_bytes": bb.tree_bytes(out),
        "largest_tensors_fp32": bb.largest_tensors(out),
        "manifest": bb.summarize(manifest) if manifest else None,
    }
    if args.rebuild and not failed:
        data["rebuild"] = _rebuild(args, cmd, out, logdir)
    path = write_result(Path(args.results), "build", args.size, data)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.with_name(out.name + "-logs"), ignore_errors=True)
    _print_build(data, path)
    return 0 if not failed else 1


def _rebuild(args, cmd: list[str], out: Path, logdir: Path) -> dict:
    """The same command again into the same --out, nothing changed: what the build cache serves."""
    print("rebuild with nothing changed: the same command again", file=sys.stderr)
    relog = logdir.with_name(logdir.name + "-rebuild")
    mon = proctree.run_monitored(cmd, cwd=ROOT, env={**bb.env(), "OMNI_EXPORT_STAGE_LOG": str(relog / "stages.jsonl")},
                                 logdir=relog, interval=args.interval, timeout=args.timeout)
    manifest = bb.read_manifest(out) or {}
    builds = manifest.get("builds", [])
    if not args.keep:
        shutil.rmtree(relog, ignore_errors=True)
    return {"exit_code": mon.exit_code, "wall_s": round(mon.wall_s, 3),
            "peak_rss_anon_gib": mon.memory["peak_rss_anon_gib"],
            "builds": len(builds), "from_cache": sum(bool((b.get("cache") or {}).get("hit")) for b in builds),
            "stages": [{k: s.get(k) for k in ("stage", "wall_s")} for s in mon.memory.get("stages", [])],
            "budget_wall_s": bb.REBUILD_BUDGET_S, "wall_within": mon.wall_s <= bb.REBUILD_BUDGET_S,
            **({"stderr_tail": mon.stderr[-2000:]} if mon.exit_code not in (0, 3) else {})}


def _print_build(d: dict, path: Path) -> None:
    p, m = d["process"], d["process"]["memory"]
    print(f"{d['status']}: exit {p['exit_code']}, wall {p['wall_s']:.1f} s, peak RssAnon (tree) "
          f"{m['peak_rss_anon_gib']:.2f} GiB, peak Pss_Anon (tree) {m['peak_pss_anon_gib']:.2f} GiB "
          f"over {m['samples']} samples")
    if p.get("cpu_s") is not None:
        print(f"CPU {p['cpu_s']:.0f} s: {p['mean_cores_busy']:.2f} of {p['cores']} cores busy on average")
    for r, c in list((m.get("cpu_by_role") or {}).items())[:6]:
        print(f"  {c['cpu_s']:8.1f} CPU s  {r.split(' (')[0]} ({c['processes']} process{'es' if c['processes'] != 1 else ''})")
    for r, j in ((m.get("scoring_jobs") or {}).get("by_runner") or {}).items():
        print(f"  {j['open_s'] + j['run_s']:8.1f} s scoring on {r}: {j['jobs']} jobs, {j['samples']} samples "
              f"(open {j['open_s']:.1f} s, run {j['run_s']:.1f} s)")
    stages = m.get("stages", [])
    ranked = sorted((s for s in stages if s["peak_rss_anon_gib"] is not None), key=lambda s: -s["peak_rss_anon_gib"])
    for s in ranked[:6]:
        held = ", ".join(f"{q['role'].split(' (')[0]} {q['rss_anon_gib']:.2f}" for q in s.get("peak_processes") or [])
        print(f"  {s['peak_rss_anon_gib']:6.2f} GiB peak  {s['wall_s']:8.1f} s  {s['stage']}" + (f"  [{held}]" if held else ""))
    for s in sorted(stages, key=lambda s: -s["wall_s"])[:8]:
        cores = "   -" if s.get("cores_busy") is None else f"{s['cores_busy']:4.2f}"
        print(f"  {s['wall_s']:8.1f} s  {cores} cores busy  {s['stage']}")
    w = (d.get("manifest") or {}).get("what_if")
    if w:
        walls = ", ".join(f"{n} workers {s:.0f} s" for n, s in w["wall_s_at_workers"].items())
        print(f"job graph: {w['jobs']} jobs, {w['job_seconds']:.0f} job-seconds, critical path "
              f"{w['critical_path_s']:.0f} s; projected wall (list scheduling over the recorded jobs): {walls}")
    if d["budget"]:
        print(f"budget: peak within {d['budget']['peak_within']}, wall within {d['budget']['wall_within']}")
    if d.get("rebuild"):
        r = d["rebuild"]
        print(f"rebuild with nothing changed: exit {r['exit_code']}, wall {r['wall_s']:.1f} s "
              f"(budget {r['budget_wall_s']} s), {r['from_cache']} of {r['builds']} builds from the cache")
    print(f"result: {path}")


def run_runtime(args, argv: list[str]) -> int:
    if args.worker:                                       # the measured child
        from benchmarks import runtime

        return runtime.worker(args, Path(args.worker))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    partial = work / f"runtime-{args.size}-{_stamp()}.partial.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", str(partial)]
    opts = {k: v for k, v in vars(args).items() if k not in ("worker", "kind")}
    prov = provenance.collect(argv, opts)
    mon = proctree.run_monitored(cmd, cwd=ROOT, env=bb.env(), logdir=work / (partial.stem + "-logs"),
                                 interval=args.interval, timeout=args.timeout)
    try:
        body = json.loads(partial.read_text())
    except (OSError, ValueError):
        body = {}
    failed = mon.exit_code != 0 or not body or bool(body.get("failures"))
    arm_errors = [(c, a) for c, case in body.get("cases", {}).items()
                  for a, arm in case.get("arms", {}).items() if arm.get("errors")]
    data = {
        "schema": SCHEMA, "benchmark": "runtime", "size": args.size,
        "status": "failed" if failed else ("partial" if arm_errors else "dry run" if args.dry_run else "ok"),
        "provenance": {**prov, "machine_at_end": provenance.machine_state()},
        "process": mon.to_json(include_stderr=failed or bool(arm_errors)),
        "worker_log": WORKER_LOG.findall(mon.stderr),       # its progress lines: how far it got, when
        **body,
    }
    path = write_result(Path(args.results), "runtime", args.size, data)
    partial.unlink(missing_ok=True)
    if not args.keep:
        shutil.rmtree(work / (partial.stem + "-logs"), ignore_errors=True)
    _print_runtime(data, path)
    return 0 if data["status"] in ("ok", "dry run") else 1


def _print_runtime(d: dict, path: Path) -> None:
    p = d["process"]
    print(f"{d['status']}: exit {p['exit_code']}, wall {p['wall_s']:.1f} s, peak RssAnon (tree) "
          f"{p['memory']['peak_rss_anon_gib']:.2f} GiB")
    for r in d.get("budgets", []):
        pp = r["per_pass"]
        print(f"  {r['name']}: {r['ratio_of_medians']} (per pass {pp.get('min')}..{pp.get('max')}), "
              f"budget {r['budget']}: {r.get('verdict')}"
              f"{', not a ranking' if r['not_a_ranking'] else ''}")
    for f in d.get("failures", []):
        print(f"  failure in {f['case']}: {f['error']}")
    print(f"result: {path}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(ours)
    if args.kind == "build":
        args.extra = extra                       # everything after -- goes to omni-export unchanged
        return run_build(args, argv)
    if extra:
        parser().error("runtime takes no arguments after --")
    return run_runtime(args, argv)


if __name__ == "__main__":
    sys.exit(main())
