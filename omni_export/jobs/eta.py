"""The build's ETA: a cost model fitted to past runs' job durations, and the remaining graph projected
with it.

Cost model: `costs.json` in omni-export's per-user cache (artifacts.captures.cache_root(), beside
`captures/`), so it outlives one OUT: a rebuild into a fresh --out, or with --force, starts from it.
It keeps, per job id (`code2wav/score/ctx/fp16`: component x kind x format x precision), the last
KEEP durations with the component's fp32 weight bytes; per checkpoint identity (the build cache's
checkpoint digest) each component's weight bytes, known before its trace runs; and per build
signature the jobs a run adds once it is under way (end-to-end rows, attribution), so the first ETA
includes them. A job's estimate, first match wins:
  1. its own id's durations at a weight size within SIZE_RATIO of this one (their median, the
     later runs weighing more: recent_median);
  2. the same kind and component at such a size (median);
  3. the kind's least-squares line in weight GiB, within the sizes it was fitted on;
  4. the graph's defaults (graph.DEFAULT_SECONDS, scaled by graph.SECONDS_PER_GIB past 256 MB).
The file is read only as a regular file of at most MAX_BYTES at that one path (never through a
symlink, never anywhere else); anything malformed is ignored with one warning and rewritten at the
end of the build. Two builds finishing at once may lose one's update (the write is atomic).

Projection: list scheduling over the jobs not yet ended (graph.project_wall, the what-if view's
code) with the run's worker slots and memory budget, running jobs first with what their estimate
leaves, plus the expected late jobs until they are planned or can no longer come.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import time
from pathlib import Path

FILE = "costs.json"
FORMAT = 1
MAX_BYTES = 4 << 20          # a cost file past this is not read
KEEP = 8                     # durations kept per job id
MAX_JOBS = 4000              # job ids kept (the least recently run dropped)
MAX_MODELS = 64              # checkpoint identities / build signatures kept
SIZE_RATIO = 1.5             # weight sizes within this factor count as "the same size"
RECENCY = 1.5                # each run of a job weighs this much more than the one before it
LATE_KINDS = ("e2e", "attribute", "repair")     # jobs a run adds under way (repair: its ranking and steps)
_MAX_SECONDS = 1e6


def path() -> Path:
    from ..artifacts.captures import cache_root

    return cache_root() / FILE


def _num(x, lo=0.0, hi=_MAX_SECONDS) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and lo <= x <= hi


def _near(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    lo, hi = sorted((max(a, 1), max(b, 1)))
    return hi <= lo * SIZE_RATIO


def recent_median(seconds: list[float]) -> float:
    """The weighted median of a job's durations, oldest first, each run weighing RECENCY times the
    one before: the host's load drifts, so the latest runs say most about the next one, and one odd
    run among several does not decide."""
    pairs = sorted((s, RECENCY ** i) for i, s in enumerate(seconds))
    half, acc = sum(w for _, w in pairs) / 2, 0.0
    for s, w in pairs:
        acc += w
        if acc >= half:
            return s
    return pairs[-1][0]


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept s, slope s/GiB) of seconds against weight GiB by least squares, both >= 0; None
    with fewer than 2 points or no spread in size."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var <= 0 or max(xs) < 1.2 * min(xs):
        return None
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var)
    return max(0.0, my - slope * mx), slope


class CostModel:
    def __init__(self, data: dict | None = None, where: Path | None = None):
        data = data or {}
        self.where = where
        self.jobs: dict[str, dict] = data.get("jobs", {})          # id -> {kind, component, runs: [[bytes|None, s]]}
        self.weights: dict[str, dict] = data.get("weights", {})    # checkpoint digest -> {component: bytes}
        self.late: dict[str, list] = data.get("late", {})          # build signature -> [job records]
        self.models: dict[str, list] = data.get("models", {})      # build cache's model key -> its components
        self._runs: list[tuple] = []          # this process's observations, replayed onto the file's latest at save
        self._forget: set[str] = set()        # model keys whose recorded components proved wrong

    # ---- the file
    @classmethod
    def load(cls, warn=None) -> "CostModel":
        """The per-user cost model, or an empty one (first run, or a file that is not ours: `warn`ed)."""
        p = path()
        try:
            raw = _read_regular(p)
        except FileNotFoundError:
            return cls(where=p)
        except (OSError, ValueError) as e:
            if warn:
                warn(f"warning: cost model {p} ignored ({e}); ETAs use the defaults until this build rewrites it")
            return cls(where=p)
        try:
            data = _validated(json.loads(raw))
        except (ValueError, TypeError, KeyError, RecursionError, AttributeError) as e:
            if warn:
                warn(f"warning: cost model {p} ignored (not a cost model: {str(e)[:80]}); ETAs use the defaults "
                     f"until this build rewrites it")
            return cls(where=p)
        return cls(data, p)

    def save(self) -> str | None:
        """Write this run's observations into the file as it is now (another build may have written
        it meanwhile), atomically; returns why it could not, or None."""
        p = self.where or path()
        latest = CostModel.load()
        if latest.where == p:
            for args in self._runs:
                latest.observe(*args)
            for key in self._forget:
                latest.models.pop(key, None)
            self.jobs, self.weights, self.late, self.models = latest.jobs, latest.weights, latest.late, latest.models
        data = {"format": FORMAT, "tool": "omni-export", "jobs": self.jobs, "weights": self.weights, "late": self.late,
                "models": self.models}
        tmp = p.with_name(f".{FILE}.tmp-{os.getpid()}")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp.unlink(missing_ok=True)
            # a new file of our own (O_EXCL: never through a link planted at its name), then renamed
            # over the cost file (which replaces a link there, never writes through it)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, separators=(",", ":"), allow_nan=False))
            os.replace(tmp, p)
        except (OSError, ValueError) as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return f"cost model not saved to {p}: {e}"
        self._runs = []
        return None

    # ---- fitting
    def observe(self, records: list[dict], components: dict[str, int | None], checkpoint: str,
                signature: str | None = None, late: list[dict] | None = None, model: tuple | None = None) -> None:
        """Add a finished run: its job records (manifest `jobs.graph`), each component's weight bytes,
        the checkpoint identity, the jobs it added under way (`late`) under its build signature, and
        `model`: (the build cache's model key, the model's components)."""
        self._runs.append((records, components, checkpoint, signature, late, model))
        if model is not None and model[1]:
            self.models.pop(model[0], None)
            self.models[model[0]] = [str(c) for c in model[1]]
            _trim(self.models)
        for r in records:
            s, jid = r.get("seconds"), r.get("id")
            if r.get("state") != "done" or not _num(s) or not isinstance(jid, str):
                continue
            comp = r.get("component") or jid.split("/")[0]
            e = self.jobs.pop(jid, None) or {"kind": r.get("kind"), "component": comp, "runs": []}
            e["kind"], e["component"] = r.get("kind"), comp
            e["runs"] = (e["runs"] + [[components.get(comp), round(float(s), 3)]])[-KEEP:]
            self.jobs[jid] = e                   # most recently run last
        while len(self.jobs) > MAX_JOBS:
            self.jobs.pop(next(iter(self.jobs)))
        known = {c: int(b) for c, b in components.items() if b is not None}
        if known:
            self.weights[checkpoint] = {**self.weights.pop(checkpoint, {}), **known}
            _trim(self.weights)
        if signature is not None and late is not None:
            self.late.pop(signature, None)
            self.late[signature] = [{k: r.get(k) for k in ("id", "kind", "component", "deps", "where", "memory_bytes",
                                                            "alone", "holds")} for r in late]
            _trim(self.late)

    def estimate(self, jid: str, kind: str, component: str | None, weight: int | None) -> float | None:
        """Seconds the job is expected to take, or None (no past run fits: the caller's default)."""
        own = self.jobs.get(jid)
        if own:
            near = [s for w, s in own["runs"] if _near(w, weight)]
            if near:
                return recent_median(near)
        same = [s for e in self.jobs.values() if e["kind"] == kind and e["component"] == component
                for w, s in e["runs"] if _near(w, weight)]
        if same:
            return statistics.median(same)
        if weight is None:
            return None
        pts = [(w / 2**30, s) for e in self.jobs.values() if e["kind"] == kind for w, s in e["runs"] if w]
        line = fit_line(pts)
        if line is None:
            return None
        sizes = [p[0] for p in pts]
        g = weight / 2**30
        if not (min(sizes) / SIZE_RATIO <= g <= max(sizes) * SIZE_RATIO):
            return None
        return line[0] + line[1] * g

    def forget_model(self, model_key: str) -> None:
        self.models.pop(model_key, None)
        self._forget.add(model_key)

    def components_for(self, model_key: str) -> tuple[str, ...] | None:
        """The components a model of this key had (as the build cache's model_components), or None."""
        c = self.models.get(model_key)
        return tuple(c) if c else None

    def weight_of(self, checkpoint: str, component: str | None) -> int | None:
        return (self.weights.get(checkpoint) or {}).get(component) if component else None


def cost_id(jid: str, kind: str, signature: str | None) -> str:
    """See Eta.cost_id."""
    return f"{jid} @{signature}" if kind == "e2e" and signature else jid


def _trim(d: dict) -> None:
    while len(d) > MAX_MODELS:
        d.pop(next(iter(d)))


def _read_regular(p: Path) -> str:
    """The file's text, only if it is a regular file (not a link, FIFO or device) of at most MAX_BYTES."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        if e.errno == 2:
            raise FileNotFoundError(p) from None
        if p.is_symlink():
            raise ValueError("a symlink; only a regular file there is read") from None
        raise ValueError(e.strerror or str(e)) from None
    try:
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than {MAX_BYTES}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="strict")


def _validated(d) -> dict:
    """The parts of a parsed cost file that are well-formed; raises ValueError when it is not one."""
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("tool") != "omni-export":
        raise ValueError(f"format is not {FORMAT}")
    jobs = {}
    for jid, e in (d.get("jobs") or {}).items():
        if not (isinstance(jid, str) and isinstance(e, dict) and isinstance(e.get("kind"), str)
                and isinstance(e.get("runs"), list) and isinstance(e.get("component"), (str, type(None)))):
            raise ValueError(f"job {str(jid)[:40]!r} malformed")
        runs = [[w, float(s)] for w, s in e["runs"] if (w is None or _num(w, 0, 1 << 50)) and _num(s)]
        if len(runs) != len(e["runs"]):
            raise ValueError(f"job {jid[:40]!r} has a duration that is not a number of seconds")
        jobs[jid] = {"kind": e["kind"], "component": e["component"], "runs": runs[-KEEP:]}
    weights = {}
    for k, comps in (d.get("weights") or {}).items():
        if not isinstance(comps, dict) or not all(isinstance(c, str) and _num(b, 0, 1 << 50) for c, b in comps.items()):
            raise ValueError("weights malformed")
        weights[str(k)] = {c: int(b) for c, b in comps.items()}
    late = {}
    for k, recs in (d.get("late") or {}).items():
        if not isinstance(recs, list):
            raise ValueError("late jobs malformed")
        good = []
        for r in recs:
            if not (isinstance(r, dict) and isinstance(r.get("id"), str) and r.get("kind") in LATE_KINDS
                    and isinstance(r.get("deps"), list) and all(isinstance(x, str) for x in r["deps"])
                    and r.get("where") in ("driver", "worker") and _num(r.get("memory_bytes") or 0, 0, 1 << 50)
                    and isinstance(r.get("holds") or [], list) and all(isinstance(x, str) for x in r.get("holds") or [])):
                raise ValueError("late job malformed")
            good.append({**r, "alone": bool(r.get("alone")), "holds": list(r.get("holds") or [])})
        late[str(k)] = good
    models = {}
    for k, comps in (d.get("models") or {}).items():
        if not (isinstance(comps, list) and all(isinstance(c, str) and c.isidentifier() for c in comps)):
            raise ValueError("models malformed")
        models[str(k)] = comps
    for part in (jobs, weights, late, models):
        if len(part) > MAX_JOBS:
            raise ValueError("too many entries")
    return {"jobs": jobs, "weights": weights, "late": late, "models": models}


def signature(checkpoint: str, recipe: str, target: str, builds, options: dict) -> str:
    """What decides which late jobs a run adds: the checkpoint, recipe, target, planned builds, options."""
    planned = sorted(f"{b.component}/{b.format.value}/{b.precision.value}" for b in builds)
    return hashlib.sha256(json.dumps([checkpoint, recipe, target, planned, options], sort_keys=True,
                                     default=str).encode()).hexdigest()[:32]


class Eta:
    """The remaining wall of a running job graph, from the cost model and graph.project_wall."""

    def __init__(self, graph, costs: CostModel, checkpoint: str, workers: int, budget: int | None,
                 late: list[dict] = (), weight_of=None, signature: str | None = None):
        self.graph, self.costs, self.checkpoint = graph, costs, checkpoint
        self.signature = signature             # the build's signature: end-to-end rows are timed per build
        self.weight_of = weight_of or (lambda component: None)     # a component's weight bytes, once traced
        self.workers, self.budget = workers, budget
        self.initial = set(graph.jobs)
        self.late = [r for r in late or () if r["id"] not in graph.jobs]
        self.known = late is not None          # a past run of this plan said which jobs it added (maybe none)
        self.started = time.time()
        self._memo: dict[str, tuple] = {}

    def seconds(self, job) -> tuple[float, bool]:
        """(estimate, from the cost model?) for one job; weight-scaled defaults otherwise."""
        weight = self._weight(job.component)
        key = (job.id, weight)
        if key not in self._memo:
            self._memo[key] = self.costs.estimate(self.cost_id(job.id, job.kind), job.kind, job.component, weight)
        s = self._memo[key]
        return (s, True) if s is not None else (job.estimate, False)     # a default may change after the trace

    def cost_id(self, jid: str, kind: str) -> str:
        """The id a job's durations are kept under: an end-to-end row's cost depends on every graph of
        the build, so its history is kept per build signature (a Code2Wav-only run's row, skipped in
        0.1 s, said nothing of a whole demo's 90 s row)."""
        return cost_id(jid, kind, self.signature)

    def _weight(self, component: str | None) -> int | None:
        w = self.weight_of(component) if component else None
        return w if w is not None else self.costs.weight_of(self.checkpoint, component)

    def measured(self) -> tuple[int, int]:
        """(jobs whose estimate comes from past runs, jobs planned) -- what the first ETA rests on."""
        jobs = list(self.graph.jobs.values())
        return sum(self.seconds(j)[1] for j in jobs), len(jobs)

    def _pending_late(self, states: dict) -> list[tuple[dict, list[str]]]:
        """The late jobs still expected, each with the deps it waits for (jobs of the graph, or other
        expected late jobs: a repair step waits for the step before it). A late job whose deps have all
        ended without adding it will not come (its moment passed) and is dropped."""
        for r in [r for r in self.late if r["id"] in states]:
            self.late.remove(r)                       # planned now: a job of the graph
        while True:                                   # a dropped job's followers may go with it
            pending = {r["id"] for r in self.late}
            out = []
            for r in self.late:
                deps = [d for d in r["deps"] if d in states or d in pending]
                if r["kind"] == "attribute" and len(deps) <= 1:
                    # a record of before 2026-12-05 (deps: the trace): added once the component's jobs ended
                    deps = [j for j, job in self.graph.jobs.items() if job.component == r["component"]]
                out.append((r, deps))
            passed = [r for r, deps in out if deps and all(states.get(d) in ("done", "failed") for d in deps)]
            if not passed:
                return out
            for r in passed:
                self.late.remove(r)

    def _holds(self, r: dict, states: dict) -> list[str]:
        """The end-to-end rows of this graph a late job held in the last run and that still wait (a
        repair step holds its precision's row, ComponentJobs._hold_e2e): the row runs after the job.
        Only rows, which nothing waits for, so no edge can close a cycle."""
        return [h for h in r.get("holds") or [] if states.get(h) == "waiting" and self.graph.jobs[h].kind == "e2e"]

    def _late_seconds(self, r: dict) -> float:
        s = self.costs.estimate(self.cost_id(r["id"], r["kind"]), r["kind"], r["component"],
                                self._weight(r["component"]))
        return s if s is not None else 30.0

    def priority(self) -> dict[str, float]:
        """Per job of the graph: the scheduler's critical-path priority -- its estimate (the cost
        model's, else the graph's default) plus the longest chain below it, counting the late jobs the
        last run of this plan added (a rejection's attribution and repair steps: at 0.6B, ~300 s and
        4 x 85 s after Code2Wav's w8a16 scores, which therefore start early, not last)."""
        from .graph import longest_below

        states = {j.id: j.state for j in self.graph.jobs.values()}
        secs = {jid: self.seconds(j)[0] for jid, j in self.graph.jobs.items()}
        children = {jid: list(self.graph.children(jid)) for jid in self.graph.jobs}
        late = self._pending_late(states)
        for r, _ in late:
            secs[r["id"]] = self._late_seconds(r)
            children[r["id"]] = self._holds(r, states)
        for r, deps in late:
            for d in deps:
                children[d].append(r["id"])
        if not self.known:
            # no past run of this plan: a job that may add follow-ups (Job.tail) has them below it, and
            # the end-to-end rows they would hold after them
            for jid, j in self.graph.jobs.items():
                if j.tail > 0 and j.state == "waiting":
                    v = f"{jid}#may-add"
                    secs[v] = j.tail
                    children[v] = [c for c in children[jid] if self.graph.jobs[c].kind == "e2e"]
                    children[jid] = children[jid] + [v]
        rem = longest_below(children, secs)
        return {jid: rem[jid] for jid in self.graph.jobs}

    def remaining(self, now: float | None = None) -> float:
        """Projected seconds until every job (and every expected late job) has ended."""
        from .graph import project_wall

        now = time.time() if now is None else now
        jobs = list(self.graph.jobs.values())
        states = {j.id: j.state for j in jobs}
        open_ids = {j.id for j in jobs if j.state in ("waiting", "running")}
        records, first = [], set()
        for j in jobs:
            if j.id not in open_ids:
                continue
            est, _ = self.seconds(j)
            if j.state == "running":
                elapsed = now - (j.started or now)
                # past its estimate: its end assumed a quarter of the overrun away
                est = max(est - elapsed, 0.25 * (elapsed - est), 0.05 * est, 0.5)
                first.add(j.id)
            records.append({"id": j.id, "deps": [d for d in j.deps if d in open_ids], "where": j.where,
                            "seconds": est, "memory_bytes": j.memory, "alone": j.alone, "lane": j.lane})
        late = self._pending_late(states)
        expected = {r["id"] for r, _ in late}
        held = {}
        for r, _ in late:
            for h in self._holds(r, states):
                held.setdefault(h, []).append(r["id"])
        for rec in records:
            rec["deps"] += held.get(rec["id"], [])
        for r, deps in late:
            records.append({"id": r["id"], "deps": [d for d in deps if d in open_ids or d in expected],
                            "where": r["where"], "seconds": self._late_seconds(r),
                            "memory_bytes": r.get("memory_bytes") or 0, "alone": r.get("alone")})
        if not records:
            return 0.0
        return project_wall(records, self.workers, self.budget, first=first)

    def late_records(self) -> list[dict]:
        """The jobs this run added under way (for the next run's first ETA)."""
        return [{**j.record(), "component": j.component,
                 "holds": [c for c in self.graph.children(j.id) if self.graph.jobs[c].kind == "e2e"]}
                for j in self.graph.jobs.values() if j.id not in self.initial and j.kind in LATE_KINDS]


def process_age() -> float | None:
    """Seconds since this process started (/proc), or None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def plan_lines(the_plan, graph, reused: list[str], workers: int, executor: str, late: list[dict]) -> list[str]:
    """What the build will do, said before it starts: builds as components x formats x precisions,
    the jobs of each kind, the scoring runs per runner, and the rows expected once the traces end."""
    from collections import Counter

    from ..runtime.graphs import RUNNER_FORMATS

    b = the_plan.builds
    comps = list(dict.fromkeys(x.component for x in b))
    fmts = list(dict.fromkeys(x.format.value for x in b))
    precs = list(dict.fromkeys(x.precision.value for x in b))
    lines = [f"plan: {len(b)} builds of {len(comps)} components x {len(fmts)} formats ({', '.join(fmts)}) x "
             f"{len(precs)} precisions ({', '.join(precs)})"
             + (f"; {len(the_plan.skipped)} pairs skipped (see the report)" if the_plan.skipped else "")]
    if reused:
        lines.append(f"plan: reused from the build cache: {', '.join(reused)}")
    jobs = list(graph.jobs.values())
    if not jobs:
        lines.append("plan: 0 jobs: every build is reused")
        return lines
    kinds = Counter(j.kind for j in jobs)
    lines.append(f"plan: {len(jobs)} jobs on {workers} worker{'s' if workers != 1 else ''} ({executor}): "
                 + ", ".join(f"{n} {k}" for k, n in kinds.items()))
    runner_of = {f: r for r, (f, _) in RUNNER_FORMATS.items()} | {"dlc": "htp"}
    runs = Counter(runner_of.get(j.id.split("/")[-2], "?") for j in jobs if j.kind in ("score", "score-htp"))
    shared = kinds.get("score-shared", 0)
    names = {"ort": "ONNX Runtime CPU", "htp": "the HTP simulator", "pte": "ExecuTorch"}
    lines.append(f"plan: {sum(runs.values())} scoring runs: "
                 + ", ".join(f"{n} on {r} ({names.get(r, r)})" for r, n in runs.items())
                 + (f"; {shared} DLC builds share their context binary's run" if shared else ""))
    if late:
        steps = Counter(r["id"].rsplit("/", 1)[0] for r in late if r["kind"] == "repair" and "/repair/" in r["id"])
        said = [r["id"] for r in late if not (r["kind"] == "repair" and "/repair/" in r["id"])]
        said += [f"{search} ({n} step{'s' if n != 1 else ''})" for search, n in steps.items()]
        lines.append("plan: expected once under way (as the last run of this plan): " + ", ".join(said))
    return lines


class EtaReport:
    """The build's plan and ETA lines: the first ETA before any job starts, a new one as jobs finish
    when the projected end moved (at most every MIN_GAP seconds) or every REFRESH seconds, and the
    status for the heartbeat (progress.Paced) with what runs and, for an end-to-end row in a worker,
    its frames done / total."""

    MIN_GAP = 5.0
    REFRESH = 30.0

    def __init__(self, eta: Eta, progress, paced, frame_files: dict | None = None):
        self.eta, self.progress, self.paced = eta, progress, paced
        self.frame_files = {} if frame_files is None else frame_files    # job id -> its worker's FrameFile
        self.first: float | None = None             # the first projected wall, and when it was said
        self.first_at: float | None = None
        self._said_at = 0.0
        self._said_end: float | None = None
        self._finished = 0

    def start(self, lines: list[str]) -> None:
        for line in lines:
            self.progress.note(line)
        rem = self.eta.remaining()
        measured, total = self.eta.measured()
        self.measured_at_start = measured
        age = process_age()
        self.first, self.first_at, self.first_cpu = rem, age, time.process_time()
        basis = (f"{measured} of {total} jobs timed by past runs" if measured else
                 "no past run of these jobs: the graph's default estimates")
        self._say(rem, f" ({basis}; cost model {self.eta.costs.where})")
        self.paced.status = self.status

    def _say(self, rem: float, extra: str = "") -> None:
        from ..progress import clock

        now = time.time()
        done = sum(j.state in ("done", "failed") for j in list(self.eta.graph.jobs.values()))
        self.progress.note(f"ETA {clock(rem)}, about {time.strftime('%H:%M:%S', time.localtime(now + rem))}: "
                           f"{done}/{len(self.eta.graph)} jobs done{extra}")
        self._said_at, self._said_end = now, now + rem

    def tick(self, running, done: int, total: int) -> None:
        """Called by the scheduler's loop: a new ETA line when jobs finished and the end moved."""
        now = time.time()
        if done == self._finished or done == total or now - self._said_at < self.MIN_GAP:
            return
        self._finished = done
        rem = self.eta.remaining(now)
        moved = abs(now + rem - (self._said_end or now))
        if now - self._said_at >= self.REFRESH or moved >= max(15.0, 0.15 * rem):
            self._say(rem)

    def status(self) -> str:
        """The heartbeat line: jobs done, ETA, what runs (with an end-to-end row's frames)."""
        from ..progress import clock, read_frames

        now = time.time()
        jobs = list(self.eta.graph.jobs.values())
        running = sorted((j for j in jobs if j.state == "running"), key=lambda j: j.started or now)
        done = sum(j.state in ("done", "failed") for j in jobs)
        parts = []
        for j in running[:3]:
            est, _ = self.eta.seconds(j)
            what = f"{j.label or j.id} {clock(now - (j.started or now))} of ~{clock(est)}"
            meter = read_frames(self.frame_files[j.id]) if j.id in self.frame_files else None
            if meter is not None:
                what += f" ({meter.text(now)})"
            parts.append(what)
        rem = self.eta.remaining(now)
        self._said_at, self._said_end = now, now + rem
        if not parts:
            what = "starting the next" if done else "loading the libraries before the first job starts"
            return f"... {done}/{len(jobs)} jobs done, ETA {clock(rem)}; {what}"
        return (f"... {done}/{len(jobs)} jobs done, ETA {clock(rem)}; running: " + "; ".join(parts)
                + (f"; +{len(running) - 3} more" if len(running) > 3 else ""))

    def finish(self) -> None:
        """The jobs ended: say how far the first ETA was from the wall they took."""
        from ..progress import clock

        self.paced.status = None
        self.wall = time.time() - self.eta.started
        if self.first is not None and self.wall > 0:
            self.progress.note(f"jobs ended after {clock(self.wall)}; the first ETA said {clock(self.first)} "
                               f"({100 * (self.first - self.wall) / self.wall:+.0f} %)")

    def record(self) -> dict:
        """What the manifest keeps of the ETA (timings.eta): the first projection of the job graph's
        wall, seconds after the process started that it was said, and the wall the jobs took."""
        wall = getattr(self, "wall", None)
        out = {"first_s": round(self.first, 1) if self.first is not None else None,
               "first_said_at_s": round(self.first_at, 1) if self.first_at is not None else None,
               # CPU seconds this process had used by then: the wall on an idle host, roughly
               "first_said_at_cpu_s": round(self.first_cpu, 1) if self.first is not None else None,
               "jobs_wall_s": round(wall, 1) if wall is not None else None,
               "timed_by_past_runs": getattr(self, "measured_at_start", None)}
        if self.first is not None and wall:
            out["first_error"] = round((self.first - wall) / wall, 3)
        return out


# ---------------------------------------------------------------------------------- one build's ETA

def build_signature(build, the_plan) -> str:
    """The build's signature (signature()): which late jobs it adds, with which components reused."""
    o = build.opts
    return signature(build.cache.checkpoint["digest"], o.recipe.name, o.target.name, the_plan.builds,
                     {"attribution": o.attribution, "e2e": o.e2e, "recipe": build.recipe_options,
                      "reused": sorted(build.components)})


def start(build, the_plan, graph, executor, gate) -> EtaReport | None:
    """The plan lines and the first ETA, before the first job starts (only the plan lines when every
    component was reused: nothing to run)."""
    build.signature = build_signature(build, the_plan)     # before the graph runs: which were reused
    late = build.costs.late.get(build.signature)        # None: no run of this plan finished before
    workers = executor.slots if executor is not None else 0

    def weight_of(component: str | None):
        run = build.runs.get(component) if component else None
        return run.info.get("weight_bytes") if run is not None and run.info else None

    eta = Eta(graph, build.costs, build.cache.checkpoint["digest"], max(1, workers), gate.budget if gate else None,
              late, weight_of, build.signature)
    lines = plan_lines(the_plan, graph, sorted(build.components), workers,
                       executor.name if executor is not None else "-", eta.late)
    if executor is None:
        for line in lines:
            build.progress.note(line)
        return None
    report = EtaReport(eta, build.progress, build.paced, build.frame_files)
    report.start(lines)
    return report


def check_assumed(build, model) -> None:
    """The run was planned on the components the cost model recorded for this model key: the loaded
    model must have exactly those (else the entry is dropped and the run stops, to be run again)."""
    from ..core import UsageError

    assumed, have = build.assumed, tuple(model.components())
    if assumed is not None and tuple(assumed) != have:
        build.costs.forget_model(build.cache.model_key())
        build.costs.save()
        raise UsageError(f"cost model {build.costs.where}: this model's components were recorded as "
                         f"{', '.join(assumed)} but the checkpoint has {', '.join(have)}; the entry is "
                         f"dropped, run the build again")


def learn(build, graph) -> None:
    """The finished graph's job seconds into the cost model, for the next run's ETA."""
    if not len(graph):
        return
    weights = {c: (r.get("weight_bytes") if isinstance(r, dict) else None) for c, r in build.components.items()}
    # a job answered from the job store (cached) took no time: its seconds would teach nothing
    records = [{**j.record(), "component": j.component} for j in graph.jobs.values() if not j.cached]
    # a run that captured the inputs from the fp32 model (capture cache missed or off) paid for it in
    # its first trace: its traces are kept apart, the fallback for a component never traced otherwise
    if any(not (r.info.get("capture") or {"hit": True}).get("hit", True) for r in build.runs.values()):
        records = [{**r, "id": r["id"] + " (capturing)"} if r["kind"] == "trace" else r for r in records]
    records = [{**r, "id": cost_id(r["id"], r["kind"], build.signature)} for r in records]
    late = build.eta.eta.late_records() if build.eta is not None else []
    build.costs.observe(records, weights, build.cache.checkpoint["digest"], build.signature, late,
                        (build.cache.model_key(), build.available))
    why = build.costs.save()
    if why:
        build.progress.note(f"warning: {why}")
