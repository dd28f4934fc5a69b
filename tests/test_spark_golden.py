"""Golden cross-check: our fp32 graphs (prefill + decode through the host's ring buffer) reproduce
the released modeling_spark.py (Spark2_5ForCausalLM, run by tools/golden/spark/make_goldens.py on
the same tiny seeded checkpoint): logits of a 40-token prompt (window 16) and 24 greedy tokens."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GOLDEN
from omni_export.runtime.graphs import EagerGraphs
from omni_export.recipes.spark import checkpoint as ck
from omni_export.recipes.spark import model as sm

G = GOLDEN / "spark"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = ck.write_checkpoint(tmp_path_factory.mktemp("golden") / "tiny", seed=0)
    return sm.load(d, {"prefill-tokens": 16, "context-length": 128}, tmp_path_factory.mktemp("s"))


def test_golden_inputs_are_ours(model):
    meta = json.loads((G / "meta.json").read_text())
    assert model.encode(meta["prompt"])[:meta["prompt_tokens"]] == np.load(G / "prompt_ids.npy").tolist()
    assert not any(meta["loading_info"].values())          # upstream used every tensor, missed none


def test_prefill_logits_match_upstream(model):
    from omni_export.recipes.spark.host import Session

    ids = np.load(G / "prompt_ids.npy").tolist()
    ref = np.load(G / "logits.npy").astype(np.float64)
    s = Session(EagerGraphs(model), model.cfg, model.embedding, model.prefill_tokens, model.context)
    ours = s.prefill(ids).astype(np.float64)             # 3 prefill calls of 16: the ring wraps
    snr = 10 * np.log10((ref ** 2).sum() / ((ref - ours) ** 2).sum())
    assert snr >= 80, snr


def test_greedy_tokens_match_upstream(model):
    ids = np.load(G / "prompt_ids.npy").tolist()
    want = np.load(G / "greedy.npy").tolist()
    gen = model.generate(EagerGraphs(model), ids, len(want), stop=False)
    assert gen.tokens == want
