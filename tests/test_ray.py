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
