"""The same job graph on a Ray cluster: two raylets on this machine (loopback only, one CPU each).

The demo Code2Wav build gives the local executor's verdicts and byte-identical ONNX and .pte, and a
worker killed in the middle of a job makes Ray run the job again instead of failing the build."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import FAST, read_manifest, run_cli

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20,
                                                       "include_dashboard": False})
    c.add_node(num_cpus=1, object_store_memory=80 << 20)
    c.wait_for_nodes()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def attempt(marker: str, seconds: float) -> int:
    """A job that records each attempt; the first one waits to be killed."""
    path = Path(marker)
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    pids = path.read_text().split()
    if len(pids) == 1:
        time.sleep(seconds)
    return len(pids)


def test_a_killed_worker_makes_its_job_run_again_not_the_build_fail(cluster, tmp_path):
    from ray import cloudpickle

    from omni_export.jobs.graph import Job, JobGraph
    from omni_export.jobs.ray_executor import RayExecutor
    from omni_export.jobs.scheduler import Scheduler

    cloudpickle.register_pickle_by_value(sys.modules[__name__])    # the workers cannot import this file
    marker = tmp_path / "attempts"
    ex = RayExecutor(cluster.address)
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


def test_a_build_on_a_two_node_cluster_equals_the_local_one(cluster, fp16_build, tiny_checkpoint, tmp_path):
    """Code2Wav, ONNX and .pte at fp16: the same verdicts and the same bytes as the local executor's build."""
    out = tmp_path / "ray"
    run_cli("qwen3-tts", "--target", "s25-htp", "--formats", "onnx,pte", "--precision", "fp16", "--no-attribution",
            "-q", *FAST, "--checkpoint", str(tiny_checkpoint), "--out", str(out),
            "--executor", f"ray:{cluster.address}", check=True, env={"OMNI_EXPORT_JOBS": "0"})
    local, remote = read_manifest(fp16_build), read_manifest(out)
    assert remote["jobs"]["executor"] == f"ray:{cluster.address}" and remote["jobs"]["workers"] == 2

    def by_build(m):
        return {(b["format"], b["precision"]): b for b in m["builds"] if b["format"] in ("onnx", "pte")}

    a, b = by_build(local), by_build(remote)
    assert set(b) == {("onnx", "fp16"), ("pte", "fp16")}
    for k in b:
        assert b[k]["status"] == a[k]["status"]
        assert [f["sha256"] for f in b[k]["files"]] == [f["sha256"] for f in a[k]["files"]], k
        assert b[k]["parity"]["outputs"] == a[k]["parity"]["outputs"], k
