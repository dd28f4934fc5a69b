"""Run a command and sample the anonymous memory of its whole process tree.

RssAnon (from /proc/PID/status) counts memory the processes allocated; VmRSS would also count
the page cache of memory-mapped checkpoints, which swings by gigabytes between identical runs
(MEASURING.md rule 1). The tree is re-walked at every sample, so children started by exporters and
runner pools are counted while they live. A sampler misses spikes shorter than its interval: the
peak is a lower bound, and the interval actually achieved is recorded beside it.

A forked child's RssAnon also counts the anonymous pages it still shares copy-on-write with its
parent, so while a fork lives (even the instant between fork and exec of a subprocess) the RssAnon
sum counts those pages twice. Pss_Anon (/proc/PID/smaps_rollup) splits shared pages between their
sharers; its sum over the tree counts every page once. Both sums are recorded.

CPU: every sample also sums utime + stime (/proc/PID/stat) over the tree, so each stage's wall can
be set beside the cores it kept busy (2.0 on this host: nothing left to parallelise; ~1.0: one
core idle). A process that ends between two samples loses its last interval's ticks: the sampled
figure is a lower bound; the exact total is the child's rusage, recorded beside it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
STDERR_TAIL_CHARS = 6000
TIMELINE_POINTS = 240          # the kept timeline is thinned to about this many points
PSS_EVERY_S = 5.0              # Pss_Anon is read at least this often (and whenever it could peak)


CLK_TCK = os.sysconf("SC_CLK_TCK")
_CPU: dict[int, int] = {}       # pid -> utime + stime ticks, refreshed by every walk of /proc


def _ppid_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc/*/stat (the kernel here has no /proc/PID/task/*/children)."""
    children: dict[int, list[int]] = {}
    _CPU.clear()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue                          # the process ended while we looked
        # field 2 (comm) may hold spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        _CPU[int(entry.name)] = int(fields[11]) + int(fields[12])       # utime, stime (fields 14, 15)
    return children


def tree(root: int) -> list[int]:
    """root and all its descendants that are alive now."""
    kids = _ppid_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _kb_field(pid: int, file: str, key: str) -> int | None:
    """A `Key:   N kB` line of /proc/PID/<file>, in bytes (None when the process is gone)."""
    try:
        for line in (PROC / str(pid) / file).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def rss_anon_bytes(pid: int) -> int | None:
    """RssAnon of one process in bytes (None when it is gone or is a zombie without the field)."""
    return _kb_field(pid, "status", "RssAnon:")


def pss_anon_bytes(pid: int) -> int | None:
    """Pss_Anon of one process in bytes: anonymous pages, shared ones divided among their sharers."""
    return _kb_field(pid, "smaps_rollup", "Pss_Anon:")


def _cmd(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300]


@dataclass
class TreeSampler:
    """Samples the summed RssAnon of `root`'s process tree every `interval` seconds in a thread."""
    root: int
    interval: float = 0.2
    samples: int = 0
    peak_bytes: int = 0                              # RssAnon summed over the tree
    peak_at_s: float = 0.0
    peak_processes: list = field(default_factory=list)
    peak_pss_bytes: int = 0                          # Pss_Anon summed over the tree
    peak_pss_at_s: float = 0.0
    max_processes: int = 0
    timeline: list = field(default_factory=list)    # [s since start, RssAnon sum, Pss_Anon sum, CPU s so far]
    cpu_s: float = 0.0                               # utime + stime of the tree, summed over samples
    pss_reads: int = 0                               # samples that read Pss_Anon too
    _stop: threading.Event = field(default_factory=threading.Event)
    _t0: float = 0.0
    _pss_at: float = float("-inf")
    _ticks: dict = field(default_factory=dict)      # pid -> ticks at its last sample
    per_process: list = field(default_factory=list)  # per timeline point: ((pid, RssAnon), ...) of the tree
    commands: dict = field(default_factory=dict)     # pid -> its command line, read when first seen
    cpu_by_pid: dict = field(default_factory=dict)   # pid -> sampled CPU seconds (utime + stime)
    t0_wall: float = 0.0                            # time.time() at the first sample (stage logs use it)

    def start(self) -> "TreeSampler":
        self._t0 = time.monotonic()
        self.t0_wall = time.time()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> int:
        """One sample. RssAnon (/proc/PID/status) is read every time; Pss_Anon (smaps_rollup, which
        walks every mapping: reading it for a 7 GB process every 0.2 s cost the sampler a third of a
        core, taken from the run it measures) only when it could set a new peak -- Pss_Anon <=
        RssAnon per process, so while the RssAnon sum is at or below the Pss_Anon peak so far no Pss
        sum can exceed it -- and at least every PSS_EVERY_S for the timeline (None between)."""
        now = time.monotonic() - self._t0
        pids = tree(self.root)
        ticks = {pid: _CPU[pid] for pid in pids if pid in _CPU}
        for pid, t in ticks.items():
            d = max(0, t - self._ticks.get(pid, 0)) / CLK_TCK
            self.cpu_s += d
            self.cpu_by_pid[pid] = self.cpu_by_pid.get(pid, 0.0) + d
        self._ticks = ticks
        rss = [(pid, rss_anon_bytes(pid)) for pid in pids]
        rss = [(pid, r) for pid, r in rss if r is not None]
        total = sum(r for _, r in rss)
        read_pss = total > self.peak_pss_bytes or now - self._pss_at >= PSS_EVERY_S
        per = [(pid, r, (pss_anon_bytes(pid) or 0) if read_pss else None) for pid, r in rss]
        pss = sum(p for _, _, p in per) if read_pss else None
        if read_pss:
            self._pss_at = now
            self.pss_reads += 1
        self.samples += 1
        self.max_processes = max(self.max_processes, len(per))
        self.timeline.append([round(now, 2), total, pss, round(self.cpu_s, 2)])
        self.per_process.append(tuple((pid, r) for pid, r, _ in per))
        for pid, _, _ in per:
            if pid not in self.commands:
                self.commands[pid] = _cmd(pid)
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_at_s = total, now
            self.peak_processes = [{"pid": pid, "ppid": _ppid(pid), "rss_anon_bytes": r, "pss_anon_bytes": p,
                                    "cmd": _cmd(pid)} for pid, r, p in per]
        if pss is not None and pss > self.peak_pss_bytes:
            self.peak_pss_bytes, self.peak_pss_at_s = pss, now
        return total

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def to_json(self, wall_s: float) -> dict:
        return {
            "peak_rss_anon_bytes": self.peak_bytes,
            "peak_rss_anon_gib": round(self.peak_bytes / 2**30, 3),
            "peak_at_s": round(self.peak_at_s, 2),
            "peak_processes": sorted(self.peak_processes, key=lambda p: -p["rss_anon_bytes"]),
            "peak_pss_anon_bytes": self.peak_pss_bytes,
            "peak_pss_anon_gib": round(self.peak_pss_bytes / 2**30, 3),
            "peak_pss_at_s": round(self.peak_pss_at_s, 2),
            "max_processes_in_tree": self.max_processes,
            "samples": self.samples,
            "pss_samples": self.pss_reads,
            "interval_s": self.interval,
            "mean_interval_s": round(wall_s / self.samples, 3) if self.samples else None,
            "note": "sums of RssAnon and of Pss_Anon over the process tree, sampled; spikes shorter "
                    "than the interval are missed. A fork's RssAnon counts pages it shares "
                    "copy-on-write with its parent again; Pss_Anon counts every page once. Pss_Anon "
                    "is read only when it could set a new peak (its sum <= the RssAnon sum) and every "
                    f"{PSS_EVERY_S:g} s; the timeline's Pss column is null between reads",
            "t0_unix": round(self.t0_wall, 3),
            "cpu_s_sampled": round(self.cpu_s, 2),
            "timeline_columns": ["s", "rss_anon_sum_bytes", "pss_anon_sum_bytes", "cpu_s_so_far"],
            "timeline": _thin(self.timeline, TIMELINE_POINTS),
        }


def _ppid(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2:].split()[1])


def _thin(points: list, n: int) -> list:
    """At most about n points, keeping the maximum of each stretch (the peak always survives)."""
    if len(points) <= n:
        return points
    step = -(-len(points) // n)
    return [max(points[i:i + step], key=lambda p: p[1]) for i in range(0, len(points), step)]


@dataclass
class Monitored:
    command: list
    exit_code: int | None
    signal: str | None
    wall_s: float
    memory: dict
    stdout: str
    stderr: str
    max_rss_child_bytes: int | None      # getrusage ru_maxrss of the direct child (includes file pages)
    cpu_s: float | None = None           # user + system CPU of the child and every descendant it reaped

    def to_json(self, include_stderr: bool) -> dict:
        d = {"command": self.command, "exit_code": self.exit_code, "signal": self.signal,
             "wall_s": round(self.wall_s, 3), "memory": self.memory,
             "child_max_rss_bytes_incl_file_pages": self.max_rss_child_bytes,
             "cpu_s": None if self.cpu_s is None else round(self.cpu_s, 2),
             "mean_cores_busy": None if not self.cpu_s or not self.wall_s else round(self.cpu_s / self.wall_s, 3),
             "cores": os.cpu_count()}
        if include_stderr:
            d["stderr_tail"] = self.stderr[-STDERR_TAIL_CHARS:]
        return d


def run_monitored(command: list, *, cwd: Path, env: dict, logdir: Path, interval: float = 0.2,
                  timeout: float | None = None) -> Monitored:
    """Run `command` with stdout/stderr to files in `logdir`, sampling its tree; never raises on a
    failing command (its exit status and stderr are the result)."""
    logdir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logdir / "stdout.txt", logdir / "stderr.txt"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        sampler = TreeSampler(proc.pid, interval).start()
        status, usage = _wait(proc, timeout)
        wall = time.monotonic() - t0
        sampler.stop()
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    sig = signal.Signals(-code).name if code is not None and code < 0 else ("timeout" if code is None else None)
    memory = sampler.to_json(wall)
    stages = logdir / "stages.jsonl"
    marked = process_roles(stages) if stages.exists() else {}

    def role_of(pid: int) -> str:
        return marked.get(pid) or role(pid, proc.pid, sampler.commands.get(pid, "?"))

    memory["cpu_by_role"] = cpu_by_role(sampler.cpu_by_pid, role_of)
    if stages.exists():
        memory["stages"] = stage_peaks(stages, sampler.timeline, sampler.t0_wall, sampler.per_process, role_of)
        memory["scoring_jobs"] = scoring_jobs(stages)
    return Monitored(command, code, sig, wall, memory, out_path.read_text(errors="replace"),
                     err_path.read_text(errors="replace"), usage.ru_maxrss * 1024 if usage else None,
                     usage.ru_utime + usage.ru_stime if usage else None)


PROCESS_MIN_BYTES = 64 << 20       # processes below this are left out of a stage's peak breakdown


def role(pid: int, root: int, cmd: str) -> str:
    """What a process of the measured tree is, for the per-stage breakdown."""
    if pid == root:
        return "build process"
    if "multiprocessing.spawn" in cmd or "spawn_main" in cmd:
        return "spawned child (compile, quantizer or scoring worker)"
    if "resource_tracker" in cmd:
        return "multiprocessing resource tracker"
    return cmd[:120]


def _events(log: Path):
    """The stage log's JSON lines (a line cut short by a killed build is skipped)."""
    import json

    for line in log.read_text().splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def process_roles(log: Path) -> dict:
    """pid -> role, from the `process` lines the build's children write to its stage log
    (omni_export.runtime.pool.mark_process)."""
    return {e["pid"]: e["role"] for e in _events(log) if e.get("event") == "process"}


def scoring_jobs(log: Path) -> dict:
    """Where the scoring time went: per runner (ORT CPU, the HTP simulator, ExecuTorch), the jobs, the
    held-out samples they ran, and their wall seconds opening the artifact and running the samples
    (the `job` lines omni_export.runtime.pool writes), largest first; plus the ten longest jobs."""
    jobs = [e for e in _events(log) if e.get("event") == "job"]
    out: dict = {}
    for j in jobs:
        r = out.setdefault(j["runner"], {"jobs": 0, "samples": 0, "open_s": 0.0, "run_s": 0.0, "failed": 0})
        r["jobs"] += 1
        r["samples"] += j.get("samples", 0)
        r["open_s"] += j.get("open_s", 0.0)
        r["run_s"] += j.get("run_s", 0.0)
        r["failed"] += not j.get("ok", True)
    by_runner = {k: {**v, "open_s": round(v["open_s"], 1), "run_s": round(v["run_s"], 1)}
                 for k, v in sorted(out.items(), key=lambda kv: -(kv[1]["open_s"] + kv[1]["run_s"]))}
    longest = sorted(jobs, key=lambda j: -j.get("wall_s", 0.0))[:10]
    return {"by_runner": by_runner,
            "longest": [{k: j.get(k) for k in ("runner", "model", "samples", "open_s", "run_s", "ok")} for j in longest]}


def cpu_by_role(cpu_by_pid: dict, role_of) -> dict:
    """Sampled CPU seconds per role, largest first, with the number of processes in each."""
    out: dict = {}
    for pid, sec in cpu_by_pid.items():
        r = out.setdefault(role_of(pid), {"cpu_s": 0.0, "processes": 0})
        r["cpu_s"] += sec
        r["processes"] += 1
    return {k: {"cpu_s": round(v["cpu_s"], 1), "processes": v["processes"]}
            for k, v in sorted(out.items(), key=lambda kv: -kv[1]["cpu_s"])}


def stage_peaks(log: Path, timeline: list, t0_wall: float, per_process: list | None = None,
                role_of=None) -> list[dict]:
    """Per stage of the measured run (its OMNI_EXPORT_STAGE_LOG): wall seconds, the peak summed
    RssAnon sampled while it ran, which processes held it at that sample (`per_process`, aligned
    with the timeline; those past PROCESS_MIN_BYTES) and the cores its tree kept busy (sampled CPU
    seconds / wall) -- attribution by stage and process, not by subtracting totals. A stage
    shorter than the sampling interval may have no sample (peak and cores None). Stages nest and
    runner jobs overlap later stages, so the cores are those of the whole tree while the stage was
    open."""

    def row(stage: str, a: float, b: float, inside: list[int], **extra) -> dict:
        points = [timeline[i] for i in inside]
        r = {"stage": stage, "start_s": round(a, 2), "wall_s": round(b - a, 2), **extra,
             "peak_rss_anon_gib": None, "cores_busy": _cores(points)}
        if inside:
            top = max(inside, key=lambda i: timeline[i][1])
            r["peak_rss_anon_gib"] = round(timeline[top][1] / 2**30, 3)
            if per_process is not None:
                r["peak_processes"] = [{"pid": pid, "role": role_of(pid) if role_of else str(pid),
                                        "rss_anon_gib": round(rss / 2**30, 3)}
                                       for pid, rss in sorted(per_process[top], key=lambda x: -x[1])
                                       if rss >= PROCESS_MIN_BYTES]
        return r

    open_at, rows = {}, []
    for e in _events(log):
        if e.get("event") == "start":
            open_at[e["stage"]] = e["t"]
        elif e.get("event") == "end" and e["stage"] in open_at:
            a, b = open_at.pop(e["stage"]) - t0_wall, e["t"] - t0_wall
            rows.append(row(e["stage"], a, b, [i for i, p in enumerate(timeline) if a <= p[0] <= b]))
    end = timeline[-1][0] if timeline else 0.0
    for stage, t in open_at.items():              # still running when the run ended (killed, crashed)
        a = t - t0_wall
        rows.append(row(stage, a, end, [i for i, p in enumerate(timeline) if p[0] >= a], unfinished=True))
    return rows


def _cores(inside: list) -> float | None:
    """Mean cores busy between the first and last sample of a stage (None: fewer than two)."""
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return round((inside[-1][3] - inside[0][3]) / (inside[-1][0] - inside[0][0]), 2)


def _wait(proc: subprocess.Popen, timeout: float | None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, usage
        if deadline is not None and time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)      # its own session: only the tree we started
            pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = -9
            return None, usage
        time.sleep(0.05)
