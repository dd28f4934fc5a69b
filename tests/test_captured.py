"""Captured graph inputs: KV caches held as their used prefix (lossless), and a per-graph recorder
that keeps every call below its budget and an evenly spread subset above it."""
import pickle

import numpy as np

from omni_export.artifacts.manifest import hash_arrays
from omni_export.captured import CallRecorder, Sample


def call(step: int, slots: int = 1024) -> dict:
    k = np.zeros((1, 4, slots, 64), np.float32)
    k[:, :, :step + 1] = np.random.default_rng(step).standard_normal((1, 4, step + 1, 64))
    return {"past_key_0": k, "inputs_embeds": np.full((1, 1, 8), step, np.float32)}


def test_a_sample_reads_back_exactly_and_holds_only_the_used_slots():
    raw = call(9)
    s = Sample(raw)
    assert s.nbytes < raw["past_key_0"].nbytes // 50           # 10 of 1024 slots
    for k in raw:
        np.testing.assert_array_equal(s[k], raw[k])
        assert s[k].shape == raw[k].shape and s[k].dtype == raw[k].dtype
    assert hash_arrays([s]) == hash_arrays([raw])                # same content, same hash
    back = pickle.loads(pickle.dumps(s))                         # to runner worker processes
    assert len(pickle.dumps(s)) < raw["past_key_0"].nbytes // 50
    np.testing.assert_array_equal(back["past_key_0"], raw["past_key_0"])
    raw["past_key_0"][:] = 7                                     # a copy: the host's buffer may change
    assert s["past_key_0"][0, 0, 500, 0] == 0


def test_the_recorder_keeps_all_calls_under_its_budget_and_an_even_spread_over_it():
    small = CallRecorder(budget=1 << 30)
    for i in range(40):
        small.add(call(i, slots=64))
    assert len(small.kept) == 40 and not small.thinned

    rec = CallRecorder(budget=4 << 20)
    for i in range(400):
        rec.add(call(i))
    assert rec.thinned and rec.seen == 400
    assert sum(s.nbytes for s in rec.kept) <= 4 << 20
    steps = [int(s["inputs_embeds"][0, 0, 0]) for s in rec.kept]
    assert steps == list(range(0, 400, rec.stride))[:len(steps)] and steps[-1] >= 400 - 2 * rec.stride
