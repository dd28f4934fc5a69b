"""Precision repair's parts without a build (the build itself: tests/test_pipeline.py's repair test)."""
import pytest

from omni_export.core import Precision, UsageError
from omni_export.jobs import repair as rp


def test_a_repaired_precision_keeps_its_base_gate_and_is_never_asked_for():
    m = Precision.W8A16_MIXED
    assert m.quantized and m.mixed and m.base == Precision.W8A16 and Precision.W8A16.repaired() == m
    assert not Precision.W8A16.mixed and Precision.FP16.base == Precision.FP16
    assert Precision.parse("w8a16") == Precision.W8A16
    with pytest.raises(UsageError, match="not built on request: precision repair"):
        Precision.parse("w8a16-mixed")
    assert all(not p.mixed for p in Precision.requestable()) and len(Precision.requestable()) == 5


def test_blocks_are_kept_worst_first_failures_before_any_score():
    rows = [{"block": "a", "snr_db": 40.0}, {"block": "b", "snr_db": 12.5}, {"block": "c", "snr_db": None,
            "error": "refused"}, {"block": "d", "snr_db": 30.0, "finite": False}, {"block": "e", "snr_db": 25.0},
            {"block": "*", "snr_db": None, "error": "whole job failed"}]
    assert [rows[i]["block"] for i in rp.block_order(rows)] == ["c", "d", "b", "e", "a"]


def test_the_share_still_quantized_counts_every_integer_width_and_no_float():
    assert rp.integer_share({"8": 0.25, "16": 0.5, "32": 0.25}) == 0.75
    assert rp.integer_share({"4": 0.6, "8": 0.4}) == 1.0
    assert rp.integer_share({}) is None


def test_the_search_runs_where_the_rejected_build_was_judged():
    from omni_export.core import BuildSpec, Format

    def b(f, p=Precision.W8A16):
        return BuildSpec("qwen3-tts", "code2wav", f, p, "s25-htp")

    assert rp.search_primary([b(Format.ONNX), b(Format.CTX)], Precision.W8A16, True) == Format.CTX
    assert rp.search_primary([b(Format.ONNX), b(Format.CTX)], Precision.W8A16, False) == Format.ONNX
    assert rp.search_primary([b(Format.PTE)], Precision.W8A16, True) is None
    rejected = [{"precision": "w8a16", "format": "ctx", "status": "rejected"}]
    failed = [{"precision": "w8a16", "format": "ctx", "status": "rejected", "error": "lowering failed: ..."}]
    assert rp.wants_repair(rejected, Precision.W8A16, Format.CTX)
    assert not rp.wants_repair(failed, Precision.W8A16, Format.CTX)        # diagnosed, not repaired
    assert not rp.wants_repair(rejected, Precision.W8A16, Format.ONNX)


def test_a_repaired_build_goes_to_ai_hub_as_built_with_options_its_compile_parser_takes(tmp_path):
    """AI Hub never re-quantizes a repaired build (its float islands live in its QDQ graph), even with
    quantize_on="hub"; its compile options pass the fake hub's parser of AI Hub's documented options."""
    import fake_hub

    from omni_export.hub.routes import plan
    from omni_export.targets import get_target

    build = {"component": "code2wav", "format": "ctx", "precision": "w8a16-mixed", "status": "accepted",
             "name": "qwen3-tts-code2wav-w8a16-mixed-s25-htp"}
    plain = {**build, "precision": "w8a16", "name": "qwen3-tts-code2wav-w8a16-s25-htp"}
    src = {"path": "sources/x.onnx", "sha256": "0" * 64}
    manifest = {"builds": [build, plain], "components": {"code2wav": {"sources": {
        "w8a16-mixed": src, "w8a16": src, "fp32": src}}}}
    routes, left = plan(manifest, get_target("s25-htp"), quantize_on="hub")
    by = {r.precision: r for r in routes}
    assert not left and by["w8a16-mixed"].upload == "w8a16-mixed" and by["w8a16-mixed"].quantize is None
    assert by["w8a16"].upload == "fp32" and by["w8a16"].quantize == ("INT8", "INT16")
    assert "precision repair" in by["w8a16-mixed"].quantized_by
    server = fake_hub.Server(tmp_path)
    qairt = next(f["api_version"] for f in server.scenario["frameworks"])
    opts = server._options(by["w8a16-mixed"].compile_options(qairt), fake_hub.COMPILE_OPTIONS)
    assert opts["--target_runtime"] == "qnn_context_binary" and "--quantize_full_type" not in opts


def test_attribution_records_blocks_on_read_only_inputs_without_a_warning():
    """The held-out inputs attribution reads are memory-mapped, read only: torch warned on stderr on
    every 0.6B build ('The given NumPy array is not writable')."""
    import warnings

    import numpy as np
    import torch

    from omni_export.blocks import Block, BlockChain

    class Double(Block):
        def forward(self, x):
            return x * 2

    chain = BlockChain(["x"], ["y"], [("double", Double().named(["x"], ["y"]))])
    x = np.arange(4, dtype=np.float32)
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = chain.record({"x": x})
    assert [r[0] for r in rows] == ["double"] and torch.equal(rows[0][3]["y"], torch.arange(4.0) * 2)
    assert not x.flags.writeable and x[1] == 1          # the caller's array is untouched
