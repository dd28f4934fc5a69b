"""`synth --text` on a checkpoint written by upstream with a real-size-style BPE gives upstream's templated
ids and greedy codes for every string class (issue 39, acceptance 2).

Goldens (tools/golden/make_text_codes_goldens.py): upstream's `generate_custom_voice` on a tiny CustomVoice
checkpoint whose text side is real-size (151936 embedding rows, Qwen's special ids, the 151643-token
byte-level BPE of make_tokenizer_split_goldens.py), as upstream's save_pretrained wrote it: its config.json
says transformers 4.57.3, so upstream's processor cuts with the Mistral-style split. The tests write the
same tensors and tokenizer (its tensors equal ours: the golden's `tensors_equal_ours`) with that config.json.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN, golden_tool, run_cli

META = json.loads((GOLDEN / "qwen3_tts" / "text_codes.json").read_text(encoding="utf-8"))
TEXTS = META["texts"]
SPLIT = json.loads((GOLDEN / "qwen3_tts" / "text_split.json").read_text(encoding="utf-8"))["texts"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    assert META["tensors_equal_ours"] and META["split"] == "mistral"
    d = golden_tool("make_text_codes_goldens").write_checkpoint(tmp_path_factory.mktemp("text-codes") / "ck")
    (d / "config.json").write_text((GOLDEN / "qwen3_tts" / "text_codes_config.json").read_text())
    return d


@pytest.fixture(scope="module")
def model(checkpoint, tmp_path_factory):
    from omni_export.recipes import get_recipe
    from omni_export.recipes.qwen3_tts import model as M
    from omni_export.runtime.graphs import EagerGraphs

    m = M.load(checkpoint, {o.name: o.default for o in get_recipe("qwen3-tts").options},
               tmp_path_factory.mktemp("text-codes-scratch"))
    return m, EagerGraphs(m)


def _synth(model, tmp_path, text: str, **kw) -> tuple[dict, np.ndarray]:
    """synth's own path after the checkpoint is loaded (synth.run minus M.load): the model and its eager
    graphs made once for all strings."""
    from omni_export.recipes.qwen3_tts import synth

    args = {o.name: (False if o.is_flag else None) if type(o.default).__name__ == "Sentinel" else o.default
            for o in synth.options()}
    out = tmp_path / "codes.npy"
    model, graphs = model
    args.update(checkpoint=str(model.path), text=text, speaker=META["speaker"], greedy=True,
                max_frames=META["max_new_tokens"] - 1, codes_out=str(out), **kw)
    summary = synth._run(model, None, args, str(model.path), graphs=graphs)
    return summary, np.load(out)


def test_the_goldens_cover_every_string_class_and_upstreams_ids_are_the_split_goldens():
    """The strings of the split goldens, each tokenized by upstream's processor inside generate as the
    split goldens recorded for the Mistral-style split; nine of them tokenize otherwise under Qwen2's."""
    assert set(TEXTS) == set(SPLIT)
    for key, entry in TEXTS.items():
        assert entry["ids"] == SPLIT[key]["mistral_ids"], key
        assert len(entry["codes"]) == META["max_new_tokens"] - 1 and len(entry["codes"][0]) == 16, key
    assert sum(SPLIT[k]["qwen2_ids"] != SPLIT[k]["mistral_ids"] for k in TEXTS) == 9


def test_synth_text_gives_upstreams_ids_and_greedy_codes_for_every_string_class(model, tmp_path, one_thread):
    for key, entry in TEXTS.items():
        summary, codes = _synth(model, tmp_path, entry["text"])
        assert summary["text_split"] == "mistral", key
        assert summary["text_ids"] == entry["ids"], key
        np.testing.assert_array_equal(codes, entry["codes"], err_msg=key)


def test_the_codes_tell_the_splits_apart(model, tmp_path, one_thread):
    """Fed Qwen2's split, the strings whose ids differ give other codes than upstream's: the comparison
    above sees the split, not only the ids."""
    for key in ("camelcase", "devanagari", "thai"):
        summary, codes = _synth(model, tmp_path, TEXTS[key]["text"], text_split="qwen2")
        assert summary["text_ids"] == SPLIT[key]["qwen2_ids"] != TEXTS[key]["ids"]
        assert not np.array_equal(codes, TEXTS[key]["codes"]), key


def test_the_command_as_users_run_it(checkpoint, tmp_path):
    entry = TEXTS["acronyms"]
    proc = run_cli("synth", "qwen3-tts", "--checkpoint", str(checkpoint), "--text", entry["text"], "--speaker",
                   META["speaker"], "--greedy", "--max-frames", str(META["max_new_tokens"] - 1), "--codes-out",
                   str(tmp_path / "c.npy"), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["text_split"] == "mistral" and "4.57.3" in summary["text_split_reason"]
    assert summary["text_ids"] == entry["ids"]
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), entry["codes"])


def test_a_builds_prompts_tokenize_with_upstreams_split_and_the_manifest_says_which(checkpoint, tmp_path, monkeypatch):
    """The calibration prompts and the end-to-end rows' held-out prompts (model.requests) are tokenized as
    synth --text-split auto does; the split and why go into the manifest's checkpoint entry (model.info)."""
    from omni_export.recipes import get_recipe
    from omni_export.recipes.qwen3_tts import model as M
    from omni_export.recipes.qwen3_tts import prompts

    for which, keys in (("CALIBRATION", ("camelcase", "devanagari")), ("HELDOUT", ("thai", "acronyms"))):
        monkeypatch.setattr(prompts, which, [{"text": TEXTS[k]["text"], "language": "auto"} for k in keys])
    m = M.load(checkpoint, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)
    assert m.info["text_split"] == "mistral" and "transformers_version 4.57.3" in m.info["text_split_reason"]
    for which, keys in (("calibration", ("camelcase", "devanagari")), ("heldout", ("thai", "acronyms"))):
        assert [r.text_ids for r in m.requests(which)] == [TEXTS[k]["ids"] for k in keys], which


def test_the_demo_build_keeps_qwen2s_split_in_its_manifest(fp16_build):
    """The tiny demo's base vocabulary is far below 100000: Qwen2's split, as before (its numerics golden
    does not move)."""
    from conftest import read_manifest
    from omni_export.artifacts.manifest import schema_error

    m = read_manifest(fp16_build)
    assert m["checkpoint"]["text_split"] == "qwen2" and "base vocabulary" in m["checkpoint"]["text_split_reason"]
    assert schema_error(m) is None
    m["checkpoint"]["text_split"] = "camel"
    assert schema_error(m).startswith("checkpoint.text_split:")
