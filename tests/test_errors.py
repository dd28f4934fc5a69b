"""Every bad input of docs/errors.md, through the command line as users meet it: the exact one-line
message, exit code 2, no traceback. (Flag errors -- unknown target, precision, format, component,
gate, rewrite, a precision the target cannot run -- are in test_cli.py.)"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import FAST, GEOMETRY, ROOT, run_cli
from omni_export.weights import write_safetensors

ST = "speech_tokenizer"


@pytest.fixture
def ck(tmp_path, tiny_checkpoint) -> Path:
    """A private copy of the tiny checkpoint to break."""
    d = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, d)
    return d


def weights(ck: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(ck / ST / "model.safetensors")


def fails_with(args: list, message: str, tmp_path: Path, code: int = 2) -> None:
    out = tmp_path / "out"
    proc = run_cli("qwen3-tts", "--out", str(out), *FAST, *[str(a) for a in args])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert lines[-1] == f"omni-export: error: {message}", lines[-1]
    # lines before ours can only be library warnings (torch FutureWarnings), never ours
    assert all("omni-export" not in line for line in lines[:-1])


# ------------------------------------------------------------------------------ the checkpoint

def test_missing_config_json(tmp_path, ck):
    (ck / "config.json").unlink()
    fails_with(["--checkpoint", ck], f"missing {ck}/config.json (model config); a Qwen3-TTS checkpoint has "
               f"config.json and speech_tokenizer/config.json", tmp_path)


def test_config_that_is_not_json(tmp_path, ck):
    (ck / "config.json").write_text("{model_type: qwen3_tts")
    fails_with(["--checkpoint", ck], f"{ck}/config.json: not valid JSON (Expecting property name enclosed in "
               f"double quotes: line 1 column 2 (char 1))", tmp_path)


def test_config_of_another_model_type(tmp_path, ck):
    (ck / "config.json").write_text(json.dumps({"model_type": "llama"}))
    fails_with(["--checkpoint", ck], f"{ck}/config.json: model_type is 'llama', expected 'qwen3_tts'; this is not "
               f"a Qwen3-TTS 12Hz checkpoint: point --checkpoint at one (e.g. Qwen3-TTS-12Hz-0.6B-CustomVoice)",
               tmp_path)


def test_speech_tokenizer_config_of_another_type(tmp_path, ck):
    cfg = json.loads((ck / ST / "config.json").read_text())
    cfg["model_type"] = "mimi"
    (ck / ST / "config.json").write_text(json.dumps(cfg))
    fails_with(["--checkpoint", ck], f"{ck}/{ST}/config.json: model_type is 'mimi', expected "
               f"'qwen3_tts_tokenizer_12hz'; this is not a Qwen3-TTS 12Hz checkpoint: point --checkpoint at "
               f"one (e.g. Qwen3-TTS-12Hz-0.6B-CustomVoice)", tmp_path)


def test_bad_value_in_decoder_config(tmp_path, ck):
    cfg = json.loads((ck / ST / "config.json").read_text())
    cfg["decoder_config"]["num_hidden_layers"] = "two"
    (ck / ST / "config.json").write_text(json.dumps(cfg))
    fails_with(["--checkpoint", ck], f'{ck}/{ST}/config.json: decoder_config.num_hidden_layers must be an '
               f'integer, got "two"', tmp_path)


def test_missing_speech_tokenizer(tmp_path, ck):
    shutil.rmtree(ck / ST)
    fails_with(["--checkpoint", ck], f"{ck}: missing speech_tokenizer/ (the Code2Wav vocoder); download the "
               f"whole Qwen3-TTS checkpoint", tmp_path)


def test_checkpoint_path_is_a_file(tmp_path, ck):
    fails_with(["--checkpoint", ck / "config.json"], f"--checkpoint {ck}/config.json is a file; pass the "
               f"checkpoint directory (holding config.json and speech_tokenizer/)", tmp_path)


def test_tensor_missing_is_named(tmp_path, ck):
    t = weights(ck)
    del t["decoder.pre_conv.conv.weight"]
    write_safetensors(ck / ST / "model.safetensors", t)
    fails_with(["--checkpoint", ck], f"{ck}/{ST}/model.safetensors: tensor 'decoder.pre_conv.conv.weight' is "
               f"missing; is this the right checkpoint for this recipe?", tmp_path)


def test_tensor_of_wrong_shape_is_named_with_both_shapes(tmp_path, ck):
    t = weights(ck)
    t["decoder.pre_conv.conv.bias"] = np.zeros(7, np.float32)
    write_safetensors(ck / ST / "model.safetensors", t)
    fails_with(["--checkpoint", ck], f"{ck}/{ST}/model.safetensors: tensor 'decoder.pre_conv.conv.bias' has "
               f"shape [7], expected [24] from the config", tmp_path)


def test_truncated_safetensors(tmp_path, ck):
    p = ck / ST / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:-1000])
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    first_cut = next(k for k, v in header.items() if k != "__metadata__"
                     and v["data_offsets"][1] > len(data) - 1000 - 8 - n)
    fails_with(["--checkpoint", ck], f"{p}: tensor '{first_cut}' lies outside the file or has the wrong size "
               f"(truncated or corrupted download?)", tmp_path)


def test_file_cut_inside_the_header(tmp_path, ck):
    p = ck / ST / "model.safetensors"
    p.write_bytes(p.read_bytes()[:5])
    fails_with(["--checkpoint", ck], f"{p}: not a readable safetensors file (file shorter than the 8-byte "
               f"header length); truncated or corrupted download?", tmp_path)


def test_corrupted_header_bytes(tmp_path, ck):
    p = ck / ST / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[8:16] = b"garbage!"
    p.write_bytes(bytes(data))
    fails_with(["--checkpoint", ck], f"{p}: not a readable safetensors file (Expecting value: line 1 column 1 "
               f"(char 0)); truncated or corrupted download?", tmp_path)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_in_weights(tmp_path, ck, bad):
    t = weights(ck)
    t["decoder.pre_conv.conv.weight"][0, 0, 0] = bad
    t["decoder.pre_conv.conv.weight"][1, 2, 0] = bad
    write_safetensors(ck / ST / "model.safetensors", t)
    fails_with(["--checkpoint", ck], f"{ck}/{ST}/model.safetensors: tensor 'decoder.pre_conv.conv.weight' holds "
               f"2 NaN/Inf values; the checkpoint is corrupt", tmp_path)


PICKLE_WHY = "omni-export never unpickles (a pickle can run code)"


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt"])
def test_pickle_checkpoint_is_refused(tmp_path, ck, name):
    p = ck / ST / "model.safetensors"
    p.rename(ck / ST / name)
    fails_with(["--checkpoint", ck], f"{ck}/{ST}/{name} is a pickle checkpoint; {PICKLE_WHY}. Convert it to "
               f"safetensors (e.g. save_pretrained(..., safe_serialization=True))", tmp_path)


def test_pickle_named_safetensors_is_refused_unread(tmp_path, ck):
    p = ck / ST / "model.safetensors"
    # a pickle whose loading would run code: it must never be loaded, only recognised
    p.write_bytes(pickle.dumps(("os.system", "touch " + str(tmp_path / "pwned")), protocol=4))
    fails_with(["--checkpoint", ck], f"{p} is a pickle / torch.save archive named .safetensors; {PICKLE_WHY}. "
               f"Convert it to real safetensors", tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_checkpoint_given_as_a_pickle_file(tmp_path, ck):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\x80\x04pickle")
    fails_with(["--checkpoint", f], f"{f} is a pickle checkpoint; {PICKLE_WHY}. Pass a checkpoint directory "
               f"with safetensors weights", tmp_path)


# ------------------------------------------------------------------- symlinks in the checkpoint

def test_weight_symlink_to_a_fifo_is_refused_without_blocking(tmp_path, ck):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = ck / ST / "model.safetensors"
    p.unlink()
    p.symlink_to(fifo)
    fails_with(["--checkpoint", ck], f"weight file {p} is not a regular file", tmp_path)


def test_dangling_weight_symlink(tmp_path, ck):
    p = ck / ST / "model.safetensors"
    p.unlink()
    p.symlink_to(tmp_path / "gone.safetensors")
    fails_with(["--checkpoint", ck], f"weight file {p} is a broken symlink", tmp_path)


def test_weight_symlinked_outside_the_checkpoint_is_followed_and_recorded(tmp_path, ck):
    """The Hugging Face cache links snapshot files to blobs/ outside the snapshot: allowed, and the
    manifest records where the bytes came from."""
    blob = tmp_path / "blobs" / "abc123"
    blob.parent.mkdir()
    p = ck / ST / "model.safetensors"
    shutil.move(p, blob)
    p.symlink_to(blob)
    out = tmp_path / "out"
    proc = run_cli("qwen3-tts", "--checkpoint", str(ck), "--out", str(out), "--formats", "onnx", "--precision",
                   "fp16", "--components", "text_projection", "--no-attribution", "-q", *GEOMETRY)
    assert proc.returncode == 0, proc.stderr[-2000:]
    weights = json.loads((out / "manifest.json").read_text())["checkpoint"]["weights"]
    (w,) = [w for w in weights if w["path"] == f"{ST}/model.safetensors"]
    assert w["resolved"] == str(blob.resolve()) and w["outside_checkpoint"] is True
    assert not any(w.get("outside_checkpoint") for w in weights if w["path"] != f"{ST}/model.safetensors")
    assert sorted(p.name for p in out.iterdir()) == [".lock", "bundle", "manifest.json", "parity-inputs", "parity.json",
                                                     "qwen3-tts-text_projection-fp16-s25-htp.onnx", "report.html",
                                                     "report.md"]


# ------------------------------------------------------------------------------ calibration

def _codes(tmp_path, array) -> Path:
    f = tmp_path / "codes.npy"
    np.save(f, array)
    return f


@pytest.mark.parametrize("array,message", [
    (np.zeros((10, 8), np.int64), "expected shape [frames, 16], got [10, 8]"),
    (np.zeros((10,), np.int64), "expected shape [frames, 16], got [10]"),
    (np.zeros((0, 16), np.int64), "holds no frames (shape [0, 16])"),
    (np.zeros((10, 16), np.float32), "codes must be integers in [0, 2048), got dtype float32"),
    (np.full((10, 16), 2048, np.int64), "codes must be integers in [0, 2048), found values in [2048, 2048]"),
    (np.full((10, 16), -1, np.int32), "codes must be integers in [0, 2048), found values in [-1, -1]"),
])
def test_calibration_codes_of_wrong_shape_dtype_or_range(tmp_path, tiny_checkpoint, array, message):
    f = _codes(tmp_path, array)
    fails_with(["--checkpoint", tiny_checkpoint, "--calibration-codes", f], f"--calibration-codes {f}: {message}",
               tmp_path)


def test_calibration_codes_pickled_object_array_is_not_loaded(tmp_path, tiny_checkpoint):
    f = _codes(tmp_path, np.array([{"a": 1}], dtype=object))
    fails_with(["--checkpoint", tiny_checkpoint, "--calibration-codes", f],
               f"--calibration-codes {f}: not a readable .npy (Object arrays cannot be loaded when "
               f"allow_pickle=False); save codes with numpy.save (pickled object arrays are never loaded)", tmp_path)


def test_calibration_codes_npz_and_missing(tmp_path, tiny_checkpoint):
    f = tmp_path / "codes.npz"
    np.savez(f, a=np.zeros((4, 16), np.int64))
    fails_with(["--checkpoint", tiny_checkpoint, "--calibration-codes", f],
               f"--calibration-codes {f}: is an .npz archive; pass one .npy per sequence (or a directory of them)",
               tmp_path)
    gone = tmp_path / "nope.npy"
    fails_with(["--checkpoint", tiny_checkpoint, "--calibration-codes", gone],
               f"--calibration-codes {gone} does not exist; pass a .npy of codes [frames, 16] or a directory of "
               f"them", tmp_path)


def test_empty_calibration_directory(tmp_path, tiny_checkpoint):
    d = tmp_path / "codes"
    d.mkdir()
    fails_with(["--checkpoint", tiny_checkpoint, "--calibration-codes", d],
               f"--calibration-codes {d}: no .npy files in the directory", tmp_path)


def test_too_small_calibration_set_for_a_quantized_build(tmp_path, tiny_checkpoint):
    f = _codes(tmp_path, np.zeros((3, 16), np.int64))          # 3 frames, chunks of 2: 2 windows
    fails_with(["--checkpoint", tiny_checkpoint, "--calibration-codes", f, "--precision", "w8a16",
                "--formats", "onnx"],
               "code2wav: calibration set has 2 samples; quantized builds need at least 4 real inputs", tmp_path)


def test_bad_streaming_geometry(tmp_path, tiny_checkpoint):
    fails_with(["--checkpoint", tiny_checkpoint, "--chunk-frames", "0"],
               "Invalid value for '--chunk-frames': 0 is not in the range 1<=x<=250.", tmp_path)


def test_bad_chunk_schedule(tmp_path, tiny_checkpoint):
    fails_with(["--checkpoint", tiny_checkpoint, "--chunk-schedule", "1,x"],
               "--chunk-schedule takes comma-separated new-frame counts in 1..250 (e.g. 1,2,4,8) or none; got '1,x'",
               tmp_path)


# --------------------------------------------------------------------------- the output directory

def test_output_dir_root_cannot_create(tmp_path, tiny_checkpoint):
    proc = run_cli("qwen3-tts", "--checkpoint", str(tiny_checkpoint), "--out", "/proc/omni-export/out", *FAST)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("omni-export: error: output directory /proc/omni-export/out is not writable "
                                   "(No such file or directory); choose another --out")


def test_output_dir_whose_parent_is_a_file(tmp_path, tiny_checkpoint):
    f = tmp_path / "file"
    f.write_text("x")
    proc = run_cli("qwen3-tts", "--checkpoint", str(tiny_checkpoint), "--out", str(f / "out"), *FAST)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"omni-export: error: output directory {f}/out is not writable (Not a "
                                   f"directory); choose another --out")


def _fake_build(out: Path, recipe: str, target: str) -> None:
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"tool": "omni-export", "recipe": {"name": recipe},
                                                   "target": {"name": target}, "builds": []}))


@pytest.mark.parametrize("recipe,target", [("whisper", "s25-htp"), ("qwen3-tts", "cpu")])
def test_output_dir_holding_another_build_needs_force(tmp_path, tiny_checkpoint, recipe, target):
    _fake_build(tmp_path / "out", recipe, target)
    fails_with(["--checkpoint", tiny_checkpoint], f"{tmp_path}/out holds a build of {recipe} for {target}; "
               f"choose another --out or pass --force to replace it", tmp_path)


def test_output_dir_with_unrelated_files_needs_force(tmp_path, tiny_checkpoint):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    fails_with(["--checkpoint", tiny_checkpoint], f"{tmp_path}/out is not empty and holds no omni-export build "
               f"(found notes.txt); choose a new or empty --out, or pass --force (omni-export never removes "
               f"files it did not write)", tmp_path)


# ------------------------------------------------------------------------------------ disk full

def test_disk_full_while_writing_is_one_line_and_marks_the_output_incomplete(tmp_path, tiny_checkpoint,
                                                                              monkeypatch):
    """ENOSPC injected in the store's write path, in-process (the same run() the CLI calls)."""
    import errno

    from omni_export.artifacts import store as store_mod
    from omni_export.core import UsageError
    from omni_export.pipeline import RunOptions, run
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    write = store_mod.atomic_write_bytes

    def full(path, data):                           # the marker still fits; the first artifact does not
        if path.suffix == ".npz":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, data)

    monkeypatch.setattr(store_mod, "atomic_write_bytes", full)
    out = tmp_path / "out"
    opts = RunOptions(recipe=get_recipe("qwen3-tts"), target=get_target("s25-htp"), out=out,
                      checkpoint=tiny_checkpoint, components=("code2wav",),
                      recipe_options={"left-context": 2, "chunk-frames": 2}, attribution=False, jobs=1)
    with pytest.raises(UsageError) as e:
        run(opts)
    assert str(e.value) == (f"disk full while writing {out}/parity-inputs/code2wav.npz; free space and rerun "
                            f"({out} is marked incomplete)")
    assert (out / ".incomplete").exists() and not (out / "manifest.json").exists()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_disk_full_on_a_real_small_filesystem(tmp_path, tiny_checkpoint):
    """A 1 MB tmpfs: the 1.8 MB ONNX export hits ENOSPC inside the exporter; the run stops (it is not
    recorded as a rejected build) with one line, exit 2, and a marked-incomplete output."""
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "1m"):
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN); the in-process test covers it")
    try:
        out = mnt / "out"
        proc = run_cli("qwen3-tts", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--formats", "onnx",
                       "--precision", "fp16", "--no-attribution", "--jobs", "1", "-q", *FAST)
        assert proc.returncode == 2, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"omni-export: error: disk full while writing {out}")
        assert last.endswith(f"free space and rerun ({out} is marked incomplete)")
        assert "Traceback" not in proc.stderr
        assert (out / ".incomplete").exists() and not (out / "manifest.json").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# --------------------------------------------------------------------------------- interrupted

def test_sigint_is_one_line_exit_130_and_marks_the_output_incomplete(tmp_path, tiny_checkpoint):
    import signal
    import time

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "omni_export.cli", "qwen3-tts", "--checkpoint", str(tiny_checkpoint),
           "--out", str(out), "--formats", "onnx,ctx", "--precision", "fp16", "--no-attribution", "--jobs", "2",
           "-q", *FAST]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "parity-inputs").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)                                 # wait until the run has written into OUT
    time.sleep(1.0)
    sent = time.time()
    alive = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert alive, f"the run ended before SIGINT was sent (exit {proc.returncode}; parity-inputs written: " \
                  f"{(out / 'parity-inputs').exists()}): nothing was interrupted"
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f"omni-export: error: interrupted; {out} is marked "
                                                   f"incomplete (.incomplete)")
    assert "Traceback" not in err
    assert time.time() - sent < 30                      # no waiting for simulator jobs nobody will read
    assert (out / ".incomplete").exists() and not (out / "manifest.json").exists()


def test_a_ctrl_c_python_drops_in_a_finalizer_still_stops_the_run_at_the_next_stage():
    """SIGINT arriving while a finalizer runs raises KeyboardInterrupt inside it, and Python drops it
    ("Exception ignored in ..."): the run went on and exited 0 (the SIGINT test above, three times
    under load). Latched, the next stage boundary raises it again, and nothing is printed for the
    dropped one."""
    import gc
    import os
    import signal
    import time

    from omni_export import faults
    from omni_export.progress import InterruptPoints as _InterruptPoints, Progress

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)     # the handler runs here, inside the finalizer
            time.sleep(0.05)

    before = signal.getsignal(signal.SIGINT)           # an xdist worker ignores SIGINT; pytest alone does not
    progress = _InterruptPoints(Progress())
    dropped = []
    hook, sys.unraisablehook = sys.unraisablehook, dropped.append     # what Python would print
    try:
        with faults.interrupts_latched():
            with progress.stage("first"):
                pass
            Finalized()
            gc.collect()                           # got here: the KeyboardInterrupt was dropped
            with pytest.raises(KeyboardInterrupt):
                with progress.stage("next"):
                    pytest.fail("the stage after a Ctrl-C ran")
    finally:
        sys.unraisablehook = hook
    assert dropped == []
    faults.interrupt_point()                       # outside the latch nothing is remembered
    assert signal.getsignal(signal.SIGINT) is before       # the latch put back what it found


# ----------------------------------------------------------------------------- the command line

def test_unknown_recipe_lists_the_valid_ones(tmp_path):
    proc = run_cli("whisper-xl", "--target", "s25-htp")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("omni-export: error: unknown recipe 'whisper-xl'; valid: qwen3-tts, minicpm-o, "
                                   "spark (other commands: bundle, diff, hub, latency, list, parity, report, synth, verify)")


def test_click_usage_errors_are_one_line_too():
    proc = run_cli("qwen3-tts", "--left-context", "many")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("omni-export: error: Invalid value for '--left-context': 'many' is not a "
                                   "valid integer range.")


def test_synth_names_why_a_build_has_no_graph_to_run(tmp_path):
    """`synth --build OUT --runner R [--precision P]` on a build without a runnable graph says which:
    rejected (with the gate's reason), not built at that precision, or a format the target never
    builds -- and what in this build would run instead."""
    from omni_export.core import UsageError
    from omni_export.runtime.graphs import BuildGraphs

    def build(fmt, prec, status, reason=None):
        return {"component": "prefill", "format": fmt, "precision": prec, "status": status,
                "files": [{"path": f"x-{prec}.{fmt}", "bytes": 1}],
                "parity": {"reason": reason or "min 50.0 dB >= gate 40 dB"}}

    m = {"target": {"name": "cpu", "soc_model": None, "htp_arch": None}, "options": {},
         "components": {"prefill": {"inputs": [{"name": "ids"}], "outputs": [{"name": "logits"}]}},
         "builds": [build("onnx", "fp32", "accepted"), build("onnx", "fp16", "accepted"),
                    build("pte", "fp16", "accepted"),
                    build("pte", "w8a8", "rejected", "output 'hidden' 14.8 dB < gate 30 dB")]}

    def message(runner, precision=None, graph="prefill"):
        with pytest.raises(UsageError) as e:
            BuildGraphs(tmp_path, runner, precision, manifest=m)(graph, {})
        return str(e.value)

    assert message("pte", "w8a8") == (
        "the build has no usable 'prefill' graph for --runner pte: pte w8a8 rejected (output 'hidden' 14.8 dB "
        "< gate 30 dB); accepted pte precisions: fp16 (--precision fp16); runners with an accepted 'prefill' "
        "here: --runner ort")
    assert message("ort", "w8a16") == (
        "the build has no usable 'prefill' graph for --runner ort: no onnx build of it at w8a16; accepted onnx "
        "precisions: fp32, fp16 (--precision fp32); runners with an accepted 'prefill' here: --runner pte")
    assert message("htp") == (
        "the build has no usable 'prefill' graph for --runner htp: the build made no ctx build of it (target "
        "cpu, formats onnx, pte); runners with an accepted 'prefill' here: --runner ort, --runner pte")
    assert message("ort", graph="decode") == (
        "the build has no usable 'decode' graph for --runner ort: it did not build that component (it built "
        "prefill); rebuild with it in --components")
