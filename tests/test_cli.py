"""The command line as a user meets it: help, list, and one-line errors with exit code 2."""
import subprocess
import sys

import pytest

from conftest import run_cli


def test_help_is_instant_no_torch_import():
    code = "import sys, omni_export.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    proc = run_cli("qwen3-tts", "--help")
    assert proc.returncode == 0
    for flag in ("--target", "--checkpoint", "--precision", "--formats", "--chunk-frames", "--gate", "--json"):
        assert flag in proc.stdout


def test_list_names_recipes_components_targets_precisions_formats():
    out = run_cli("list", check=True).stdout
    for word in ("qwen3-tts", "code2wav", "s25-htp", "s24-htp", "cpu", "w8a16", "ctx", "pte", "dlc"):
        assert word in out
    # each recipe's component descriptions start in one column, two spaces after the longest name
    recipes: list[list[str]] = []
    for line in out.split("targets:")[0].splitlines()[1:]:
        if line[:2] == "  " and line[2] != " ":
            recipes.append([])
        elif line[:4] == "    " and line[4] != " ":
            recipes[-1].append(line[4:])
    assert len(recipes) >= 3 and all(recipes)
    for rows in recipes:
        names = [r.split(" ", 1)[0] for r in rows]
        column = max(map(len, names)) + 2
        assert all(r[column - 2:column] == "  " and r[column] != " " for r in rows), rows


@pytest.mark.parametrize("args,message", [
    (["--target", "pixel9"], "unknown target 'pixel9'; valid: s25-htp, s24-htp, s25, s24, cpu"),
    (["--precision", "int4"], "unknown precision 'int4'; valid: fp32, fp16, w8a16, w8a8, w4a16"),
    (["--precision", "w8a16-mixed"], "precision 'w8a16-mixed' is not built on request: precision repair "
                                     "(--repair auto) makes it from a rejected w8a16 build"),
    (["--formats", "tflite"], "unknown format 'tflite'; valid: onnx, dlc, ctx, pte"),
    (["--components", "talker9"], "unknown component 'talker9' for qwen3-tts; valid: text_projection, "
                                  "talker_prefill, talker_decode, talker_prefill_part1, talker_prefill_part2, "
                                  "talker_decode_part1, talker_decode_part2, predictor_prefill, predictor_decode, "
                                  "predictor_frame, code2wav, speaker_encoder, speech_encoder"),
    (["--gate", "fp16"], "--gate expects PRECISION=DB items like fp16=45, got 'fp16'"),
    (["--rewrites", "magic"], "unknown rewrite 'magic'; valid: pow_mul, act_barrier, sin_poly, sin_dense, conv_polyphase, none"),
    (["--target", "cpu", "--formats", "dlc"], "target cpu does not build dlc; its formats: onnx, pte"),
    (["--target", "s25-htp", "--precision", "fp32", "--formats", "dlc"],
     "target s25-htp cannot run fp32 (the HTP has no fp32 datapath); valid precisions for s25-htp: fp16, w8a16, w8a8, w4a16"),
])
def test_usage_errors_are_one_line_with_exit_2(tmp_path, args, message):
    proc = run_cli("qwen3-tts", "--out", str(tmp_path / "o"), *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"omni-export: error: {message}"]


def test_missing_checkpoint_dir(tmp_path):
    proc = run_cli("qwen3-tts", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"omni-export: error: checkpoint directory {tmp_path}/nope does not exist; pass the directory holding "
        f"config.json and speech_tokenizer/ (or omit --checkpoint for the demo)")


def test_pickle_checkpoint_is_refused(tmp_path, tiny_checkpoint):
    import shutil

    d = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, d)
    st = d / "speech_tokenizer"
    (st / "model.safetensors").rename(st / "model.bin")
    proc = run_cli("qwen3-tts", "--checkpoint", str(d), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "never unpickles" in proc.stderr


def test_debug_shows_the_traceback(tmp_path):
    proc = run_cli("qwen3-tts", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr
