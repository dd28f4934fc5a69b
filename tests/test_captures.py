"""Capture cache: captured inputs kept across runs, exactly, and only under their own key."""
import json

import numpy as np
import pytest

from omni_export.artifacts import captures
from omni_export.artifacts.manifest import hash_arrays
from omni_export.captured import Sample
from omni_export.recipes.qwen3_tts import checkpoint as ck
from omni_export.recipes.qwen3_tts import model as M


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(captures.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(captures.ENV_SWITCH, raising=False)
    return tmp_path / "cache" / "captures"


KV = np.zeros((1, 2, 512, 512), np.float32)           # 2 MB: past captured.TRIM_MIN_BYTES
KV[..., :3, :] = 1.0                                   # held trimmed to its used prefix
TREE = {"calibration": {"g": ([{"x": np.arange(6, dtype=np.float32).reshape(2, 3), "m": np.array([1, 0], np.int32)}],
                              "seeded prompts")},
        "kv": [Sample({"kv": KV, "pos": np.array([3], np.int32)})],
        "codes": [np.array([[3, 4]], np.int64), np.zeros((0, 2), np.int64)], "note": None, "n": 3}


def test_a_kept_capture_reads_back_exactly(cache):
    assert captures.store("k1", TREE) == "stored"
    back = captures.load("k1")
    (x,), src = back["calibration"]["g"]
    assert isinstance(back["calibration"]["g"], tuple) and src == "seeded prompts"
    assert x["x"].dtype == np.float32 and x["x"].tobytes() == TREE["calibration"]["g"][0][0]["x"].tobytes()
    assert x["m"].dtype == np.int32 and back["codes"][0].dtype == np.int64 and back["codes"][1].shape == (0, 2)
    assert (back["note"], back["n"]) == (None, 3)
    (s,) = back["kv"]
    assert isinstance(s, Sample) and s.compact()[1] == TREE["kv"][0].compact()[1] == {"kv": KV.shape}
    assert s.nbytes == TREE["kv"][0].nbytes < KV.nbytes and s["kv"].tobytes() == KV.tobytes()
    assert captures.load("other") is None


def test_a_damaged_or_misfiled_entry_is_not_used(cache):
    captures.store("k1", TREE)
    data = cache / "k1.npz"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert captures.load("k1") is None
    captures.store("k1", TREE)
    (cache / "k1.json").rename(cache / "k2.json")                 # an index under another key's name
    (cache / "k1.npz").rename(cache / "k2.npz")
    assert captures.load("k2") is None


def test_off_switch_size_limit_and_pruning(cache, monkeypatch):
    monkeypatch.setenv(captures.ENV_SWITCH, "off")
    assert captures.store("k1", TREE) == "off" and captures.load("k1") is None and not cache.exists()
    monkeypatch.delenv(captures.ENV_SWITCH)
    monkeypatch.setattr(captures, "MAX_BYTES", 16)
    assert captures.store("k1", TREE).startswith("not stored") and not cache.exists()
    monkeypatch.setattr(captures, "MAX_BYTES", 1 << 20)
    monkeypatch.setattr(captures, "KEEP", 2)
    for i in range(4):
        captures.store(f"k{i}", TREE)
    assert sorted(p.name for p in cache.iterdir()) == ["k2.json", "k2.npz", "k3.json", "k3.npz"]
    with pytest.raises(TypeError):
        captures.store("bad", {"x": object()})


def _model(path, **options):
    return M.load(path, {**dict(GEO), **options}, path.parent / "scratch")


GEO = {"left-context": 2, "chunk-frames": 2, "calibration-frames": 3}


def test_a_second_load_reads_the_capture_and_gets_the_same_inputs(cache, tmp_path):
    path = ck.write_checkpoint(tmp_path / "ckpt", seed=0)
    first = _model(path)
    cal, held = first.samples("talker_decode", "calibration"), first.samples("code2wav", "heldout")
    assert first.capture_cache["hit"] is False and first.capture_cache["store"] == "stored"
    second = _model(path)
    cal2, held2 = second.samples("talker_decode", "calibration"), second.samples("code2wav", "heldout")
    assert second.capture_cache == {"key": first.capture_cache["key"], "hit": True}
    assert hash_arrays(cal.inputs) == hash_arrays(cal2.inputs) and cal.source == cal2.source
    assert hash_arrays(held.inputs) == hash_arrays(held2.inputs)
    assert [c.tobytes() for c in first.heldout_codes] == [c.tobytes() for c in second.heldout_codes]
    # its own key only: other options, other weights, a changed config file
    key = first.capture_cache["key"]
    assert first.capture_key() == key
    assert _model(path, **{"calibration-frames": 2}).capture_key() != key
    other = ck.write_checkpoint(tmp_path / "ckpt1", seed=1)
    assert _model(other).capture_key() != key
    cfg = path / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "comment": "edited"}))
    assert _model(path).capture_key() != key


def test_end_to_end_with_no_runnable_row_skips_the_fp32_reference(cache, tmp_path, monkeypatch):
    """A partial build (--components) has no accepted talker for any runner: every end-to-end row is
    skipped with its reason, and the fp32 reference pipeline (minutes and GBs at real size) is not run."""
    from omni_export.pipeline import Progress
    from omni_export.recipes.qwen3_tts import e2e

    model = _model(ck.write_checkpoint(tmp_path / "ckpt", seed=0), **{"e2e-frames": 4})
    generated = []
    real = type(model).synthesize
    monkeypatch.setattr(type(model), "synthesize", lambda self, *a, **k: (generated.append(1), real(self, *a, **k))[1])
    manifest = {"components": {}, "builds": [{"component": "code2wav", "format": "onnx", "precision": "fp16",
                                              "status": "accepted", "files": [{"path": "code2wav.onnx"}]}]}
    rows = e2e.run(model, tmp_path / "out", manifest, {"ort": ["fp16", "w8a16"]}, Progress())
    assert [(r["runner"], r["precision"], r["verdict"]) for r in rows] == [("ort", "fp16", "skipped"),
                                                                          ("ort", "w8a16", "skipped")]
    # code2wav was built and accepted; the graphs before it were not built at all (not "rejected")
    fp16, w8a16 = (r["reason"] for r in rows)
    assert fp16.startswith("text_projection, talker_prefill") and fp16.endswith("not built at fp16 in this run")
    assert "code2wav" not in fp16 and "code2wav" in w8a16 and w8a16.endswith("not built at w8a16 in this run")
    manifest["builds"].append({"component": "talker_decode", "format": "onnx", "precision": "fp16", "status": "rejected"})
    rows = e2e.run(model, tmp_path / "out", manifest, {"ort": ["fp16"]}, Progress())
    assert rows[0]["reason"].startswith("no accepted talker_decode build; text_projection, talker_prefill"), rows
    assert generated == [] and rows[0]["prompts"] == len(model.requests("heldout"))
