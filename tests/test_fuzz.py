"""Fuzzing the config and checkpoint loaders: whatever the bytes, our UsageError (or a clean load),
never another exception and never a hang. Bounded: max_examples per property and a per-input
deadline; each test prints how many inputs it tried (pytest -s shows them) and asserts the count.

OMNI_EXPORT_FUZZ_EXAMPLES scales the number of examples (default 200 per property).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni_export.core import UsageError
from omni_export.recipes.qwen3_tts import checkpoint as ck
from omni_export.weights import TensorDecl, load_tensors, write_safetensors

EXAMPLES = int(os.environ.get("OMNI_EXPORT_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=2000, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def expect_usage_error_or_success(fn) -> str:
    try:
        fn()
    except UsageError as e:
        assert "\n" not in str(e) and str(e), "a UsageError is one non-empty line"
        return "usage-error"
    return "ok"


def report(name: str, outcomes: list[str]) -> None:
    counts = {k: outcomes.count(k) for k in sorted(set(outcomes))}
    print(f"\n{name}: tried {len(outcomes)} inputs: {counts}")
    assert len(outcomes) >= EXAMPLES


# --------------------------------------------------------------------------------------- configs

@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return ck.write_checkpoint(tmp_path_factory.mktemp("fuzz") / "ck", seed=0)


def _fresh(base: Path, work: Path) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work, ignore=shutil.ignore_patterns("*.safetensors"))
    os.symlink(base / "speech_tokenizer" / "model.safetensors", work / "speech_tokenizer" / "model.safetensors")
    return work


def test_random_config_documents(base, tmp_path):
    """Any JSON (or not-JSON) in config.json and speech_tokenizer/config.json."""
    outcomes = []
    doc = JSON | st.fixed_dictionaries({"model_type": st.sampled_from([ck.MODEL_TYPE, ck.TOKENIZER_MODEL_TYPE])},
                                       optional={"decoder_config": JSON})

    @FUZZ
    @given(root=doc, tok=doc, raw=st.none() | st.binary(max_size=64))
    def one(root, tok, raw):
        d = _fresh(base, tmp_path / "c")
        (d / "config.json").write_text(json.dumps(root))
        (d / "speech_tokenizer" / "config.json").write_bytes(raw if raw is not None else json.dumps(tok).encode())
        outcomes.append(expect_usage_error_or_success(lambda: (ck.check_root_config(d), ck.read_code2wav_config(d))))

    one()
    report("random config documents", outcomes)


def test_mutated_speech_tokenizer_configs_through_the_whole_loader(base, tmp_path):
    """The real config with fields replaced by any JSON value or deleted, then the full load
    (config -> tensor table -> safetensors) against the real tiny weights."""
    valid = json.loads((base / "speech_tokenizer" / "config.json").read_text())
    keys = [("decoder_config", k) for k in valid["decoder_config"]] + [(k,) for k in valid]
    outcomes = []

    @FUZZ
    @given(edits=st.lists(st.tuples(st.sampled_from(keys), st.none() | JSON, st.booleans()), min_size=1, max_size=3))
    def one(edits):
        cfg = copy.deepcopy(valid)
        for key, value, delete in edits:
            parent = cfg["decoder_config"] if len(key) == 2 and isinstance(cfg.get("decoder_config"), dict) else cfg
            if delete:
                parent.pop(key[-1], None)
            else:
                parent[key[-1]] = value
        d = _fresh(base, tmp_path / "c")
        (d / "speech_tokenizer" / "config.json").write_text(json.dumps(cfg))
        outcomes.append(expect_usage_error_or_success(lambda: ck.load_speech_tokenizer(d)))

    one()
    report("mutated speech tokenizer configs", outcomes)


def test_truncated_and_corrupted_config_bytes(base, tmp_path):
    text = (base / "speech_tokenizer" / "config.json").read_bytes()
    outcomes = []

    @FUZZ
    @given(cut=st.integers(0, len(text)), flips=st.lists(st.tuples(st.integers(0, len(text) - 1),
                                                                     st.integers(0, 255)), max_size=4))
    def one(cut, flips):
        data = bytearray(text)
        for i, v in flips:
            data[i] = v
        d = _fresh(base, tmp_path / "c")
        (d / "speech_tokenizer" / "config.json").write_bytes(bytes(data[:cut]))
        outcomes.append(expect_usage_error_or_success(lambda: ck.load_speech_tokenizer(d)))

    one()
    report("truncated / corrupted config bytes", outcomes)


# --------------------------------------------------------------------------------- safetensors

TABLE = {"a.weight": TensorDecl((4, 3)), "a.bias": TensorDecl((4,), ("zeros",)),
         "opt": TensorDecl((2,), required=False)}
DTYPES = ["F32", "F16", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "C64", "", "f32"]


def _valid_file(path: Path) -> bytes:
    write_safetensors(path, {"a.weight": np.arange(12, dtype=np.float32).reshape(4, 3),
                             "a.bias": np.ones(4, np.float32), "opt": np.zeros(2, np.float32)})
    return path.read_bytes()


def test_random_safetensors_headers(tmp_path):
    entry = st.fixed_dictionaries({
        "dtype": st.sampled_from(DTYPES) | JSON,
        "shape": st.lists(st.integers(-3, 2**40), max_size=3) | JSON,
        "data_offsets": st.lists(st.integers(-8, 2**40), min_size=2, max_size=2) | JSON,
    })
    header = st.dictionaries(st.sampled_from(["a.weight", "a.bias", "opt", "__metadata__", "x"]), entry | JSON,
                             max_size=4)
    outcomes = []

    @FUZZ
    @given(h=header | JSON, body=st.binary(max_size=96), length=st.none() | st.integers(0, 2**64 - 1))
    def one(h, body, length):
        text = json.dumps(h).encode()
        p = tmp_path / "model.safetensors"
        p.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + body)
        outcomes.append(expect_usage_error_or_success(lambda: load_tensors(p, TABLE)))

    one()
    report("random safetensors headers", outcomes)


def test_every_truncation_of_a_safetensors_file(tmp_path):
    """Exhaustive: the file cut at every byte."""
    p = tmp_path / "model.safetensors"
    data = _valid_file(p)
    outcomes = []
    for cut in range(len(data)):
        p.write_bytes(data[:cut])
        outcomes.append(expect_usage_error_or_success(lambda: load_tensors(p, TABLE)))
    print(f"\nevery truncation: tried {len(outcomes)} inputs")
    assert outcomes == ["usage-error"] * len(data)       # no cut of the file loads


def test_byte_flips_in_a_safetensors_file(tmp_path):
    p = tmp_path / "model.safetensors"
    data = _valid_file(p)
    outcomes = []

    @FUZZ
    @given(flips=st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), min_size=1, max_size=6))
    def one(flips):
        b = bytearray(data)
        for i, v in flips:
            b[i] = v
        p.write_bytes(bytes(b))
        outcomes.append(expect_usage_error_or_success(lambda: load_tensors(p, TABLE)))

    one()
    report("byte flips in a safetensors file", outcomes)
