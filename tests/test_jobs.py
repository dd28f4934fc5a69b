"""The job graph and its scheduler: order, slots, memory, failures, and the what-if projection."""
from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_export.jobs.graph import Job, JobGraph, project_wall
from omni_export.jobs.scheduler import Scheduler
from omni_export.memory import MemoryGate


class ThreadExecutor:
    """Worker jobs on threads of this process: the scheduler's contract without process start-up."""

    name = "threads"

    def __init__(self, slots: int):
        self.slots = slots
        self.pool = cf.ThreadPoolExecutor(slots)
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.heavy = 0
        self.most_heavy = 0

    def submit(self, job, fn, args):
        def wrapped():
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
                self.heavy += job.memory > 0
                self.most_heavy = max(self.most_heavy, self.heavy)
            try:
                return fn(*args)
            finally:
                with self.lock:
                    self.running -= 1
                    self.heavy -= job.memory > 0
        return self.pool.submit(wrapped)

    def close(self, abort=False):
        self.pool.shutdown(wait=not abort, cancel_futures=True)


def sleeper(seconds, log, name):
    log.append(("start", name))
    time.sleep(seconds)
    log.append(("end", name))
    return name


def test_jobs_run_after_their_dependencies_and_the_longest_chain_starts_first():
    log: list = []
    g = JobGraph()

    def job(i, deps=(), s=0.05, est=1.0):
        return g.add(Job(i, "x", deps, seconds=est, bind=lambda jobs, s=s: (sleeper, (s, log, i))))

    job("short", est=0.5)                         # ready at once, but its chain is short
    job("a")
    job("b", ("a",))
    job("c", ("b",))
    ex = ThreadExecutor(1)
    Scheduler(g, ex).run()
    starts = [n for e, n in log if e == "start"]
    assert starts == ["a", "b", "c", "short"]     # one slot: the 3-job chain first
    assert all(j.state == "done" for j in g.jobs.values())
    assert g.critical_path()[1] == ["a", "b", "c"]


def test_no_more_jobs_run_at_once_than_the_executor_has_slots():
    log: list = []
    g = JobGraph()
    for i in range(8):
        g.add(Job(f"j{i}", "x", bind=lambda jobs, i=i: (sleeper, (0.05, log, i))))
    ex = ThreadExecutor(3)
    Scheduler(g, ex).run()
    assert ex.most == 3 and len(log) == 16


def test_a_failed_job_blocks_what_needs_it_and_each_hears_why():
    heard = {}
    g = JobGraph()

    def boom():
        raise ValueError("no")

    g.add(Job("bad", "x", bind=lambda jobs: (boom, ()), done=lambda j: heard.setdefault(j.id, j.error)))
    g.add(Job("child", "x", ("bad",), bind=lambda jobs: (sleeper, (0, [], "c")),
              done=lambda j: heard.setdefault(j.id, j.error)))
    g.add(Job("grandchild", "x", ("child",), bind=lambda jobs: (sleeper, (0, [], "g")),
              done=lambda j: heard.setdefault(j.id, j.error)))
    g.add(Job("other", "x", bind=lambda jobs: (sleeper, (0, [], "o")), done=lambda j: heard.setdefault(j.id, j.error)))
    Scheduler(g, ThreadExecutor(2)).run()
    assert isinstance(heard["bad"], ValueError)
    assert "bad failed" in str(heard["child"]) and "failed" in str(heard["grandchild"])
    assert heard["other"] is None and g.jobs["other"].result == "o"
    assert [g.jobs[i].state for i in ("bad", "child", "grandchild")] == ["failed"] * 3


def test_a_job_that_runs_after_all_runs_once_its_deps_ended_failed_or_not():
    g = JobGraph()

    def boom():
        raise ValueError("no")

    g.add(Job("bad", "x", bind=lambda jobs: (boom, ())))
    g.add(Job("slow", "x", bind=lambda jobs: (sleeper, (0.1, [], "s"))))
    g.add(Job("row", "x", ("bad", "slow"), after_all=True,
              bind=lambda jobs: (lambda: [jobs[d].state for d in ("bad", "slow")], ())))
    Scheduler(g, ThreadExecutor(2)).run()
    assert g.jobs["row"].state == "done" and g.jobs["row"].result == ["failed", "done"]


def test_a_job_can_add_jobs_when_it_ends():
    g = JobGraph()

    def more(job):
        g.add(Job("late", "x", (job.id,), bind=lambda jobs: (sleeper, (0, [], "late"))))

    g.add(Job("first", "x", bind=lambda jobs: (sleeper, (0, [], "first")), done=more))
    Scheduler(g, ThreadExecutor(1)).run()
    assert g.jobs["late"].result == "late"


def test_a_late_job_can_hold_an_earlier_one_but_never_in_a_cycle():
    """Precision repair's jobs, planned once the builds are scored, hold the end-to-end row planned
    before them (JobGraph.hold); the priorities and the wall projection follow the new edge."""
    log: list = []
    g = JobGraph()
    g.add(Job("a", "x", seconds=1, bind=lambda jobs: (sleeper, (0, log, "a"))))
    g.add(Job("row", "x", ("a",), seconds=1, after_all=True, bind=lambda jobs: (sleeper, (0, log, "row"))))

    def more(job):
        g.add(Job("late", "x", ("a",), seconds=5, bind=lambda jobs: (sleeper, (0.05, log, "late"))))
        assert g.hold("row", "late")
        assert not g.hold("late", "row") and not g.hold("row", "late")     # a cycle; already held

    g.jobs["a"].done = more
    Scheduler(g, ThreadExecutor(2)).run()
    assert log.index(("end", "late")) < log.index(("start", "row"))
    chain = sum(g.jobs[j].estimate for j in ("a", "late", "row"))        # recorded durations by now
    assert g.remaining_path()["a"] == pytest.approx(chain)
    records = [{"id": j.id, "deps": list(j.deps), "seconds": j.estimate, "where": "worker"} for j in g.jobs.values()]
    assert project_wall(records, 2) == pytest.approx(chain)


def test_heavy_alone_jobs_never_overlap_other_heavy_jobs_but_light_jobs_go_on():
    log: list = []
    g = JobGraph()
    for i in range(3):
        g.add(Job(f"heavy{i}", "x", memory=10, alone=True, bind=lambda jobs, i=i: (sleeper, (0.05, log, f"h{i}"))))
    for i in range(3):
        g.add(Job(f"light{i}", "x", bind=lambda jobs, i=i: (sleeper, (0.05, log, f"l{i}"))))
    ex = ThreadExecutor(3)
    Scheduler(g, ex, MemoryGate(budget=1000, alone=True)).run()
    assert ex.most_heavy == 1 and ex.most >= 2


def test_a_waiting_alone_job_is_not_passed_and_short_heavy_jobs_fill_the_wait():
    """At 4c8d28c (0.6B) the talker's alone quantizations waited while .pte lowerings of a lane went
    ahead of them one after another, and no other heavy job could pass them: one core idle for 600 s.
    Now an alone job that waits has the next turn, and a heavy job starts before it only if it is
    expected to end by the time the running heavy jobs end."""
    log: list = []
    est = {"pte0": 0.4, "pte1": 0.4, "alone": 0.1, "long": 1.0, "short": 0.05}
    prio = {"pte0": 10, "pte1": 9, "alone": 8, "long": 7, "short": 1}
    g = JobGraph()
    for jid, secs in est.items():
        g.add(Job(jid, "x", memory=10, alone=jid == "alone", lane="pte-lower" if jid.startswith("pte") else None,
                  bind=lambda jobs, jid=jid, secs=secs: (sleeper, (secs, log, jid))))
    Scheduler(g, ThreadExecutor(2), MemoryGate(budget=1000, alone=True), priority=lambda: prio,
              seconds=lambda job: est[job.id]).run()
    at = {e: log.index(e) for e in log}
    assert at[("start", "short")] < at[("end", "pte0")]           # backfilled beside the lowering
    assert at[("start", "alone")] < at[("start", "pte1")]          # the lane did not pass it again
    assert at[("start", "alone")] < at[("start", "long")]          # too long to go before it
    assert at[("end", "alone")] <= min(at[("start", "pte1")], at[("start", "long")])   # and it ran alone


def test_jobs_of_one_lane_run_one_at_a_time_beside_other_heavy_jobs():
    """Big ExecuTorch lowerings (memory.lane): at 4bce34b two 0.6B talker .pte lowerings at once set the
    build's peak. A lane's jobs never overlap each other; other heavy jobs still run beside them, and the
    wall projection follows the same rule."""
    from omni_export.memory import LANE_MIN_BYTES, lane, step_bytes

    assert lane("pte-lower", step_bytes("pte-lower", int(1.66 * 2**30))) == "pte-lower"
    assert lane("pte-lower", LANE_MIN_BYTES - 1) is None and lane("qnn-dlc", 10 * LANE_MIN_BYTES) is None
    log: list = []
    g = JobGraph()
    for i in range(3):
        g.add(Job(f"pte{i}", "x", memory=10, lane="pte-lower", bind=lambda jobs, i=i: (sleeper, (0.05, log, f"p{i}"))))
    g.add(Job("sim", "x", memory=10, bind=lambda jobs: (sleeper, (0.2, log, "sim"))))
    ex = ThreadExecutor(3)
    Scheduler(g, ex, MemoryGate(budget=1000)).run()
    events = [e for e in log if e[1].startswith("p")]
    assert all(events[k][0] == "start" and events[k + 1] == ("end", events[k][1]) for k in range(0, len(events), 2))
    assert ex.most_heavy == 2                      # the other heavy job beside a lowering
    rec = [{"id": f"p{i}", "deps": [], "seconds": 2.0, "where": "worker", "lane": "pte-lower"} for i in range(2)]
    assert project_wall(rec, 2) == 4.0 and project_wall([{**r, "lane": None} for r in rec], 2) == 2.0


def test_a_memory_budget_lets_heavy_jobs_overlap_only_while_they_fit():
    g = JobGraph()
    for i in range(4):
        g.add(Job(f"h{i}", "x", memory=40, bind=lambda jobs, i=i: (sleeper, (0.05, [], i))))
    ex = ThreadExecutor(4)
    gate = MemoryGate(budget=100)
    Scheduler(g, ex, gate).run()
    assert ex.most_heavy == 2 and gate.waits >= 1          # two of 40 fit in 100, a third does not
    g2 = JobGraph()
    g2.add(Job("huge", "x", memory=10_000, bind=lambda jobs: (sleeper, (0, [], "huge"))))
    Scheduler(g2, ThreadExecutor(1), MemoryGate(budget=100)).run()     # alone it always runs
    assert g2.jobs["huge"].result == "huge"


def test_projected_wall_follows_the_dag_slots_and_memory():
    rec = [{"id": "a", "deps": [], "seconds": 2.0, "where": "worker"},
           {"id": "b", "deps": ["a"], "seconds": 3.0, "where": "worker"},
           {"id": "c", "deps": [], "seconds": 4.0, "where": "worker"}]
    assert project_wall(rec, 1) == 9.0
    assert project_wall(rec, 2) == 5.0          # a->b beside c
    heavy = [{**r, "memory_bytes": 60} for r in rec]
    assert project_wall(heavy, 2, budget=100) == 9.0       # two of 60 never fit in 100
    alone = [{**r, "memory_bytes": 1, "alone": True} for r in rec]
    assert project_wall(alone, 2) == 9.0
    # beside an alone job, heavy ones start while all held stays within the largest alone reservation
    big = [{**rec[0], "memory_bytes": 40, "alone": True}, {**rec[1], "memory_bytes": 100, "alone": True},
           {**rec[2], "memory_bytes": 50}]
    assert project_wall(big, 2) == 7.0          # a (40) beside c (50) fit in 100; b (100) waits for c
    assert project_wall([{**r, "memory_bytes": 61} if r["id"] == "c" else r for r in big], 2) == 9.0
    driver = rec + [{"id": "d", "deps": [], "seconds": 5.0, "where": "driver"}]
    assert project_wall(driver, 2) == 5.0       # the driver's lane is its own


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10), st.lists(st.integers(0, 30), max_size=3)), min_size=1, max_size=25),
       st.integers(1, 8))
def test_projection_is_between_the_critical_path_and_the_serial_sum(spec, workers):
    rec = [{"id": str(i), "deps": sorted({str(d) for d in deps if d < i}), "seconds": s, "where": "worker"}
           for i, (s, deps) in enumerate(spec)]
    g = JobGraph()
    for r in rec:
        g.add(Job(r["id"], "x", tuple(r["deps"]), seconds=r["seconds"]))
    critical = g.critical_path()[0]
    wall = project_wall(rec, workers)
    total = sum(r["seconds"] for r in rec)
    assert critical - 1e-9 <= wall <= total + 1e-9
    if workers == 1:
        assert wall == pytest.approx(total)


def test_local_workers_are_long_lived_and_fresh_jobs_get_a_process_each():
    """The local executor's shared workers serve job after job (a component's graph is rebuilt once per
    worker); a `fresh` job (a step of a graph past 256 MB) runs in a process that exits with it. Each
    answer carries the job's own CPU seconds."""
    import os

    from omni_export.jobs.local import LocalExecutor

    ex = LocalExecutor(workers=2)
    try:
        shared = [ex.submit(Job(f"s{i}", "x"), os.getpid, ()).result(timeout=120) for i in range(4)]
        fresh = [ex.submit(Job(f"f{i}", "x", fresh=True), os.getpid, ()).result(timeout=120) for i in range(2)]
    finally:
        ex.close()
    pids = {r.value for r in shared}
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
    assert len({r.value for r in fresh}) == 2 and not pids & {r.value for r in fresh}
    assert all(r.cpu_s is not None and r.cpu_s >= 0 for r in shared + fresh)


def die_until(marker: str, deaths: int) -> int:
    """A job that records each attempt and kills its own process on the first `deaths` attempts (as the
    HTP simulator once took a repair step's process down), then answers its attempt number."""
    import os
    import signal
    from pathlib import Path

    path = Path(marker)
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    n = len(path.read_text().split())
    if n <= deaths:
        os.kill(os.getpid(), signal.SIGKILL)
    return n


def test_a_job_whose_local_worker_dies_runs_again_in_a_new_process_and_then_fails_in_one_line(tmp_path):
    """The local executor treats a dead worker as Ray does: the job runs again in a new process (once),
    the slot gets a new worker for the jobs after it; a job whose worker dies every time fails with that
    said, and the build goes on (before, the job failed as BrokenProcessPool and a long-lived slot
    stayed broken)."""
    import os

    from omni_export.jobs.errors import WorkerDied, short
    from omni_export.jobs.local import RETRIES, LocalExecutor

    ex = LocalExecutor(workers=1)
    g = JobGraph()
    # a fresh job's own process (a heavy graph's step), then the slot's long-lived worker
    g.add(Job("victim", "x", fresh=True, bind=lambda jobs: (die_until, (str(tmp_path / "once"), 1))))
    g.add(Job("doomed", "x", ("victim",),
              bind=lambda jobs: (die_until, (str(tmp_path / "always"), RETRIES + 1))))
    g.add(Job("after", "x", ("doomed",), after_all=True, bind=lambda jobs: (os.getpid, ())))
    try:
        Scheduler(g, ex).run()
    finally:
        ex.close()
    assert g.jobs["victim"].state == "done" and g.jobs["victim"].result == 2       # the second attempt's answer
    assert len(set((tmp_path / "once").read_text().split())) == 2                   # two processes
    doomed = g.jobs["doomed"]
    assert doomed.state == "failed" and isinstance(doomed.error, WorkerDied)
    assert len((tmp_path / "always").read_text().split()) == RETRIES + 1
    assert short(doomed.error).startswith("WorkerDied: its worker process died 2 times (signal 9 (SIGKILL), "
                                          "signal 9 (SIGKILL))"), short(doomed.error)
    assert g.jobs["after"].state == "done" and g.jobs["after"].result != os.getpid()
    assert ex.reran == 2


def test_two_big_fresh_jobs_at_once_retire_the_idle_long_lived_workers():
    """A fresh job reserving >= 1 GiB that starts beside another retires the long-lived workers idling
    meanwhile (the 0.6B peak held two of them beside two DLC compiles); the next ordinary job spawns a
    new worker. One big fresh job alone retires nothing."""
    import os
    import time

    from omni_export.jobs.local import RETIRE_BESIDE_BYTES, LocalExecutor

    ex = LocalExecutor(workers=2)
    try:
        warm = [ex.submit(Job(f"w{i}", "x"), os.getpid, ()) for i in range(2)]
        before = {f.result(timeout=120).value for f in warm}
        alone = ex.submit(Job("f0", "x", fresh=True, memory=RETIRE_BESIDE_BYTES), time.sleep, (0.2,))
        alone.result(timeout=120)
        assert ex.retired == 0
        first = ex.submit(Job("f1", "x", fresh=True, memory=RETIRE_BESIDE_BYTES), time.sleep, (3,))
        second = ex.submit(Job("f2", "x", fresh=True, memory=RETIRE_BESIDE_BYTES), os.getpid, ())
        second.result(timeout=120), first.result(timeout=120)
        assert ex.retired == 2
        after = ex.submit(Job("s", "x"), os.getpid, ()).result(timeout=120).value
    finally:
        ex.close()
    assert len(before) == 2 and after not in before


@pytest.mark.parametrize("weight_bytes", [1 << 20, 1 << 30])
def test_end_to_end_rows_wait_only_for_the_scores_of_their_precision(tmp_path, weight_bytes):
    """A light model's fp16 row is a job of its own that waits only for the fp16 scores of the format its
    runner drives (context binaries on the HTP simulator), so it runs while the other builds are still
    lowered; with a graph past HEAVY_BYTES one job runs every precision's row on ORT CPU (the recipe's
    fp32 reference pipeline once) in a process of its own."""
    from omni_export.jobs.component import HEAVY_BYTES as HEAVY

    rows, scores, _ = _e2e_rows(tmp_path, weight_bytes, "off")
    _assert_rows(rows, scores, weight_bytes)
    # precision repair on: a quantized row waits for every build (the last of a component's jobs decides
    # its repair, whose jobs then hold the row); fp16 is never repaired
    rows, scores, cj = _e2e_rows(tmp_path, weight_bytes, "auto")
    # a quantized ONNX-family score may add attribution and repair before the row (Job.tail, the first
    # run's priority); fp16 scores and .pte scores add none
    tails = {s: cj.graph.jobs[s].tail for s in scores if cj.graph.jobs[s].kind != "score-shared"}
    assert tails and all((t > 0) == ("/w8a16" in s and "/pte/" not in s) for s, t in tails.items()), tails
    # at real size the tail is the attribution and every repair step scaled to the graph's weights
    from omni_export.jobs.graph import SECONDS_PER_GIB

    w8 = next(b for b in cj.builds if b.precision.value == "w8a16" and b.format.value != "pte")
    assert cj._tail(w8, 2**30) == SECONDS_PER_GIB["attribute"] + cj.run.opts.repair_steps * SECONDS_PER_GIB["repair"]
    if weight_bytes < HEAVY:
        assert set(rows["end-to-end/fp16/part1"].deps) == {s for s in scores if s.endswith("/ctx/fp16")}
        assert set(rows["end-to-end/w8a16/part2"].deps) == scores
    else:
        assert all(set(job.deps) == scores for job in rows.values())
    # repair's jobs, added under way, hold the rows of their precision; an fp16 attribution holds none
    for jid in ("code2wav/attribute/fp16", "code2wav/attribute/w8a16", "code2wav/repair/w8a16/1",
                "code2wav/lower/ctx/w8a16-mixed"):
        cj._add(Job(jid, "repair", ("code2wav/export",)))
    held = {"code2wav/attribute/w8a16", "code2wav/repair/w8a16/1", "code2wav/lower/ctx/w8a16-mixed"}
    if weight_bytes < HEAVY:
        assert all(held <= set(rows[f"end-to-end/w8a16/part{k}"].deps) for k in (1, 2))
        assert set(rows["end-to-end/fp16/part2"].deps) == {s for s in scores if s.endswith("/ctx/fp16")}
    else:
        assert all(held <= set(job.deps) and "code2wav/attribute/fp16" not in job.deps for job in rows.values())


def _e2e_rows(tmp_path, weight_bytes, repair):
    from omni_export.core import Format, Precision
    from omni_export.jobs.component import HEAVY_BYTES as HEAVY, ComponentJobs
    from omni_export.jobs.e2e import EndToEndJobs
    from omni_export.jobs.plan import RunOptions, plan
    from omni_export.progress import Progress
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    opts = RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), tmp_path,
                      components=("text_projection", "code2wav"), precisions=(Precision.FP16, Precision.W8A16),
                      formats=(Format.ONNX, Format.CTX, Format.PTE), repair=repair)
    the_plan = plan(opts)

    class Run:
        store = type("S", (), {"root": tmp_path})()
        cache = type("C", (), {"reuse_e2e": lambda self, runners: None})()
        progress, components, entries, runs, frame_files = Progress(), {}, {}, {}, {}
        loaded_model = type("M", (), {"info": {"path": str(tmp_path)}})()

        def gate(self, component, precision):
            return 40.0

    run = Run()
    run.opts = opts
    g = JobGraph()
    for name in ("text_projection", "code2wav"):
        run.runs[name] = ComponentJobs(run, name, [b for b in the_plan.builds if b.component == name], g)
        run.runs[name].plan()
        run.runs[name].info = {"inputs": [], "outputs": [], "weight_bytes": weight_bytes}
    e2e = EndToEndJobs(run, the_plan, g)
    e2e.plan()
    rows = {j.id: j for j in g.jobs.values() if j.kind == "e2e"}
    scores = {j.id for j in g.jobs.values() if j.kind.startswith("score")}
    assert e2e.runners == ({"htp": ("fp16", "w8a16")} if weight_bytes < HEAVY else {"ort": ("fp16", "w8a16")})
    return rows, scores, run.runs["code2wav"]


def _assert_rows(rows, scores, weight_bytes):
    from omni_export.jobs.component import HEAVY_BYTES as HEAVY

    if weight_bytes < HEAVY:
        # each row in E2E_PARTS jobs, a share of the prompts each (the recipe merges them)
        from omni_export.jobs.e2e import E2E_PARTS

        assert E2E_PARTS == 2 and set(rows) == {f"end-to-end/{p}/part{k}" for p in ("fp16", "w8a16") for k in (1, 2)}
        for k in (1, 2):
            assert set(rows[f"end-to-end/fp16/part{k}"].deps) == {s for s in scores if s.endswith("/ctx/fp16")}
            assert set(rows[f"end-to-end/w8a16/part{k}"].deps) == {s for s in scores if s.endswith("/ctx/w8a16")}
        assert all(j.memory == 0 and not j.fresh for j in rows.values())
    else:
        # one row job for every precision (the fp32 reference once), in parts over the prompts
        assert set(rows) == {"end-to-end/fp16+w8a16/part1", "end-to-end/fp16+w8a16/part2"}
        from omni_export.jobs.e2e import E2E_MEMORY_FACTOR

        for job in rows.values():
            assert set(job.deps) == {s for s in scores if "/onnx/" in s}
            assert job.fresh and job.memory > 0 and job.memory >= int(E2E_MEMORY_FACTOR * weight_bytes)
    # a failed build below a row does not stop it: the row reports the graph it could not use
    assert all(j.after_all for j in rows.values())


def test_a_heavy_graphs_jobs_are_ordered_by_its_size_and_only_big_compiles_run_alone():
    """At 3e7927b a 0.6B talker's context binaries waited behind every job feeding ORT CPU, and each
    predictor's quantization ran alone with a core idle: the simulator's chains of a big graph come
    first, and a compile or quantization runs alone only when its reservation is GiBs."""
    from omni_export.jobs.graph import DEFAULT_SECONDS, SECONDS_PER_GIB
    from omni_export.memory import ALONE_MIN_BYTES, runs_alone, step_bytes

    talker, predictor = int(1.66 * 2**30), int(0.53 * 2**30)
    assert runs_alone("qnn-compile", step_bytes("qnn-compile", talker))
    assert runs_alone("quantize", step_bytes("quantize", talker))
    assert not runs_alone("qnn-compile", step_bytes("qnn-compile", predictor))
    assert not runs_alone("pte-lower", 10 * ALONE_MIN_BYTES)
    gib = talker / 2**30
    htp_chain = (SECONDS_PER_GIB["lower-ctx"] + SECONDS_PER_GIB["score-htp"]) * gib
    assert htp_chain > SECONDS_PER_GIB["lower-pte"] * gib > DEFAULT_SECONDS["lower-pte"]
    assert "e2e" not in SECONDS_PER_GIB


def test_a_heavy_graphs_waiting_worker_jobs_are_sized_to_its_weights(tmp_path):
    """ComponentJobs._sized, which every job of a graph past HEAVY_BYTES goes through once its trace ends:
    a worker step gets a process of its own and its memory estimate (memory.step_bytes) on the gate, a
    light graph's jobs stay as planned. (At 3d7b5e9 it lost its import of step_bytes: every real-size
    build stopped with a NameError after its first big trace, and no test took that path.)"""
    from omni_export.jobs.component import HEAVY_BYTES as HEAVY, MEMORY_KIND
    from omni_export.memory import step_bytes

    for weight_bytes in (1 << 20, 2 * HEAVY, 1 << 31):
        _, _, cj = _e2e_rows(tmp_path / str(weight_bytes), weight_bytes, "off")
        jobs = [j for j in cj.graph.jobs.values() if j.id.startswith("code2wav/") and j.where == "worker"
                and MEMORY_KIND.get(j.kind) and j.state == "waiting"]
        assert jobs
        for j in jobs:
            cj._sized(j)
            if weight_bytes < HEAVY:
                assert not j.fresh and not j.memory, j.id
            else:
                # a compile from a QDQ ONNX (int8 weights) reserves less than an fp16 one
                qdq = j.kind == "lower-ctx" and j.id.rsplit("/", 1)[-1] not in ("fp16", "fp32")
                kind = "qnn-compile-qdq" if qdq else MEMORY_KIND[j.kind]
                assert j.fresh and j.memory == step_bytes(kind, weight_bytes) > 0, j.id
                # a big lowering runs in its lane (one at a time): the 2 GiB graph's, not the 512 MB one's
                assert (j.lane == "pte-lower") == (j.kind == "lower-pte" and weight_bytes == 1 << 31), j.id


@pytest.mark.parametrize("weight_bytes", [1 << 20, 1 << 30])
def test_a_pte_lowering_frees_the_fp32_weights_only_in_a_process_of_its_own(tmp_path, weight_bytes):
    """The .pte lower job of a graph past HEAVY_BYTES runs fresh and is bound with consume=True (its
    process may free the module's fp32 weights); a light graph's shares a long-lived worker: False."""
    from omni_export.jobs import work
    from omni_export.jobs.component import HEAVY_BYTES as HEAVY

    _, _, cj = _e2e_rows(tmp_path, weight_bytes, "off")
    cj.run.store.staging = lambda name: tmp_path / "staging" / name
    cj.ref = "graph-ref"
    pte = [(i, b) for i, b in enumerate(cj.builds) if b.format.value == "pte"]
    assert pte
    for i, b in pte:
        job = cj.graph.jobs[cj._id("lower", "pte", b.precision.value)]
        cj._sized(job)
        fn, args = cj._bind_lower(cj.graph.jobs, i, job.deps[0])
        assert fn is work.lower and args[4] is (weight_bytes >= HEAVY) and job.fresh is (weight_bytes >= HEAVY)
        assert args[5] is None                 # compiled at the run's --htp-optimization
