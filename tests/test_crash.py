"""Kill a build at every named stage and at random moments (SIGKILL: no cleanup runs) and check,
after every kill, that the output directory is either the previous complete build or marked
incomplete, and that no manifest ever lists a missing or changed file; then that a rerun completes
and leaves exactly what its manifest lists (`omni-export verify` exit 0). Every run has --force:
the build cache would otherwise serve the unchanged build and skip the stages being killed.

Default: the 11 named crash points (omni_export/faults.py) + 2 random kills = 13 kills, with 3
complete runs in between (the random ones land between the named points).
OMNI_EXPORT_RANDOM_KILLS=N sets the random ones (e.g. 100 for a soak); OMNI_EXPORT_KILL_SEED fixes
their timing (the seed is printed).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from conftest import GEOMETRY, run_cli
from omni_export.artifacts.store import MARKER, listed_files, sha256_file

NAMED = ["begin", "loaded", "traced", "commit-before-rename@1", "commit-after-rename@1", "lowered",
         "commit-before-rename@2", "commit-after-rename@2", "pruned", "documents", "manifest"]
RANDOM_KILLS = int(os.environ.get("OMNI_EXPORT_RANDOM_KILLS", "2"))


def command(ckpt: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "omni_export.cli", "qwen3-tts", "--checkpoint", str(ckpt), "--out", str(out),
            "--formats", "onnx", "--precision", "fp16", "--no-attribution", "--jobs", "1", "-q", "--force", *GEOMETRY,
            "--components", "text_projection"]     # the smallest graph: the store is under test, not the model


def check_invariant(out: Path) -> str:
    """'complete' | 'incomplete' | 'empty'; fails on any manifest entry that is missing or changed."""
    manifest = out / "manifest.json"
    if manifest.exists():
        m = json.loads(manifest.read_text())           # never a torn manifest: it is renamed into place
        for rec in listed_files(m):
            p = out / rec["path"]
            assert p.is_file(), f"manifest lists {rec['path']}, which is missing"
            assert p.stat().st_size == rec["bytes"] and sha256_file(p) == rec["sha256"], \
                f"manifest lists {rec['path']} with other bytes"
    if (out / MARKER).exists():
        return "incomplete"
    if manifest.exists():
        return "complete"
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".write-test")], \
        f"{out} holds files but neither a manifest nor the {MARKER} marker"
    return "empty"


def complete_run(ckpt: Path, out: Path) -> float:
    t0 = time.time()
    proc = run_cli(*command(ckpt, out)[3:], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert check_invariant(out) == "complete"
    v = run_cli("verify", str(out))
    assert v.returncode == 0, v.stdout              # nothing left over from the killed runs
    return time.time() - t0


def kill_at_stage(ckpt: Path, out: Path, point: str) -> None:
    proc = run_cli(*command(ckpt, out)[3:], timeout=600, env={"OMNI_EXPORT_CRASH_AT": point})
    assert proc.returncode == 137, f"{point}: exit {proc.returncode}, the crash point was not reached\n" \
                                   f"{proc.stderr[-2000:]}"


def kill_after(ckpt: Path, out: Path, delay: float) -> bool:
    """SIGKILL after `delay` seconds; False when the run finished first."""
    return run_cli(*command(ckpt, out)[3:], kill_after=delay).returncode == -9


def test_killed_builds_never_leave_a_manifest_pointing_at_missing_or_partial_files(tmp_path, tiny_checkpoint):
    out = tmp_path / "out"
    states: dict[str, int] = {}
    duration = complete_run(tiny_checkpoint, out)          # a previous complete build to protect
    kills = 0
    for point in NAMED:
        kill_at_stage(tiny_checkpoint, out, point)
        kills += 1
        state = check_invariant(out)
        states[state] = states.get(state, 0) + 1
        if point == "begin":
            assert state == "incomplete"                    # the marker is written first
        if point in ("pruned", "documents"):
            assert state == "incomplete" and not (out / "manifest.json").exists()
        if point == "manifest":
            assert state == "incomplete" and (out / "manifest.json").exists()
            v = run_cli("verify", str(out))
            assert v.returncode == 3 and "incomplete .incomplete" in v.stdout
        if point == "commit-after-rename@1":
            duration = max(duration, complete_run(tiny_checkpoint, out))     # rerun completes mid-way too
    complete_run(tiny_checkpoint, out)
    seed = int(os.environ.get("OMNI_EXPORT_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    random_kills = 0
    while random_kills < RANDOM_KILLS:
        if kill_after(tiny_checkpoint, out, rng.uniform(0.5, duration)):
            random_kills += 1
            state = check_invariant(out)
            states[state] = states.get(state, 0) + 1
        else:
            assert check_invariant(out) == "complete"
    kills += random_kills
    complete_run(tiny_checkpoint, out)
    print(f"\n{kills} kills ({len(NAMED)} at named stages, {random_kills} random, seed {seed}); "
          f"states after a kill: {states}")
    assert kills == len(NAMED) + RANDOM_KILLS


def test_a_rerun_after_a_kill_answers_every_job_the_killed_run_finished_from_its_outputs(tmp_path, tiny_checkpoint,
                                                                                           fp16_build):
    """SIGKILL a build once two jobs have ended (their outputs kept under their content keys in
    OUT/.jobs), then rerun it: exactly those jobs are answered from the job store ("cached" in the
    manifest's job graph), the others run, and the result equals an uninterrupted build's (fp16_build:
    the same ONNX bytes, verdict and scores)."""
    import signal
    import subprocess

    from conftest import ALL_FORMATS_FP16, ROOT, read_manifest

    out = tmp_path / "out"
    args = [a if a != "onnx,dlc,ctx,pte" else "onnx" for a in ALL_FORMATS_FP16 if a != "-q"] + [
        "--checkpoint", str(tiny_checkpoint), "--out", str(out)]
    env = {**os.environ, "OMNI_EXPORT_JOBS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "omni_export.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def kept() -> dict[str, str]:
        found = {}
        for d in (out / ".jobs").glob("[0-9a-f]*"):
            try:
                found[json.loads((d / "result.json").read_text())["job"]] = d.name
            except (OSError, ValueError):
                pass                      # renamed whole into place: a reader never sees half of one
        return found

    deadline = time.monotonic() + 300
    while len(kept()) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    before = kept()
    assert proc.returncode == -9 and len(before) >= 2, f"exit {proc.returncode}, kept {before}: {err[-1500:]}"
    assert not (out / "manifest.json").exists() and (out / MARKER).exists()

    again = run_cli(*args, timeout=600, env={"OMNI_EXPORT_JOBS": "0"})
    assert again.returncode == 0, again.stderr[-2000:]
    said = again.stdout + again.stderr
    assert f"the outputs of {len(before)} job(s) it finished are reused" in said
    assert said.count("cached (a killed run's job)") == len(before)
    m, ref = read_manifest(out), read_manifest(fp16_build)
    graph = {j["id"]: j for j in m["jobs"]["graph"]}
    assert {i for i, j in graph.items() if j.get("cached")} == set(before) and m["jobs"]["cached"] == len(before)
    assert {"code2wav/trace", "code2wav/score/onnx/fp16"} - set(before) <= {i for i, j in graph.items()
                                                                            if j["state"] == "done" and not j.get("cached")}
    mine = builds_of(m)[("onnx", "fp16")]
    theirs = builds_of(ref)[("onnx", "fp16")]
    assert mine["status"] == theirs["status"] == "accepted"
    assert mine["parity"]["outputs"] == theirs["parity"]["outputs"]
    assert [f["sha256"] for f in mine["files"]] == [f["sha256"] for f in theirs["files"]]
    assert not (out / ".jobs").exists()                     # a finished run empties the job store
    assert run_cli("verify", str(out)).returncode == 0


def builds_of(m: dict) -> dict:
    return {(b["format"], b["precision"]): b for b in m["builds"] if b["component"] == "code2wav"}


def test_a_build_killed_after_its_last_component_resumes_without_loading_anything_it_reused(tmp_path,
                                                                                           tiny_checkpoint):
    """Killed after every component was recorded, before the manifest (the 0.6B build that failed at
    report.html): the rerun reuses every component, so no job loads the model, and the end-to-end plan
    read the checkpoint from the previous record, which a run that never wrote its manifest lacks
    (KeyError 'checkpoint', exit 1). It completes now, with the killed run's builds."""
    out = tmp_path / "out"
    resumed = [a for a in command(tiny_checkpoint, out)[3:] if a != "--force"]
    killed = run_cli(*resumed, timeout=600, env={"OMNI_EXPORT_CRASH_AT": "documents"})
    assert killed.returncode == 137 and check_invariant(out) == "incomplete"
    built = {p.name: sha256_file(p) for p in out.glob("*.onnx")}
    proc = run_cli(*resumed, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert check_invariant(out) == "complete"
    m = json.loads((out / "manifest.json").read_text())
    assert m["checkpoint"]["path"] and m["summary"]["accepted"] == 1 and len(built) == 1
    assert {p.name: sha256_file(p) for p in out.glob("*.onnx")} == built and m["builds"][0]["cache"]["hit"]
