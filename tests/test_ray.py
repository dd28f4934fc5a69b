"""The job graph on a Ray cluster: two raylets on this machine (loopback only, one CPU each). A worker
killed in the middle of a job makes Ray run the job again instead of failing the build. (The demo
Code2Wav build on the cluster gives the local executor's verdicts and bytes: test_reproducibility.py.)"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest


ray = pytest.importorskip("ray")


def attempt(marker: str, seconds: float) -> int:
    """A job that records each attempt; the first one waits to be killed."""
    path = Path(marker)
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    pids = path.read_text().split()
    if len(pids) == 1:
        time.sleep(seconds)
    return len(pids)


def test_a_killed_worker_makes_its_job_run_again_not_the_build_fail(ray_cluster, tmp_path):
    from ray import cloudpickle

    from omni_export.jobs.graph import Job, JobGraph
    from omni_export.jobs.ray_executor import RayExecutor
    from omni_export.jobs.scheduler import Scheduler

    cloudpickle.register_pickle_by_value(sys.modules[__name__])    # the workers cannot import this file
    marker = tmp_path / "attempts"
    ex = RayExecutor(ray_cluster.address)
    assert ex.slots == 2
    g = JobGraph()
    g.add(Job("victim", "x", bind=lambda jobs: (attempt, (str(marker), 60.0))))
    g.add(Job("after", "x", ("victim",), bind=lambda jobs: (attempt, (str(tmp_path / "after"), 0.0))))

    def kill_first_attempt():
        deadline = time.time() + 60
        while time.time() < deadline:
            if marker.exists() and marker.read_text().strip():
                os.kill(int(marker.read_text().split()[0]), signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_first_attempt)
    killer.start()
    try:
        Scheduler(g, ex).run()
    finally:
        killer.join()
        ex.close()
    assert g.jobs["victim"].state == "done" and g.jobs["victim"].result == 2    # the second attempt's answer
    assert g.jobs["after"].state == "done"


def shout(src: str, dst_dir: str) -> dict:
    """A job that reads a file and writes one."""
    out = Path(dst_dir) / "out.txt"
    out.write_text(Path(src).read_text().upper())
    return {"out": out, "read_from": src}


@pytest.mark.parametrize("through", ["object store", "shared dir"])
def test_a_jobs_files_travel_to_a_node_without_the_build_s_file_system_and_back(ray_cluster, tmp_path, monkeypatch,
                                                                                through):
    """Each node's workers see a file system of their own (ship.NODE_ROOT_ENV): the file a job reads
    reaches its node by content (Ray's object store, or --shared-dir by sha256), the file it writes
    comes back to the build's path, and the result names the build's paths."""
    from ray import cloudpickle

    from omni_export.jobs import ship
    from omni_export.jobs.graph import Job, JobGraph
    from omni_export.jobs.ray_executor import RayExecutor
    from omni_export.jobs.scheduler import Scheduler

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    out, nodes = tmp_path / "out", tmp_path / "nodes"
    (out / ".staging" / "job").mkdir(parents=True)
    (out / "in.txt").write_text("hello from the driver")
    shared = tmp_path / "shared" if through == "shared dir" else None
    if shared is not None:
        shared.mkdir()
    monkeypatch.setenv(ship.NODE_ROOT_ENV, str(nodes))
    ex = RayExecutor(ray_cluster.address, shared_dir=str(shared) if shared else None, roots=(str(out),))
    g = JobGraph()
    g.add(Job("shout", "x", bind=lambda jobs: (shout, (str(out / "in.txt"), str(out / ".staging" / "job")))))
    try:
        Scheduler(g, ex).run()
    finally:
        ex.close()
    job = g.jobs["shout"]
    assert job.state == "done", job.error
    assert job.result == {"out": out / ".staging" / "job" / "out.txt", "read_from": str(out / "in.txt")}
    assert (out / ".staging" / "job" / "out.txt").read_text() == "HELLO FROM THE DRIVER"
    copies = [p for p in nodes.rglob("in.txt")]          # what the job read: a copy on its node's own file system
    assert len(copies) == 1 and copies[0] != out / "in.txt" and copies[0].read_text() == "hello from the driver"
    assert ex.shipped["files_sent"] == 1 and ex.shipped["files_back"] == 1
    if shared is not None:
        assert {p.name for p in shared.iterdir()} == {ship.sha256_of(out / "in.txt"),
                                                      ship.sha256_of(out / ".staging" / "job" / "out.txt")}


def test_shared_dir_must_be_an_existing_writable_directory_and_only_for_ray(tmp_path):
    from conftest import run_cli

    base = ["qwen3-tts", "--out", str(tmp_path / "out"), "--components", "code2wav"]
    missing = run_cli(*base, "--executor", "ray", "--shared-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == (
        f"omni-export: error: --shared-dir {tmp_path / 'nowhere'}: not an existing directory (the path every Ray "
        f"node reads and writes, mounted alike on each)")
    local = run_cli(*base, "--shared-dir", str(tmp_path))
    assert local.returncode == 2
    assert local.stderr.strip().splitlines()[-1] == (
        f"omni-export: error: --shared-dir {tmp_path}: only --executor ray ships files between machines")
    assert not (tmp_path / "out").exists()


def test_a_task_whose_worker_died_on_every_ray_run_fails_as_worker_died():
    """Ray's WorkerCrashedError (its worker died on each of its runs) reaches the build as the local
    executor's WorkerDied, which the build answers the same on either executor (a repair step that
    crashed the HTP simulator runs again at --htp-optimization 2: jobs/component.py)."""
    from ray.exceptions import WorkerCrashedError

    from omni_export.jobs.errors import WorkerDied
    from omni_export.jobs.ray_executor import RETRIES, died

    e = died(WorkerCrashedError())
    assert isinstance(e, WorkerDied)
    assert str(e).startswith(f"its worker process died {RETRIES + 1} times (Ray: The worker died unexpectedly")
    other = ValueError("the job's own failure")
    assert died(other) is other
