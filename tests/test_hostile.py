"""Hostile inputs and racing runs (issue 34): nothing escapes OUT, one writer per OUT."""
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_export.artifacts.store import Store
from omni_export.core import UsageError


def _tree_digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        h.update(str(p.relative_to(d)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _decoy(tmp_path: Path) -> Path:
    d = tmp_path / "decoy"
    (d / "x.onnx").mkdir(parents=True)
    (d / "x.onnx" / "keep.txt").write_text("the user's")
    (d / "other.txt").write_text("the user's too")
    return d


def test_a_symlinked_staging_directory_is_replaced_never_followed(tmp_path):
    decoy = _decoy(tmp_path)
    before = _tree_digest(decoy)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".staging").symlink_to(decoy, target_is_directory=True)
    st = Store(out)
    st.begin("r", "t", force=False)
    f = st.staging("x.onnx") / "x.onnx"
    f.write_bytes(b"abc")
    rec = st.commit([f], accepted=True)
    st.finish({"tool": "omni-export", "recipe": {"name": "r"}, "target": {"name": "t"},
               "builds": [{"files": [r.to_json() for r in rec]}], "components": {}})
    assert _tree_digest(decoy) == before
    assert (out / "x.onnx").read_bytes() == b"abc" and not (out / ".staging").exists()


def test_a_staging_link_planted_during_a_run_is_not_followed(tmp_path):
    decoy = _decoy(tmp_path)
    before = _tree_digest(decoy)
    out = tmp_path / "out"
    st = Store(out)
    st.begin("r", "t", force=False)
    (out / ".staging").symlink_to(decoy, target_is_directory=True)
    f = st.staging("x.onnx") / "x.onnx"
    f.write_bytes(b"abc")
    st.abort()
    assert _tree_digest(decoy) == before


HOLD = """
import sys, time
from pathlib import Path
from omni_export.artifacts.store import Store
st = Store(Path(sys.argv[1]))
st.begin("r", "t", force=False)
print("holding", flush=True)
time.sleep(120)
"""


def test_a_second_run_into_the_same_out_stops_at_once_and_takes_over_once_the_holder_died(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        t0 = time.monotonic()
        with pytest.raises(UsageError) as e:
            Store(out).begin("r", "t", force=False)
        assert time.monotonic() - t0 < 5
        msg = str(e.value)
        assert f"is being built by another omni-export run (pid {holder.pid} since" in msg and "\n" not in msg
        with pytest.raises(UsageError):                   # --force does not take a live run's OUT either
            Store(out).begin("r", "t", force=True)
    finally:
        holder.kill()
        holder.wait()
    st = Store(out)                                       # the kernel released the dead holder's lock
    st.begin("r", "t", force=False)
    assert st.recovered is not None and st.recovered["pid"] == holder.pid      # and its run is resumed
    st.abort()


def test_a_lock_file_that_is_a_symlink_is_refused(tmp_path):
    decoy = _decoy(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(decoy / "other.txt")
    with pytest.raises(UsageError, match=r"\.lock cannot be opened as the output directory's lock file"):
        Store(out).begin("r", "t", force=False)
    assert (decoy / "other.txt").read_text() == "the user's too"


def test_two_builds_started_together_into_one_out_one_runs_the_other_exits_2_at_once(tmp_path, tiny_checkpoint):
    from conftest import GEOMETRY, ROOT, run_cli

    out = tmp_path / "out"
    args = ["qwen3-tts", "--target", "s25-htp", "--checkpoint", str(tiny_checkpoint), "--out", str(out),
            "--components", "text_projection", "--formats", "onnx", "--precision", "fp16", "--no-attribution",
            "-q", *GEOMETRY]
    first = subprocess.Popen([sys.executable, "-m", "omni_export.cli", *args], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out / ".incomplete").exists():          # written once it holds OUT's lock
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = run_cli(*args, timeout=60)
        assert second.returncode == 2, second.stderr
        err = second.stderr.strip()
        assert "\n" not in err and f"is being built by another omni-export run (pid {first.pid} since" in err
        assert "Traceback" not in second.stderr
    finally:
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-2000:]
    assert run_cli("verify", str(out)).returncode == 0


def _strict(text: str):
    import json

    def refuse(word):
        raise ValueError(f"not JSON: bare {word}")
    return json.loads(text, parse_constant=refuse)


def test_the_manifest_parity_json_and_the_marker_are_strict_json(fp16_build, tmp_path):
    """Bare Infinity / NaN is not JSON (jq, JSON.parse and most CI tools reject it): a demo build's
    manifest held 14 of them (a rewrite's fp32 SNR is inf when it is exact)."""
    import json
    import math

    from omni_export.artifacts.store import atomic_write_json
    from omni_export.artifacts.scores import num

    m = _strict((fp16_build / "manifest.json").read_text())
    _strict((fp16_build / "parity.json").read_text())
    words = [r["fp32_snr_db"] for c in m["components"].values() for r in c.get("rewrites", [])]
    assert words and all(isinstance(w, (int, float)) or w in ("inf", "-inf", "nan") for w in words)
    p = tmp_path / "m.json"
    atomic_write_json(p, {"snr_db": math.nan, "x": [math.inf, -math.inf, 1.5]})
    back = _strict(p.read_text())
    assert back == {"snr_db": "nan", "x": ["inf", "-inf", 1.5]} and math.isnan(num(back["snr_db"]))
    assert json.loads(p.read_text())["x"][2] == 1.5


@pytest.mark.parametrize("args, message", [
    (["--context-length", "1000000000"], "Invalid value for '--context-length': 1000000000 is not in the range 8<=x<=32768."),
    (["--context-length", "0"], "Invalid value for '--context-length': 0 is not in the range 8<=x<=32768."),
    (["--left-context", "100000"], "Invalid value for '--left-context': 100000 is not in the range 0<=x<=250."),
    (["--chunk-frames", "100000"], "Invalid value for '--chunk-frames': 100000 is not in the range 1<=x<=250."),
    (["--max-memory", "nan"], "Invalid value for '--max-memory': 'nan' is not a positive, finite number of GB (at most 1e6)"),
    (["--max-memory", "inf"], "Invalid value for '--max-memory': 'inf' is not a positive, finite number of GB (at most 1e6)"),
    (["--jobs", "-1"], "Invalid value for '--jobs' / '-j': -1 is not in the range 0<=x<=1024."),
    (["--gate", "fp16=45,fp16=10"], "--gate names fp16 twice (fp16=45 and 'fp16=10'); give each precision one gate"),
])
def test_every_number_has_a_range(args, message, tmp_path):
    from conftest import run_cli

    proc = run_cli("qwen3-tts", "--out", str(tmp_path / "out"), *args, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"omni-export: error: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, kind", [("merges.txt", "fifo"), ("vocab.json", "zero"),
                                        ("tokenizer_config.json", "zero"), ("vocab.json", "dir")])
def test_a_checkpoint_side_file_that_is_not_a_regular_file_is_refused_before_it_is_read(name, kind, tmp_path,
                                                                                         tiny_checkpoint):
    """vocab.json -> /dev/zero grew memory without bound, tokenizer_config.json -> /dev/zero died in a
    MemoryError traceback, merges.txt as a FIFO hung forever."""
    import shutil

    from conftest import GEOMETRY, run_cli

    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck, symlinks=True)
    (ck / name).unlink()
    if kind == "fifo":
        os.mkfifo(ck / name)
    elif kind == "zero":
        (ck / name).symlink_to("/dev/zero")
    else:
        (ck / name).mkdir()
    proc = run_cli("qwen3-tts", "--checkpoint", str(ck), "--out", str(tmp_path / "out"), "--components", "code2wav",
                   *GEOMETRY, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"omni-export: error: tokenizer file {ck / name} is not a regular file"


def test_a_side_file_past_its_bound_is_refused(tmp_path):
    from omni_export.weights import SIDE_FILE_BYTES, read_side_file

    f = tmp_path / "generation_config.json"
    with open(f, "wb") as fh:
        fh.truncate(SIDE_FILE_BYTES["generation config"] + 1)       # sparse: no disk used
    with pytest.raises(UsageError, match=r"generation config .* is 1048577 bytes; a generation config is at most 1 MiB"):
        read_side_file(f, "generation config")
    f.write_text('{"top_k": 50}')
    assert read_side_file(f, "generation config") == b'{"top_k": 50}'


def test_sigterm_says_what_it_kept_and_the_rerun_resumes_from_it(tmp_path, tiny_checkpoint):
    """SIGTERM (a CI timeout, `kill`) ends a build like Ctrl-C: one line naming the signal and the
    components OUT keeps, exit 143; the next run reuses those and builds the rest."""
    import json
    import signal

    from conftest import GEOMETRY, ROOT, run_cli

    out = tmp_path / "out"
    args = ["qwen3-tts", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--components",
            "text_projection,code2wav", "--formats", "onnx", "--precision", "fp16", "--no-attribution",
            "--jobs", "1", "-q", *GEOMETRY]
    proc = subprocess.Popen([sys.executable, "-m", "omni_export.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finished() -> list[str]:
        try:
            return sorted(json.loads((out / ".incomplete").read_text()).get("finished") or {})
        except (OSError, ValueError):
            return []

    deadline = time.monotonic() + 120
    while not finished() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    kept, alive = finished(), proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert alive and kept, f"nothing to interrupt (exit {proc.returncode}, finished {kept}): {err[-1500:]}"
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    from omni_export.artifacts.store import kept_jobs

    jobs = kept_jobs(out)          # finished jobs' outputs of the component not finished (jobs/results.py)
    also = f" and the outputs of {jobs} finished job{'s' if jobs != 1 else ''}" if jobs else ""
    assert err.strip().splitlines()[-1] == (
        f"omni-export: error: interrupted by SIGTERM; {out} is marked incomplete (.incomplete); the next run "
        f"keeps the finished {', '.join(kept)}{also} and rebuilds the rest")
    # the rerun: the graph it still builds breaks at run time (NaN outputs, as an fp16 overflow would)
    poisoned = "code2wav" if "code2wav" not in kept else "text_projection"
    again = run_cli(*args, timeout=300, env={"OMNI_EXPORT_NAN_OUTPUTS": poisoned})
    assert again.returncode == 3, again.stderr[-2000:]               # a component without an accepted build
    m = _strict((out / "manifest.json").read_text())                 # strict JSON with a NaN build in it
    _strict((out / "parity.json").read_text())
    assert set(kept) <= set(m["cache"]["reused_components"]) < {"text_projection", "code2wav"}
    nan = [b for b in m["builds"] if b["component"] == poisoned]
    assert nan and all(b["status"] == "rejected" and "NaN/Inf" in b["parity"]["reason"] for b in nan)
    assert run_cli("verify", str(out)).returncode == 0


def _safetensors(path: Path, header: bytes, data: bytes) -> Path:
    import struct

    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def test_a_safetensors_header_naming_a_tensor_twice_is_refused(tmp_path):
    from omni_export.weights import TensorDecl, load_tensors

    entry = '{"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}'
    f = _safetensors(tmp_path / "model.safetensors", f'{{"w": {entry}, "w": {entry}}}'.encode(), bytes(8))
    with pytest.raises(UsageError, match=r"model.safetensors: not a readable safetensors file \(the header names "
                                         r"'w' twice\)"):
        load_tensors(f, {"w": TensorDecl((2,))})


@pytest.mark.parametrize("dtype, data", [("I8", bytes(2)), ("BOOL", bytes(2)), ("I64", bytes(16))])
def test_integer_or_boolean_weights_are_refused_not_cast(dtype, data, tmp_path):
    import json

    from omni_export.weights import TensorDecl, load_tensors

    header = json.dumps({"w": {"dtype": dtype, "shape": [2], "data_offsets": [0, len(data)]}}).encode()
    f = _safetensors(tmp_path / "model.safetensors", header, data)
    with pytest.raises(UsageError, match=rf"tensor 'w' is stored as {dtype}; weights are read as floating point "
                                         r"\(F32, F16, BF16, F64\) and never cast"):
        load_tensors(f, {"w": TensorDecl((2,))})


def test_the_manifest_records_how_the_host_accumulates_fp16():
    """A fp16 .pte's score depends on the scoring CPU (XNNPACK: fp16 accumulation with AVX512-FP16
    and on phones, fp32 on other x86): every manifest keeps the CPU's model, flags and that mode."""
    from omni_export.artifacts.manifest import host
    from omni_export.cpu import xnnpack_fp16_accumulation

    h = host()
    assert {"cpu_model", "cpu_flags", "xnnpack_fp16_accumulation"} <= h.keys()
    assert h["xnnpack_fp16_accumulation"] == xnnpack_fp16_accumulation(set(h["cpu_flags"]), h["machine"])
    assert xnnpack_fp16_accumulation({"avx2", "avx512f", "avx512_fp16"}, "x86_64") == "fp16"
    assert xnnpack_fp16_accumulation({"avx2", "f16c"}, "x86_64") == "fp32"
    assert xnnpack_fp16_accumulation({"asimd", "asimdhp"}, "aarch64") == "fp16"


def test_committed_files_get_the_plain_file_mode_and_a_staged_link_is_not_followed(tmp_path):
    """QNN writes DLCs 0640: every artifact leaves with the mode of a file written under the umask;
    a link in staging is refused, never chmod-ed through."""
    from omni_export.artifacts.store import FILE_MODE

    outside = tmp_path / "outside.txt"
    outside.write_text("the user's")
    outside.chmod(0o600)
    out = tmp_path / "out"
    st = Store(out)
    st.begin("r", "t", force=False)
    f = st.staging("x.dlc") / "x.dlc"
    f.write_bytes(b"dlc")
    f.chmod(0o640)
    st.commit([f], accepted=True)
    assert (out / "x.dlc").stat().st_mode & 0o777 == FILE_MODE
    link = st.staging("y.dlc") / "y.dlc"
    link.symlink_to(outside)
    with pytest.raises(OSError):
        st.commit([link], accepted=True)
    assert outside.stat().st_mode & 0o777 == 0o600
    st.abort()
