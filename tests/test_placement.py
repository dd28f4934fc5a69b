"""Placement by role, overridable: --place COMPONENT=npu|gpu|cpu over the recipe's roles (targets.py).

A graph placed on the NPU is judged on the HTP simulator; one on the Adreno GPU, which nothing here runs,
is judged on ONNX Runtime CPU by proxy and says so in its verdict (manifest, report.md, report.html); AI
Hub re-judges it on the device (test_hub.py). MiniCPM-o's --place hift=gpu: test_minicpm_o_hift.py."""
from __future__ import annotations

import pytest

from conftest import GEOMETRY, builds_by, read_manifest, run_cli


def test_place_code2wav_on_the_npu_of_s25_is_judged_on_the_htp_simulator(tmp_path, tiny_checkpoint):
    """s25 puts vocoders on the Adreno GPU (Code2Wav's role); --place code2wav=npu moves it to the NPU."""
    out = tmp_path / "out"
    proc = run_cli("qwen3-tts", "--target", "s25", "--place", "code2wav=npu", "--components", "code2wav",
                   "--formats", "ctx", "--precision", "fp16", "--no-attribution", "-q", *GEOMETRY,
                   "--checkpoint", str(tiny_checkpoint), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_manifest(out)
    b = builds_by(m)[("code2wav", "ctx", "fp16")]
    assert m["target"]["placement"] == {"code2wav": "htp"}
    assert b["placement"] == {"unit": "htp", "by": "--place code2wav=npu"}
    assert b["status"] == "accepted" and b["parity"]["runner"]["kind"] == "qnn-htp" and "proxy" not in b["parity"]
    md = (out / "report.md").read_text()
    assert "| code2wav | ctx | fp16 | htp-sim fp16 " in md and "by proxy" not in md


@pytest.mark.parametrize("args, message", [
    (["--target", "cpu", "--place", "code2wav=gpu"], "--place code2wav=gpu: target cpu has no gpu; its units: cpu"),
    (["--place", "vocoder=gpu"], "--place vocoder=gpu: unknown component 'vocoder' for qwen3-tts; valid: "),
    (["--place", "code2wav=tpu"], "--place code2wav=tpu: unknown unit 'tpu'; valid: npu, gpu, cpu"),
    (["--place", "code2wav"], "--place code2wav: expected COMPONENT=UNIT with UNIT one of npu, gpu, cpu"),
])
def test_a_bad_place_is_one_line_naming_the_option_and_the_rule(tmp_path, args, message):
    proc = run_cli("qwen3-tts", *args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.startswith(f"omni-export: error: {message}")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()                    # refused before anything is written


def test_roles_place_every_familys_vocoder_and_place_overrides_them():
    from pathlib import Path

    from omni_export.pipeline import RunOptions, plan
    from omni_export.recipes import get_recipe
    from omni_export.targets import get_target

    mc = get_recipe("minicpm-o")
    s25 = RunOptions(mc, get_target("s25"), Path("unused"), components=("hift", "hift_f0", "tts_decode"))
    assert {c: s25.target.place(c).unit for c in ("hift", "hift_f0", "tts_decode", "dit_step")} == \
        {"hift": "gpu", "hift_f0": "gpu", "tts_decode": "htp", "dit_step": "htp"}
    assert {(b.component, b.format.value, b.precision.value) for b in plan(s25).builds} == {
        ("hift", "onnx", "fp32"), ("hift_f0", "onnx", "fp32"), *(("tts_decode", f, "fp16") for f in ("onnx", "dlc", "ctx"))}
    # the HTP-only target keeps every graph on the NPU; --place moves one to the GPU or the CPU
    htp = RunOptions(mc, get_target("s25-htp"), Path("unused"), place={"hift": "gpu", "dit_step": "cpu"})
    assert {c: htp.target.place(c).unit for c in ("hift", "hift_f0", "dit_step")} == \
        {"hift": "gpu", "hift_f0": "htp", "dit_step": "cpu"}
    assert htp.target.place("dit_step").formats == (get_target("s25-htp").formats[0], get_target("s25-htp").formats[3])
    spark = RunOptions(get_recipe("spark"), get_target("s25"), Path("unused"))      # an LLM: no vocoder
    assert {spark.target.place(c).unit for c in ("prefill", "decode")} == {"htp"}
