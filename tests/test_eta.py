"""The build's ETA (jobs/eta.py): the cost model fitted to past runs, its file (written, reused,
hostile ones ignored), the projection over the remaining graph, and the frame meters of host loops."""
from __future__ import annotations

import json
import os
import time

import pytest

from omni_export.jobs import eta as E
from omni_export.jobs.graph import Job, JobGraph
from omni_export.progress import FrameFile, FrameLines, frame_sink, frames, read_frames

MB = 1 << 20


def rec(jid, kind, seconds, state="done", deps=()):
    return {"id": jid, "kind": kind, "deps": list(deps), "where": "worker", "memory_bytes": 0, "alone": False,
            "state": state, "seconds": seconds, "component": jid.split("/")[0]}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_EXPORT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_fit_prefers_the_jobs_own_runs_then_its_kind_and_component_then_the_kinds_line():
    m = E.CostModel()
    for s in (10.0, 12.0, 50.0):                          # the median, not the mean: one slow run is an outlier
        m.observe([rec("talker/score/ctx/fp16", "score-htp", s)], {"talker": 100 * MB}, "ck")
    m.observe([rec("talker/score/ctx/w8a16", "score-htp", 30.0), rec("talker/export", "export", 8.0, state="failed")],
              {"talker": 100 * MB}, "ck")
    assert m.estimate("talker/score/ctx/fp16", "score-htp", "talker", 100 * MB) == 12.0
    # later runs weigh more (the host's load drifts), but one odd run among several does not decide
    assert E.recent_median([100.0, 10.0]) == 10.0 and E.recent_median([10.0, 11.0, 12.0, 100.0]) == 12.0
    assert m.estimate("talker/score/ctx/fp16", "score-htp", "talker", 120 * MB) == 12.0     # within SIZE_RATIO
    # never run: the same kind and component at that size
    assert m.estimate("talker/score/dlc/fp16", "score-htp", "talker", 100 * MB) == pytest.approx(21.0)
    assert m.estimate("talker/export", "export", "talker", 100 * MB) is None                  # a failed run is no duration
    # another component and size: the kind's line in GiB, only within the sizes it was fitted on
    for w, s in ((1 << 30, 110.0), (2 << 30, 210.0)):
        m.observe([rec("big/lower/pte/fp16", "lower-pte", s)], {"big": w}, "ck2")
    assert E.fit_line([(1.0, 110.0), (2.0, 210.0)]) == pytest.approx((10.0, 100.0))
    assert m.estimate("other/lower/pte/fp16", "lower-pte", "other", 3 << 29) == pytest.approx(160.0)
    assert m.estimate("other/lower/pte/fp16", "lower-pte", "other", 40 << 30) is None         # far outside: defaults
    assert m.estimate("other/trace", "trace", "other", None) is None
    # the last KEEP runs are kept, and a component's weights are known before its trace
    for i in range(E.KEEP + 3):
        m.observe([rec("talker/score/ctx/fp16", "score-htp", float(i))], {"talker": 100 * MB}, "ck")
    assert len(m.jobs["talker/score/ctx/fp16"]["runs"]) == E.KEEP
    assert m.weight_of("ck", "talker") == 100 * MB and m.weight_of("nope", "talker") is None


def test_the_cost_file_is_written_reused_and_merged(cache):
    m = E.CostModel.load()
    assert m.jobs == {} and m.where == cache / E.FILE
    m.observe([rec("c/trace", "trace", 4.0)], {"c": 5 * MB}, "ck", "sig", [rec("end-to-end/fp16", "e2e", 9.0)])
    assert m.save() is None and (cache / E.FILE).is_file()
    other = E.CostModel.load()                       # another build, loaded before this one saves again
    m.observe([rec("c/export", "export", 6.0)], {"c": 5 * MB}, "ck")
    assert m.save() is None
    other.observe([rec("c/fp16", "fp16", 1.0)], {"c": 5 * MB}, "ck")
    assert other.save() is None                      # replays its runs onto the file as it is now
    back = E.CostModel.load()
    assert {k: [s for _, s in v["runs"]] for k, v in back.jobs.items()} == {
        "c/trace": [4.0], "c/export": [6.0], "c/fp16": [1.0]}
    assert back.late["sig"][0]["id"] == "end-to-end/fp16" and back.weight_of("ck", "c") == 5 * MB
    # a model's components, known before it loads (the plan and ETA then come before torch does)
    back.observe([], {}, "ck", model=("model-key", ["c", "d"]))
    assert back.save() is None and E.CostModel.load().components_for("model-key") == ("c", "d")
    again = E.CostModel.load()
    again.forget_model("model-key")
    assert again.save() is None and E.CostModel.load().components_for("model-key") is None


@pytest.mark.parametrize("make", ["garbage", "json_list", "nan_seconds", "negative", "string_runs", "deep",
                                  "huge", "fifo", "symlink_out", "dir", "late_kind", "component_path"])
def test_a_hostile_cost_file_is_ignored_with_a_warning_and_rewritten(cache, tmp_path, make):
    cache.mkdir(parents=True)
    p = cache / E.FILE
    good = {"format": 1, "tool": "omni-export", "jobs": {"c/trace": {"kind": "trace", "component": "c",
                                                                      "runs": [[1, 3.0]]}}}
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(good))
    bad = {"garbage": b"\x00\xffnot json{",
           "json_list": b"[1, 2, 3]",
           "nan_seconds": json.dumps({**good, "jobs": {"c/trace": {"kind": "trace", "component": "c",
                                                                     "runs": [[1, float("nan")]]}}}).encode(),
           "negative": json.dumps({**good, "jobs": {"c/trace": {"kind": "trace", "component": "c",
                                                                  "runs": [[1, -5]]}}}).encode(),
           "string_runs": json.dumps({**good, "jobs": {"c/trace": {"kind": "trace", "component": "c",
                                                                     "runs": "rm -rf /"}}}).encode(),
           "deep": b'{"format": 1, "tool": "omni-export", "jobs": ' + b"[" * 100000 + b"]" * 100000 + b"}",
           "huge": b" " * (E.MAX_BYTES + 1),
           "component_path": json.dumps({**good, "models": {"k": ["talker", "../etc"]}}).encode(),
           "late_kind": json.dumps({**good, "late": {"s": [{"id": "x", "kind": "trace", "deps": [],
                                                            "where": "worker"}]}}).encode()}
    if make == "fifo":
        os.mkfifo(p)                                 # opening it for reading must not hang the build
    elif make == "symlink_out":
        p.symlink_to(outside)                        # a valid cost file, but outside the cache: never read
    elif make == "dir":
        p.mkdir()
    else:
        p.write_bytes(bad[make])
    warnings: list[str] = []
    m = E.CostModel.load(warnings.append)
    assert m.jobs == {}
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: cost model {p} ignored (")
    assert "omni-export" not in warnings[0].replace(str(p), "")
    m.observe([rec("c/trace", "trace", 2.0)], {"c": 1}, "ck")
    why = m.save()
    if make == "dir":
        assert why is not None and why.startswith("cost model not saved to ")
        return
    assert why is None and not p.is_symlink() and p.is_file()
    assert json.loads(outside.read_text()) == good            # the link's target was not written through
    assert E.CostModel.load(warnings.append).jobs["c/trace"]["runs"] == [[1, 2.0]] and len(warnings) == 1


def test_the_remaining_wall_is_list_scheduled_with_running_jobs_first_and_expected_late_jobs():
    g = JobGraph()
    g.add(Job("a/trace", "trace", where="driver", component="a"))
    g.add(Job("a/export", "export", ("a/trace",), component="a"))
    g.add(Job("a/score/onnx/fp16", "score", ("a/export",), component="a"))
    g.add(Job("b/trace", "trace", where="driver", component="b"))
    m = E.CostModel()
    m.observe([rec("a/trace", "trace", 10.0), rec("a/export", "export", 20.0), rec("a/score/onnx/fp16", "score", 5.0),
               rec("b/trace", "trace", 4.0)], {"a": MB, "b": MB}, "ck")
    late = [{"id": "end-to-end/fp16", "kind": "e2e", "component": None, "deps": ["a/score/onnx/fp16"],
             "where": "worker", "memory_bytes": 0, "alone": False}]
    m.observe([rec("end-to-end/fp16", "e2e", 30.0)], {}, "ck")
    eta = E.Eta(g, m, "ck", workers=2, budget=None, late=late)
    assert eta.measured() == (4, 4)
    # driver lane: a/trace then b/trace; workers: export 20, score 5, the row 30
    assert eta.remaining(now=0.0) == pytest.approx(10 + 20 + 5 + 30)
    t0 = 1000.0
    g.jobs["a/trace"].state, g.jobs["a/trace"].started, g.jobs["a/trace"].ended = "done", t0 - 12, t0 - 2
    g.jobs["a/export"].state, g.jobs["a/export"].started = "running", t0 - 2
    assert eta.remaining(now=t0) == pytest.approx(18 + 5 + 30)
    # a job past its estimate ends a quarter of its overrun later
    assert eta.remaining(now=t0 + 38) == pytest.approx(0.25 * 20 + 5 + 30)
    # the row is planned: the projection uses the job, not the expectation
    g.jobs["a/export"].state, g.jobs["a/export"].ended = "done", t0 + 40
    g.jobs["a/score/onnx/fp16"].state, g.jobs["a/score/onnx/fp16"].ended = "done", t0 + 45
    g.jobs["b/trace"].state = "done"
    assert eta.remaining(now=t0 + 45) == 0.0 and eta.late == []      # its moment passed without it: dropped


def test_a_rejections_expected_attribution_and_repair_steps_raise_its_scores_priority_and_the_eta():
    """The last run attributed and repaired c's w8a16 after its score (300 s, then 2 x 80 s): that
    short score job outranks a 200 s lowering, so the tail starts early; the steps wait in a chain."""
    g = JobGraph()
    g.add(Job("c/trace", "trace", where="driver", component="c"))
    g.add(Job("c/export", "export", ("c/trace",), component="c"))
    g.add(Job("c/score/onnx/w8a16", "score", ("c/export",), component="c"))
    g.add(Job("t/lower/pte/fp16", "lower-pte", ("c/trace",), component="t"))
    m = E.CostModel()
    m.observe([rec("c/trace", "trace", 1.0), rec("c/export", "export", 4.0), rec("c/score/onnx/w8a16", "score", 10.0),
               rec("t/lower/pte/fp16", "lower-pte", 200.0), rec("c/attribute/w8a16", "attribute", 300.0),
               rec("c/repair/w8a16/1", "repair", 80.0), rec("c/repair/w8a16/2", "repair", 80.0)],
              {"c": MB, "t": MB}, "ck")
    late = [{"id": "c/attribute/w8a16", "kind": "attribute", "component": "c",
             "deps": ["c/trace", "c/score/onnx/w8a16"], "where": "worker", "memory_bytes": 0, "alone": False},
            {"id": "c/repair/w8a16/1", "kind": "repair", "component": "c", "deps": ["c/export", "c/attribute/w8a16"],
             "where": "worker", "memory_bytes": 0, "alone": False},
            {"id": "c/repair/w8a16/2", "kind": "repair", "component": "c", "deps": ["c/export", "c/repair/w8a16/1"],
             "where": "worker", "memory_bytes": 0, "alone": False}]
    eta = E.Eta(g, m, "ck", workers=2, budget=None, late=late)
    prio = eta.priority()
    assert prio["c/score/onnx/w8a16"] == pytest.approx(10 + 300 + 80 + 80)
    assert prio["c/score/onnx/w8a16"] > prio["t/lower/pte/fp16"] == pytest.approx(200)
    assert prio["c/trace"] == pytest.approx(1 + 4 + 470)
    # two workers: export, score, then attribution and steps in a chain (470 s) beside the lowering
    assert eta.remaining(now=0.0) == pytest.approx(1 + 4 + 10 + 300 + 80 + 80)
    lines = E.plan_lines(type("P", (), {"builds": [], "skipped": []})(), g, [], 2, "local", eta.late)
    assert lines[-1].endswith("expected once under way (as the last run of this plan): "
                              "c/attribute/w8a16, c/repair/w8a16 (2 steps)")
    # the score ended and no attribution came (it passed this time): nothing more is expected
    for jid in ("c/trace", "c/export", "c/score/onnx/w8a16"):
        g.jobs[jid].state, g.jobs[jid].started, g.jobs[jid].ended = "done", 0.0, 1.0
    assert eta.priority()["t/lower/pte/fp16"] == pytest.approx(200) and eta.late == []


def test_a_repair_step_that_held_an_end_to_end_row_puts_the_row_after_it_in_the_priority_and_the_eta():
    """The demo's tail at dfe0b01: the w8a16 row waits for every scoring job, so each .pte lowering
    ranked lowering + row (46 + 67 s) and Code2Wav's quantize chain (its repair steps and then the row)
    only its steps: the chain started at 184 s, the row ran last on one core. A late job records the
    rows it held (`holds`); the next run counts the row below the step."""
    g = JobGraph()
    g.add(Job("c/trace", "trace", where="driver", component="c"))
    g.add(Job("c/quantize/w8a16", "quantize", ("c/trace",), component="c"))
    g.add(Job("c/lower/pte/w8a16", "lower-pte", ("c/trace",), component="c"))
    g.add(Job("end-to-end/w8a16", "e2e", ("c/quantize/w8a16", "c/lower/pte/w8a16"), component=None))
    m = E.CostModel()
    m.observe([rec("c/trace", "trace", 1.0), rec("c/quantize/w8a16", "quantize", 1.0),
               rec("c/lower/pte/w8a16", "lower-pte", 46.0), rec("c/repair/w8a16/1", "repair", 60.0),
               rec("end-to-end/w8a16", "e2e", 67.0)], {"c": MB}, "ck")
    late = [{"id": "c/repair/w8a16/1", "kind": "repair", "component": "c", "deps": ["c/quantize/w8a16"],
             "where": "worker", "memory_bytes": 0, "alone": False, "holds": ["end-to-end/w8a16"]}]
    prio = E.Eta(g, m, "ck", workers=2, budget=None, late=late).priority()
    assert prio["c/quantize/w8a16"] == pytest.approx(1 + 60 + 67)
    assert prio["c/quantize/w8a16"] > prio["c/lower/pte/w8a16"] == pytest.approx(46 + 67)
    # and the projection runs the row after the step: 1 + 1 + 60 + 67, the lowering beside them
    assert E.Eta(g, m, "ck", workers=2, budget=None, late=late).remaining(now=0.0) == pytest.approx(129)
    # without the record (a file of before), the row is not below the step, only below the quantize
    old = [{k: v for k, v in late[0].items() if k != "holds"}]
    assert E.Eta(g, m, "ck", workers=2, budget=None, late=old).priority()["c/quantize/w8a16"] == pytest.approx(1 + 67)
    # the record survives the cost model's file (observe, then validation on load)
    m.observe([], {}, "ck", signature="sig", late=[{**late[0], "state": "done", "seconds": 60.0}])
    assert E._validated(json.loads(json.dumps({"format": E.FORMAT, "tool": "omni-export", "late": m.late})))["late"]["sig"][0]["holds"] == ["end-to-end/w8a16"]


def test_without_a_past_run_of_the_plan_a_quantized_scores_possible_follow_ups_rank_it_first():
    """A first run (no cost history: a new user's demo) knows no late jobs; a score that may add
    attribution and repair steps (Job.tail) ranks them and the row they would hold below it. Once a
    past run of the plan said what came (even nothing), its record decides instead."""
    g = JobGraph()
    g.add(Job("c/trace", "trace", where="driver", component="c"))
    g.add(Job("c/score/ctx/w8a16", "score-htp", ("c/trace",), component="c", tail=60.0))
    g.add(Job("c/lower/pte/w8a16", "lower-pte", ("c/trace",), component="c"))
    g.add(Job("end-to-end/w8a16", "e2e", ("c/score/ctx/w8a16", "c/lower/pte/w8a16")))
    first = E.Eta(g, E.CostModel(), "ck", workers=2, budget=None, late=None).priority()
    d = __import__("omni_export.jobs.graph", fromlist=["DEFAULT_SECONDS"]).DEFAULT_SECONDS
    assert first["c/score/ctx/w8a16"] == pytest.approx(d["score-htp"] + 60 + d["e2e"])
    assert first["c/score/ctx/w8a16"] > first["c/lower/pte/w8a16"] == pytest.approx(d["lower-pte"] + d["e2e"])
    known = E.Eta(g, E.CostModel(), "ck", workers=2, budget=None, late=[]).priority()
    assert known["c/score/ctx/w8a16"] == pytest.approx(d["score-htp"] + d["e2e"])


def test_first_run_uses_the_graph_defaults():
    g = JobGraph()
    g.add(Job("a/trace", "trace", where="driver", component="a"))
    g.add(Job("a/lower/pte/fp16", "lower-pte", ("a/trace",), component="a"))
    eta = E.Eta(g, E.CostModel(), "ck", workers=2, budget=None)
    assert eta.measured() == (0, 2)
    assert eta.remaining(now=0.0) == pytest.approx(5.0 + 15.0)       # graph.DEFAULT_SECONDS


def test_host_loop_meters_report_frames_done_of_total_with_an_eta(tmp_path):
    lines: list[str] = []
    with FrameLines(lines.append, every=3600) as sink, frame_sink(sink):
        tick = frames("generate", 4, bound=True)
        for _ in range(4):
            tick()
    assert len(lines) == 1 and lines[0].startswith("generate: 1/≤4 frames, ") and ", ETA ≤" in lines[0]
    with FrameLines(lines.append, every=0.0) as sink, frame_sink(sink):
        tick = frames("teacher-forced", 3)
        tick()
        sink.beat()                                  # a frame running long: a heartbeat line
    assert lines[-1].startswith("teacher-forced: 1/3 frames") and "frame 2 running" in lines[-1]
    frames("outside", 2)()                           # no sink: silent
    f = tmp_path / "meter.json"
    with frame_sink(FrameFile(f)):
        tick = frames("teacher-forced", 10)
        tick()
        tick()
    m = read_frames(f)
    assert (m.label, m.done, m.total) == ("teacher-forced", 1, 10) or (m.done, m.total) == (2, 10)
    assert "/10 frames" in m.text(time.time())
    f.write_text("not json")
    assert read_frames(f) is None and read_frames(tmp_path / "absent.json") is None


def test_the_heartbeat_names_what_runs_with_an_end_to_end_rows_frames(tmp_path):
    """EtaReport: the plan lines and a first ETA, then the heartbeat's status with the running jobs and
    the frames an end-to-end row's worker reports through its FrameFile (planned after the report began)."""
    from omni_export.progress import Paced, Progress

    notes: list[str] = []

    class Lines(Progress):
        def note(self, text):
            notes.append(text)

    g = JobGraph()
    g.add(Job("a/trace", "trace", where="driver", component="a", label="a: trace"))
    progress = Lines()
    files: dict[str, str] = {}
    report = E.EtaReport(E.Eta(g, E.CostModel(), "ck", workers=1, budget=None), progress, Paced(progress), files)
    report.start(["plan: 1 builds"])
    assert notes[0] == "plan: 1 builds" and notes[1].startswith("ETA 5s, about ")
    assert "0/1 jobs done (no past run of these jobs" in notes[1]
    row = g.add(Job("end-to-end/fp16", "e2e", ("a/trace",), label="end-to-end: fp16 on htp"))
    files[row.id] = str(tmp_path / "frames-fp16.json")
    g.jobs["a/trace"].state = "done"
    row.state, row.started = "running", time.time() - 3
    with frame_sink(FrameFile(files[row.id])):
        tick = frames("teacher-forced", 8)
        tick()
    status = report.paced.status()
    from omni_export.jobs.graph import DEFAULT_SECONDS

    expected = f"end-to-end: fp16 on htp 3s of ~{DEFAULT_SECONDS['e2e']:.0f}s"      # the default: no past run
    assert status.startswith("... 1/2 jobs done, ETA ") and expected in status, status
    assert "(teacher-forced: 1/8 frames, " in status


def test_an_end_to_end_rows_cost_is_kept_per_build_signature(cache):
    """The end-to-end row of a whole demo (~90 s) and of a Code2Wav-only run (skipped in 0.1 s) share the
    job id end-to-end/fp16; one history for both put the demo's first ETA 38 % short (80809ce). Rows are
    timed per build signature, other jobs per job id."""
    m = E.CostModel.load()
    for sig, s in (("whole", 90.0), ("part", 0.1), ("part", 0.1), ("part", 0.2)):
        m.observe([{**rec(E.cost_id("end-to-end/fp16", "e2e", sig), "e2e", s), "component": None}], {}, "ck", sig, [])
    g = JobGraph()
    g.add(Job("end-to-end/fp16", "e2e"))
    assert E.Eta(g, m, "ck", workers=2, budget=None, signature="whole").seconds(g.jobs["end-to-end/fp16"]) == (90.0, True)
    assert E.Eta(g, m, "ck", workers=2, budget=None, signature="part").seconds(g.jobs["end-to-end/fp16"])[0] < 1
    assert E.cost_id("c/export", "export", "whole") == "c/export"
