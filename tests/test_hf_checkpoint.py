"""--checkpoint ORG/NAME[@REVISION] through huggingface_hub, against a local fake of the Hub's API
(tests/fake_hf_hub.py; no network): fetched into the HF cache without pickles, used as the directory
would be, read from the cache offline, and one-line errors that leave no output directory behind."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_cli
from fake_hf_hub import COMMIT, FakeHub, repo_from_dir

IDS = "268,263,10,72,105,32,116,104,101,114,101,46,269,10,268,263,10"


@pytest.fixture(scope="module")
def hub(tiny_checkpoint):
    h = FakeHub({"org/tiny": repo_from_dir(tiny_checkpoint, {"pytorch_model.bin": b"\x80\x04pickle",
                                                             "optimizer.pt": b"\x80\x04pickle"})})
    yield h
    h.close()


def _env(hub, home, offline=False) -> dict:
    # a new interpreter per run (fresh=True): huggingface_hub reads HF_ENDPOINT when it is imported
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1" if offline else "0",
            "HF_HUB_DISABLE_TELEMETRY": "1"}


def _codes(checkpoint: str, out, env: dict):
    proc = run_cli("synth", "qwen3-tts", "--checkpoint", checkpoint, "--text-ids", IDS, "--greedy",
                   "--max-frames", "4", "--codes-out", str(out), env=env, fresh=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.load(out)


def test_a_checkpoint_by_name_is_fetched_without_pickles_and_then_read_offline(hub, tiny_checkpoint, tmp_path):
    home = tmp_path / "hf"
    local = _codes(str(tiny_checkpoint), tmp_path / "local.npy", {})
    fetched = _codes("org/tiny", tmp_path / "hub.npy", _env(hub, home))
    assert np.array_equal(fetched, local)
    snap = home / "hub" / "models--org--tiny" / "snapshots" / COMMIT
    got = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())
    assert got == sorted(repo_from_dir(tiny_checkpoint))                 # every file the loaders read ...
    assert not [r for r in hub.served if r[1].endswith((".bin", ".pt"))]  # ... and no pickle asked for
    n = len(hub.served)
    for name in ("org/tiny", f"org/tiny@{COMMIT}"):                     # main, as fetched; the commit
        offline = _codes(name, tmp_path / "offline.npy", _env(hub, home, offline=True))
        assert np.array_equal(offline, local) and len(hub.served) == n   # the cache alone


@pytest.mark.parametrize("name, message", [
    ("org/nope", "--checkpoint org/nope: no such Hugging Face repository (or it is private: log in with "
                 "`hf auth login`), and no such local directory"),
    ("org/tiny@v9", "--checkpoint org/tiny@v9: org/tiny has no revision 'v9'"),
])
def test_a_name_the_hub_does_not_have_is_one_line_and_leaves_no_output_directory(hub, tmp_path, name, message):
    out = tmp_path / "out"
    proc = run_cli("qwen3-tts", "--checkpoint", name, "--out", str(out), env=_env(hub, tmp_path / "hf"), fresh=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"omni-export: error: {message}"
    assert not out.exists()


def test_offline_without_the_cache_says_what_to_download(hub, tmp_path):
    out, asked = tmp_path / "out", len(hub.served)
    proc = run_cli("qwen3-tts", "--checkpoint", "org/tiny", "--out", str(out),
                   env=_env(hub, tmp_path / "hf", offline=True), fresh=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("omni-export: error: --checkpoint org/tiny: not in the Hugging Face cache (")
    assert "HF_HUB_OFFLINE is set" in line and "`hf download org/tiny --include '*.safetensors'" in line
    assert not out.exists() and len(hub.served) == asked                 # offline: the Hub is never asked
