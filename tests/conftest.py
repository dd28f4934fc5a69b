"""Shared fixtures: tiny seeded checkpoints in the official layout, a CLI runner."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"

# One math thread per xdist worker (there is one worker per core): two workers with two spinning
# OpenMP threads each on two cores made small-op work ~5x slower (tests/test_sampling.py beside a
# 2-thread load: 133 s with torch's default, 26 s with 1 thread). Set before torch is imported here,
# and inherited by the CLIs and servers the tests start; job workers set their own (jobs/local.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# Fast streaming geometry for pipeline tests: the HTP simulator's cost grows with samples.
GEOMETRY = ["--left-context", "2", "--chunk-frames", "2"]
# ...and Code2Wav alone: the default is every component; most pipeline behaviour is proven on one.
FAST = [*GEOMETRY, "--components", "code2wav"]


@pytest.fixture(scope="session", autouse=True)
def capture_cache_dir(tmp_path_factory) -> Path:
    """One capture cache for the session, shared by the xdist workers (and the CLIs they start), not
    the user's: a CLI run on a checkpoint whose inputs another test captured reads them
    (artifacts/captures.py). test_captures.py uses a cache of its own; the reproducibility test's
    second build sets OMNI_EXPORT_CAPTURE_CACHE=off to capture afresh."""
    import os

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "capture-cache"
    os.environ["OMNI_EXPORT_CACHE_DIR"] = str(root)
    # Builds run their jobs in the build process (--jobs 1): pytest-xdist already keeps both cores
    # busy, and every worker process would pay torch's and ExecuTorch's start-up again. The shared
    # fp16 build below, the Ray tests and tests/test_jobs.py run jobs on real worker processes.
    os.environ.setdefault("OMNI_EXPORT_JOBS", "1")
    # Precision repair (--repair auto, the default) searches for a passing variant of every rejected
    # quantized build: minutes across the suite's deliberately rejected builds. Off unless a test asks
    # for it (tests/test_pipeline.py's repair test passes --repair auto).
    os.environ.setdefault("OMNI_EXPORT_REPAIR", "off")
    return root


def shared_once(tmp_path_factory, name: str, make) -> Path:
    """`make(path)` once per test session, across the xdist workers: the first worker to ask makes it
    under a file lock, the others wait and reuse it (a session fixture is otherwise made once per
    worker; the fp16 build below took ~90 s on each). Read-only for the tests: copy before changing."""
    import os
    import shutil

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    with FileLock(str(root / f"{name}.lock")):
        done = root / f"{name}.done"
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            make(path)
            done.touch()
    return path


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny graphs run op by op (see the xdist note above)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from omni_export.recipes.qwen3_tts import checkpoint as ck

    return shared_once(tmp_path_factory, "ckpt-tiny", lambda p: ck.write_checkpoint(p, seed=0))


def golden_tool(name: str):
    """tools/golden/<name>.py as a module: the tests write the checkpoints its goldens were made on with
    its own writer (its module level imports only the standard library and omni_export)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "golden" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upstream_base_checkpoint(root: Path, meta: dict, config_json: Path) -> Path:
    """The upstream-written tiny Base checkpoint of a golden's `meta`: our seeded tensors (upstream's
    save_pretrained wrote the same bytes: meta['tensors_equal_ours']), its EOS row biased as the
    golden's, and the config.json upstream wrote (`config_json`)."""
    import numpy as np
    from safetensors.numpy import load_file

    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from omni_export.weights import write_safetensors

    assert meta["tensors_equal_ours"]
    d = ck.write_checkpoint(root / "base", seed=meta["seed"], size=meta["size"], kind=meta["kind"])
    st = load_file(d / "model.safetensors")
    st["talker.codec_head.weight"][2150] = st["talker.codec_head.weight"][meta["eos_row"]] * np.float32(1.3)
    write_safetensors(d / "model.safetensors", st)
    (d / "config.json").write_text(config_json.read_text())
    return d


_server = None


def run_cli(*args: str, check: bool = False, timeout: int = 900, env: dict | None = None,
            fresh: bool = False, kill_after: float | None = None) -> subprocess.CompletedProcess:
    """The CLI in a process of its own; `env` adds to (not replaces) this process's environment.
    Forked from a server that imported torch and ExecuTorch once (tests/cliserver.py), unless `fresh`
    (a new interpreter, as a user's shell starts it) or OMNI_EXPORT_TEST_FORK=0. `kill_after`: SIGKILL
    it after that many seconds (returncode -9) if it is still running."""
    import os

    global _server
    full_env = {**os.environ, **(env or {})}
    if not fresh and os.environ.get("OMNI_EXPORT_TEST_FORK", "1") != "0":
        if _server is None:
            import atexit

            from cliserver import Server

            _server = Server()
            atexit.register(_server.close)
        if _server.ok:
            proc = _server.run(args, ROOT, full_env, timeout, kill_after)
            if check and proc.returncode != 0:
                raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}")
            return proc
    if kill_after is not None:
        p = subprocess.Popen([sys.executable, "-m", "omni_export.cli", *args], cwd=ROOT, env=full_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=kill_after)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)
    proc = subprocess.run([sys.executable, "-m", "omni_export.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return proc


def read_manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def builds_by(manifest: dict) -> dict:
    return {(b["component"], b["format"], b["precision"]): b for b in manifest["builds"]}


# Every format at fp16 on the fast geometry, no attribution: shared by the verify and
# reproducibility tests (read-only: copy it before changing anything).
ALL_FORMATS_FP16 = ["qwen3-tts", "--target", "s25-htp", "--formats", "onnx,dlc,ctx,pte", "--precision", "fp16",
                    "--no-attribution", "-q", *FAST]


@pytest.fixture(scope="session")
def fp16_build(tmp_path_factory, tiny_checkpoint) -> Path:
    return shared_once(tmp_path_factory, "fp16_build", lambda p: run_cli(      # on worker processes (one per core)
        *ALL_FORMATS_FP16, "--checkpoint", str(tiny_checkpoint), "--out", str(p), check=True,
        env={"OMNI_EXPORT_JOBS": "0"}))


@pytest.fixture(scope="module")
def ray_cluster():
    """Ray's own multi-node test cluster on this machine: a head and one more raylet, one CPU each,
    loopback only (ray.cluster_utils.Cluster)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20,
                                                       "include_dashboard": False})
    c.add_node(num_cpus=1, object_store_memory=80 << 20)
    c.wait_for_nodes()
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


# The longest files first: with --dist loadfile each file runs on one worker, so a long file
# scheduled last leaves the other worker idle (the last suite ended with ~5 minutes of one worker
# alone). Measured durations of the slowest files, longest first; the rest keep their order.
LONGEST_FIRST = ("test_crash.py", "test_qwen3_tts_build.py", "test_pipeline.py", "test_reproducibility.py",
                 "test_cache.py", "test_minicpm_o.py", "test_spark.py", "test_hub.py")
# ...and these last: they read a build another early file makes (shared_once), which is then done
# instead of being waited for
LAST = ("test_verify.py",)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    rank.update({name: len(LONGEST_FIRST) + 1 + i for i, name in enumerate(LAST)})
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))   # stable: in-file order kept
