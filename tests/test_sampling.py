"""Sampling as upstream's generate does it (issue 39): every generation_config.json key it reads moves
the codes, top-p 0.01 is greedy, flags beat the file, unknown keys are named, and the fused frame
graph hands over to the step graphs for what it cannot sample."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from omni_export.core import UsageError
from omni_export.recipes.qwen3_tts import host, synth

IDS = "268,263,10,72,105,32,116,104,101,114,101,46,269,10,268,263,10"
FRAMES = 8
# The tiny random model's logits are far apart: at upstream's temperature 0.9 it samples its greedy
# codes. A hot baseline makes every key's effect visible.
DEFAULTS = {"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 1000.0, "repetition_penalty": 1.05,
            "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
            "subtalker_temperature": 1000.0, "max_new_tokens": 2048}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_checkpoint):
    d = tmp_path_factory.mktemp("sampling") / "ck"
    shutil.copytree(tiny_checkpoint, d)
    return d


def codes(checkpoint, tmp_path, config: dict | None = None, **flags):
    """The codes `synth` generates from IDS with this generation_config.json and these flags."""
    (checkpoint / "generation_config.json").write_text(json.dumps({**DEFAULTS, **(config or {})}))
    out = tmp_path / "codes.npy"
    kw = {o.name: (False if o.is_flag else None) if type(o.default).__name__ == "Sentinel" else o.default
          for o in synth.options()}
    summary = synth.run(**{**kw, "checkpoint": str(checkpoint), "text_ids": IDS, "max_frames": FRAMES,
                           "codes_out": str(out), **flags})
    return np.load(out), summary


@pytest.mark.parametrize("key, value", [
    ("do_sample", False), ("top_k", 1), ("top_p", 0.05), ("temperature", 0.05), ("repetition_penalty", 8.0),
    ("subtalker_dosample", False), ("subtalker_top_k", 1), ("subtalker_top_p", 0.05),
    ("subtalker_temperature", 0.05), ("max_new_tokens", 3),
])
def test_every_key_upstream_reads_moves_the_codes(key, value, checkpoint, tmp_path):
    # the penalty acts on codes generated before: greedy, the tiny model repeats one at frame 32
    base_config, frames = ({"do_sample": False}, 34) if key == "repetition_penalty" else ({}, FRAMES)
    if key == "max_new_tokens":                                  # the file's limit, no --max-frames over it
        base_config, frames = {"max_new_tokens": FRAMES + 1}, None
    base, _ = codes(checkpoint, tmp_path, base_config, max_frames=frames)
    moved, _ = codes(checkpoint, tmp_path, {**base_config, key: value}, max_frames=frames)
    frames = frames or FRAMES
    assert base.shape[0] == frames
    assert moved.shape != base.shape or not np.array_equal(moved, base), f"{key}={value} changed nothing"
    if key == "max_new_tokens":
        assert moved.shape[0] == 2                               # max_new_tokens - 1 frames
    if key.startswith("subtalker_"):                             # the code predictor's keys: codebooks 1..15
        assert np.array_equal(moved[0, 0], base[0, 0]) and not np.array_equal(moved[0, 1:], base[0, 1:])


def test_top_p_001_for_both_is_greedy_and_flags_beat_the_file(checkpoint, tmp_path):
    greedy, _ = codes(checkpoint, tmp_path, greedy=True)
    nucleus, summary = codes(checkpoint, tmp_path, {"top_p": 0.01, "subtalker_top_p": 0.01})
    assert np.array_equal(nucleus, greedy)
    assert summary["predictor"] == "step"                         # the frame graph has no top-p
    assert any("cannot sample with subtalker_top_p 0.01" in n for n in summary["notes"])
    base, _ = codes(checkpoint, tmp_path)
    flagged, _ = codes(checkpoint, tmp_path, {"top_p": 0.01, "subtalker_top_p": 0.01}, top_p=1.0, sub_top_p=1.0)
    assert np.array_equal(flagged, base)
    assert not np.array_equal(base, greedy)


def test_the_sampled_code_is_always_inside_top_k_and_top_p():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=64).astype(np.float32) * 3
    order = np.argsort(-logits)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    need = int(np.searchsorted(np.cumsum(probs[order]), 0.6) + 1)          # the smallest set holding 0.6
    for _ in range(200):
        noise = host.gumbel(rng, logits.shape)
        assert host.pick(logits, noise, 5, 1.0, 1.0) in order[:5]
        assert host.pick(logits, noise, 64, 0.6, 1.0) in order[:need]
    assert host.pick(logits, host.gumbel(rng, logits.shape), 64, 1e-6, 1.0) == order[0]


def test_unknown_and_bad_keys(checkpoint, tmp_path):
    _, summary = codes(checkpoint, tmp_path, {"typical_p": 0.5, "transformers_version": "4.57.3"})
    note = [n for n in summary["notes"] if "ignored keys" in n]
    assert len(note) == 1 and "ignored keys typical_p (" in note[0] and "transformers_version" not in note[0]
    for key, value, rule in [("top_p", 0, "a number in (0, 1]"), ("top_k", 2.5, "an integer >= 1"),
                             ("temperature", "hot", "a number > 0"), ("subtalker_dosample", 1, "true or false")]:
        with pytest.raises(UsageError, match=rf"generation_config.json: {key} is .*; expected {rule[:8]}"):
            codes(checkpoint, tmp_path, {key: value})


def test_the_frame_graph_asked_for_what_it_cannot_sample_is_an_error(checkpoint, tmp_path):
    with pytest.raises(UsageError, match=r"the fused predictor frame graph cannot sample with subtalker_top_k 7 "
                                         r"\(the frame graph's is 50\); use --predictor step"):
        codes(checkpoint, tmp_path, {"subtalker_top_k": 7}, predictor="frame")


class _EosFirst:
    """The talker's graphs with EOS made the most likely code at every step."""

    def __init__(self, graphs, eos: int):
        self.graphs, self.eos = graphs, eos

    def __call__(self, name, inputs):
        out = self.graphs(name, inputs)
        if name.startswith(("talker_prefill", "talker_decode")) and "logits" in out:
            out = {**out, "logits": out["logits"].copy()}
            out["logits"][..., self.eos] = out["logits"].max() + 10.0
        return out


@pytest.mark.parametrize("greedy", [True, False])
def test_min_new_tokens_masks_eos_for_the_first_two_codes(greedy, tiny_checkpoint, tmp_path, one_thread):
    """Upstream's generate hard-codes min_new_tokens 2 (generation_config.json has no say: its wrapper reads
    only the ten keys above): EOS cannot be the first or second talker code. With EOS the most likely code
    at every step, generation stops at the third: 2 frames; with the mask off it would stop at once."""
    from omni_export.recipes import get_recipe
    from omni_export.recipes.qwen3_tts import model as M
    from omni_export.recipes.qwen3_tts.prompt import Request
    from omni_export.runtime.graphs import EagerGraphs

    m = M.load(tiny_checkpoint, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)
    graphs = _EosFirst(EagerGraphs(m), m.cfg.talker.codec_eos_token_id)
    req = Request(text_ids=[int(i) for i in IDS.split(",")], speaker=sorted(m.cfg.talker.spk_id)[0])
    for min_new, frames in ((2, 2), (0, 0)):
        opts = m.gen_options(greedy=greedy, sub_greedy=greedy, max_frames=FRAMES, min_new_tokens=min_new,
                             predictor="step")
        gen, _ = m.synthesize(graphs, req, opts, with_audio=False)
        assert (gen.stopped, len(gen.codes)) == ("eos", frames), min_new
    assert host.GenOptions().min_new_tokens == 2 and m.gen_options().min_new_tokens == 2
