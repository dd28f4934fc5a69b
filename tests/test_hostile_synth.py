"""Hostile inputs to `omni-export synth` (issue 34): token ids against the text vocabulary, a prompt
against the context, codes against the codebook, output paths that are directories, FIFOs or
devices, and a checkpoint without tokenizer files. Each is refused before any graph runs, in one
line `omni-export: error: ...` with exit 2 and no traceback; every case is bounded by a 60 s timeout
(a FIFO that were opened would hang the run instead)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import FAST, run_cli
from omni_export.core import UsageError

# Templated assistant ids in the tiny checkpoint's text vocabulary (0..273): >= 9 ids, as upstream's
# generate receives them. Only their range matters here.
IDS = "268,263,10,72,105,32,116,104,101,114,101,46,269,10,268,263,10"
TINY_VOCAB = "0..273"


def cli(*args, env: dict | None = None):
    return run_cli(*[str(a) for a in args], timeout=60, env=env)


def fails_with(args, message: str, env: dict | None = None, exit: int = 2) -> None:
    proc = cli(*args, env=env)
    assert proc.returncode == exit, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == f"omni-export: error: {message}", lines[-1]
    assert all("omni-export" not in line for line in lines[:-1])      # ours is the one line


def qwen3(ck, *args) -> list:
    return ["synth", "qwen3-tts", "--checkpoint", ck, "--greedy", "--max-frames", "2", *args]


# ------------------------------------------------------------------------------------ token ids

@pytest.mark.parametrize("args, message", [
    (["--text-ids", f"-7,{IDS}"], "--text-ids: -7 is outside the text vocabulary {vocab} of {ck}"),
    (["--text-ids", f"99999999,{IDS}"], "--text-ids: 99999999 is outside the text vocabulary {vocab} of {ck}"),
    (["--text-ids", f"{IDS},{10 ** 30}"], f"--text-ids: {10 ** 30} is outside the text vocabulary {{vocab}} of {{ck}}"),
    (["--text-ids", IDS, "--instruct-ids", "1,2,-3"], "--instruct-ids: -3 is outside the text vocabulary {vocab} of {ck}"),
    (["--text-ids", IDS, "--instruct-ids", "5,274"], "--instruct-ids: 274 is outside the text vocabulary {vocab} of {ck}"),
    (["--text-ids", "1,x"], "--text-ids takes comma-separated integers"),
    (["--text-ids", IDS, "--instruct-ids", "1;2"], "--instruct-ids takes comma-separated integers"),
])
def test_qwen3_token_ids_outside_the_text_vocabulary_are_refused(args, message, tiny_checkpoint, tmp_path):
    """-7 wrapped around to the table's last rows unseen; 99999999 was an IndexError in text_proj."""
    wav = tmp_path / "o.wav"
    fails_with(qwen3(tiny_checkpoint, *args, "--wav", wav), message.format(vocab=TINY_VOCAB, ck=tiny_checkpoint),
               exit=2)
    assert not wav.exists()


def test_qwen3_ids_of_the_demo_checkpoint_name_it_not_its_scratch_directory():
    fails_with(["synth", "qwen3-tts", "--text-ids", f"-1,{IDS}"],
               f"--text-ids: -1 is outside the text vocabulary {TINY_VOCAB} of the demo checkpoint", exit=2)


def test_a_tokenizer_that_gives_ids_past_the_vocabulary_is_named(tmp_path, tiny_checkpoint):
    """A tokenizer from another checkpoint: the user's text is not at fault, the files disagree."""
    import json

    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck)
    vocab = json.loads((ck / "vocab.json").read_text())
    vocab["z"] = 4000                   # moved to an id the text table does not have
    (ck / "vocab.json").write_text(json.dumps(vocab))
    fails_with(qwen3(ck, "--text", "z"), f"{ck}: the tokenizer gives id 4000 for --text but the text "
               f"vocabulary is {TINY_VOCAB}; tokenizer and weights do not belong together", exit=2)


# ------------------------------------------------------------------------------ the context

def test_qwen3_a_100000_character_text_is_refused_against_the_context(tiny_checkpoint):
    """It ended in a ContextFull traceback from the talker's prefill."""
    from omni_export.recipes.qwen3_tts.prompt import template_ids
    from omni_export.text_tokenizer import load

    text = "a " * 50_000
    n = len(template_ids(load(tiny_checkpoint), text))
    proc = cli(*qwen3(tiny_checkpoint, "--text", text))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"omni-export: error: --text: {n} tokens need ") and line.endswith(
        " talker positions with the prompt; the context holds 1024 (--context-length); shorten the text, or build "
        "with a larger --context-length (at most 32768) and synth --build it")
    need = int(line.split(" need ")[1].split()[0])
    assert need > n > 1024


def test_qwen3_streaming_counts_the_text_fed_after_the_prompt(tiny_checkpoint):
    """Streaming puts one text token in the prompt and feeds the rest a frame at a time: a text longer
    than the context would be cut off where it filled (stopped: context), so it is refused too."""
    proc = cli(*qwen3(tiny_checkpoint, "--text-mode", "streaming", "--text", "a " * 600))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "talker positions with the prompt; the context holds 1024" in proc.stderr.strip().splitlines()[-1]
    ok = cli(*qwen3(tiny_checkpoint, "--text-mode", "streaming", "--text", "a " * 20))
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_a_build_whose_context_cannot_hold_a_prompt_is_one_line(tmp_path, tiny_checkpoint):
    """The host's own check (its ContextFull from the prefill was a traceback): a build with the
    smallest --context-length cannot hold the recipe's calibration prompts."""
    out = tmp_path / "out"
    proc = cli("qwen3-tts", "--checkpoint", tiny_checkpoint, "--out", out, "--context-length", "8", *FAST,
               env={"OMNI_EXPORT_CAPTURE_CACHE": "off"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("omni-export: error: a talker prompt needs ") and line.endswith(
        "positions but the context holds 8; raise --context-length above " + line.split(" needs ")[1].split()[0] +
        " (each generated frame takes one more position)")


# ------------------------------------------------------------------------------- codes

@pytest.mark.parametrize("kind, message", [
    ("fifo", "--codes {f} is not a regular file"),
    ("zero", "--codes {f} is not a regular file"),
    ("dir", "Invalid value for '--codes': File '{f}' is a directory."),
    ("shape", "--codes {f}: expected shape [frames, 16], got [4, 8]"),
    ("range", "--codes {f}: codes must be integers in [0, 2048), found values in [-1, 2048]"),
    ("float", "--codes {f}: codes must be integers in [0, 2048), got dtype float32"),
    ("huge", "--codes {f}: not a readable .npy (Unable to allocate"),
])
def test_qwen3_codes_are_checked_and_named_as_codes(kind, message, tmp_path, tiny_checkpoint):
    """The shared loader spoke of --calibration-codes (and named a FIFO's path twice)."""
    f = tmp_path / "c.npy"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "zero":
        f.symlink_to("/dev/zero")
    elif kind == "dir":
        f.mkdir()
    elif kind == "shape":
        np.save(f, np.zeros((4, 8), np.int64))
    elif kind == "range":
        codes = np.zeros((4, 16), np.int64)
        codes[0, 0], codes[1, 3] = -1, 2048
        np.save(f, codes)
    elif kind == "float":
        np.save(f, np.zeros((4, 16), np.float32))
    else:                                   # a header that claims 11.6 TiB over 256 bytes
        from numpy.lib import format as npy

        with open(f, "wb") as fh:
            npy.write_array_header_1_0(fh, {"descr": "<i8", "fortran_order": False, "shape": (10 ** 11, 16)})
            fh.write(bytes(256))
    proc = cli(*qwen3(tiny_checkpoint, "--codes", f))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"omni-export: error: {message.format(f=f)}"), line
    assert "--calibration-codes" not in proc.stderr


# ------------------------------------------------------------------------------- output files

def _hostile_path(tmp_path: Path, kind: str, name: str) -> Path:
    p = tmp_path / name
    if kind == "dir":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "zero":
        p.symlink_to("/dev/zero")
    else:                                   # under a regular file
        (tmp_path / "file").write_text("x")
        p = tmp_path / "file" / name
    return p


OUTPUT_MESSAGES = {"dir": "{option} {p} is a directory; pass a file path",
                   "fifo": "{option} {p} is not a regular file (a FIFO, device or socket); pass a file path",
                   "zero": "{option} {p} is not a regular file (a FIFO, device or socket); pass a file path",
                   "under-a-file": "{option} {p} cannot be written (Not a directory)"}


@pytest.mark.parametrize("option", ["--wav", "--codes-out"])
@pytest.mark.parametrize("kind", list(OUTPUT_MESSAGES))
def test_qwen3_an_output_path_that_is_no_file_is_refused_before_any_work(option, kind, tmp_path, tiny_checkpoint):
    """--wav DIR was an AttributeError traceback after the generation, --wav FIFO hung forever and
    --wav /dev/zero swallowed the audio with exit 0."""
    p = _hostile_path(tmp_path, kind, "out.wav" if option == "--wav" else "codes.npy")
    fails_with(qwen3(tiny_checkpoint, "--text-ids", IDS, option, p), OUTPUT_MESSAGES[kind].format(option=option, p=p),
               exit=2)


def test_qwen3_no_graph_runs_before_every_input_is_checked(tmp_path, tiny_checkpoint, monkeypatch):
    """In process, with every graph call an error: each bad input is refused before the first one."""
    from omni_export.recipes.qwen3_tts import synth
    from omni_export.runtime.graphs import EagerGraphs

    def graph_ran(self, name, inputs):
        raise AssertionError(f"graph {name} ran before the inputs were checked")

    monkeypatch.setattr(EagerGraphs, "__call__", graph_ran)
    defaults = {o.name: o.default for o in synth.options()}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad_codes = tmp_path / "c.npy"
    np.save(bad_codes, np.full((3, 16), 4096, np.int64))
    for args, message in [
        ({"text_ids": f"99999999,{IDS}"}, "--text-ids: 99999999 is outside"),
        ({"text_ids": IDS, "instruct_ids": "-7"}, "--instruct-ids: -7 is outside"),
        ({"text": "a " * 2000}, "talker positions with the prompt; the context holds 1024"),
        ({"text_ids": IDS, "wav": str(fifo)}, f"--wav {fifo} is not a regular file"),
        ({"codes": str(bad_codes)}, f"--codes {bad_codes}: codes must be integers in [0, 2048)"),
    ]:
        with pytest.raises(UsageError) as e:
            synth.run(**{**defaults, "checkpoint": str(tiny_checkpoint), "greedy": True, **args})
        assert message in str(e.value) and "\n" not in str(e.value), (args, str(e.value))


# ------------------------------------------------------------------------------- the tokenizer

def test_a_missing_tokenizer_suggests_text_ids_to_synth_only(tmp_path, tiny_checkpoint):
    """synth can do without the tokenizer (--text-ids, --instruct-ids); a build cannot: it tokenises
    its calibration prompts, and it has no --text-ids flag to suggest."""
    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, ck)
    (ck / "vocab.json").unlink()
    base = f"{ck}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt); copy them from the checkpoint's release"
    fails_with(qwen3(ck, "--text", "Hi."), f"{base}, or pass --text-ids instead of --text", exit=2)
    fails_with(qwen3(ck, "--text-ids", IDS, "--instruct", "calm"), f"{base}, or pass --instruct-ids instead of --instruct",
               exit=2)
    fails_with(["qwen3-tts", "--checkpoint", ck, "--out", tmp_path / "out", *FAST], base,
               env={"OMNI_EXPORT_CAPTURE_CACHE": "off"}, exit=2)       # a cached capture would not need the tokenizer
    ok = cli(*qwen3(ck, "--text-ids", IDS))
    assert ok.returncode == 0, ok.stderr[-2000:]


# ------------------------------------------------------------------------------- MiniCPM-o

@pytest.fixture(scope="module")
def minicpm_checkpoint(tmp_path_factory) -> Path:
    from omni_export.recipes.minicpm_o import checkpoint as ck

    return ck.write_checkpoint(tmp_path_factory.mktemp("mc") / "tiny", seed=0)


def minicpm(ck, tmp_path, ids, *args) -> list:
    hidden = tmp_path / "h.npy"
    np.save(hidden, np.random.default_rng(0).standard_normal((3, 96)).astype(np.float32))     # llm_dim 96
    return ["synth", "minicpm-o", "--checkpoint", ck, "--greedy", "--max-codes", "2", "--hidden-states", hidden,
            "--text-ids", ids, *args]


MC_VOCAB = "0..152063"


@pytest.mark.parametrize("ids, message", [
    ("1,-7,3", "--text-ids: -7 is outside the text vocabulary {vocab} of {ck}"),
    ("1,99999999,3", "--text-ids: 99999999 is outside the text vocabulary {vocab} of {ck}"),
    ("npy:152064", "--text-ids: 152064 is outside the text vocabulary {vocab} of {ck}"),
    ("npy:-1", "--text-ids: -1 is outside the text vocabulary {vocab} of {ck}"),
    ("npy-float", "--text-ids {f}: token ids must be integers, got dtype float64"),
    ("npy-fifo", "--text-ids {f} is not a regular file"),
    ("1,2", "--hidden-states/--text-ids (the comma-separated ids): expected 3 integer token ids, got int64 [2]"),
])
def test_minicpm_text_ids_are_checked_against_the_text_vocabulary(ids, message, tmp_path, minicpm_checkpoint):
    f = tmp_path / "ids.npy"
    if ids.startswith("npy:"):
        np.save(f, np.array([1, 2, int(ids[4:])], np.int64))
    elif ids == "npy-float":
        np.save(f, np.array([1.0, 2.0, 3.0]))
    elif ids == "npy-fifo":
        os.mkfifo(f)
    fails_with(minicpm(minicpm_checkpoint, tmp_path, str(f) if ids.startswith("npy") else ids),
               message.format(vocab=MC_VOCAB, ck=minicpm_checkpoint, f=f), exit=2)


@pytest.mark.parametrize("option", ["--wav", "--mel-out", "--codes-out"])
@pytest.mark.parametrize("kind", ["dir", "fifo", "zero"])
def test_minicpm_an_output_path_that_is_no_file_is_refused_before_any_work(option, kind, tmp_path,
                                                                           minicpm_checkpoint):
    p = _hostile_path(tmp_path, kind, "out.wav" if option == "--wav" else "out.npy")
    fails_with(minicpm(minicpm_checkpoint, tmp_path, "1,2,3", option, p),
               OUTPUT_MESSAGES[kind].format(option=option, p=p), exit=2)


# ------------------------------------------------------------------------------- Spark

@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "1,-7"], "--prompt-ids: -7 is outside the text vocabulary 0..319 of the demo checkpoint"),
    (["--prompt-ids", "99999999"], "--prompt-ids: 99999999 is outside the text vocabulary 0..319 of the demo checkpoint"),
    (["--prompt-ids", "1,2,3", "--max-tokens", "1100"],
     "--prompt-ids: 3 tokens and --max-tokens 1100 need 1102 positions; the context holds 1024 (--context-length); "
     "shorten the prompt, lower --max-tokens, or build with a larger --context-length (at most 32768) and synth "
     "--build it"),
])
def test_spark_prompt_ids_and_length_are_checked_before_any_work(args, message):
    fails_with(["synth", "spark", *args], message, exit=2)


def test_spark_a_long_prompt_is_refused_against_the_context():
    proc = cli("synth", "spark", "--prompt", "hello " * 3000, "--max-tokens", "2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("omni-export: error: --prompt: ") and " tokens and --max-tokens 2 need " in line
    assert "; the context holds 1024 (--context-length); shorten the prompt" in line


def test_spark_a_missing_tokenizer_suggests_prompt_ids(tmp_path):
    from omni_export.recipes.spark import checkpoint as ck

    d = ck.write_checkpoint(tmp_path / "sp", seed=0)
    (d / "tokenizer.json").unlink()
    fails_with(["synth", "spark", "--checkpoint", d, "--prompt", "hi", "--max-tokens", "2"],
               f"{d}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt); copy them from the "
               f"checkpoint's release, or pass --prompt-ids instead of --prompt", exit=2)
