import math

from omni_export.core import OutputScore
from omni_export.parity.gate import judge


def s(name, db, finite=True):
    return OutputScore(name, db, db + 15, 0.1, finite=finite)


def test_accepts_at_or_above_threshold():
    v = judge([s("wav", 40.0)], 40.0)
    assert v.accepted and v.status == "accepted"


def test_rejects_below_threshold_with_reason_naming_output():
    v = judge([s("wav", 39.9)], 40.0)
    assert not v.accepted
    assert "wav" in v.reason and "39.9" in v.reason and "40" in v.reason


def test_nan_is_rejected_even_when_threshold_is_minus_inf():
    v = judge([s("logits", -math.inf, finite=False)], -math.inf)
    assert not v.accepted and "NaN/Inf" in v.reason


def test_only_gated_outputs_count():
    scores = [s("logits", 50.0), s("hidden", 10.0)]
    assert judge(scores, 40.0, gated=("logits",)).accepted
    assert not judge(scores, 40.0).accepted


def test_reason_names_weakest_block_from_attribution():
    rows = [{"block": "a", "snr_db": 50.0}, {"block": "b", "snr_db": 12.0}, {"block": "c", "snr_db": None}]
    v = judge([s("wav", 20.0)], 30.0, attribution=rows)
    assert "b 12.0 dB" in v.reason


def test_no_outputs_is_a_rejection():
    assert not judge([], 30.0).accepted


def test_a_top1_gate_rejects_logits_that_pick_other_tokens_beside_the_snr_gate():
    """Component.top1_min (Spark's w4a16): logits above the SNR gate still need fp32's top-1 on enough rows."""
    logits = lambda top1: OutputScore("logits", 20.0, 35.0, 0.1, top1=top1)  # noqa: E731
    assert judge([logits(0.85)], 15.0).accepted                     # no top-1 gate: SNR alone
    v = judge([logits(0.85), s("hidden", 30.0)], 15.0, top1_min=0.9)
    assert not v.accepted and "'logits'" in v.reason and "85.0%" in v.reason and "90%" in v.reason
    v = judge([logits(0.95)], 15.0, top1_min=0.9)
    assert v.accepted and "top-1 95.0%" in v.reason
    assert not judge([logits(0.95)], 25.0, top1_min=0.9).accepted   # beside the SNR gate, not instead of it


def test_the_top1_gate_of_a_precision_is_read_from_the_recipe_or_the_manifest_record():
    from omni_export.core import Precision
    from omni_export.parity.gate import top1_gate

    assert top1_gate({Precision.W4A16: 0.9}, Precision.W4A16) == 0.9        # Component.top1_min
    assert top1_gate({"w4a16": 0.9}, "w4a16") == 0.9                         # the manifest's record
    assert top1_gate({"w4a16": 0.9}, "w8a16") is None and top1_gate({}, "w4a16") is None


def test_reasons_give_raw_agreement_excused_rows_and_what_a_score_was_against():
    """The fused frame's verdict: codes agreement with its raw value and the rows excused at a near
    tie, beside the dB of its gated embedding; a failing embedding score says what it was against."""
    codes = OutputScore("codes", None, None, 0.0, agreement=1.0, agreement_raw=0.733, ties=1)
    emb = OutputScore("embedding", 61.0, 70.0, 0.01, against="fp32 up to the first code that differs from fp32's")
    own = lambda db: OutputScore("embedding_own_codes", db, db + 9, 0.01,  # noqa: E731
                                 against="the sum of the codebook rows its own codes select")
    gated = ("codes", "embedding", "embedding_own_codes")
    v = judge([codes, emb, own(60.0)], 40.0, gated, agreement_min=0.99)
    assert v.accepted and v.reason == ("min 60.0 dB >= gate 40 dB; 'codes' agreement 100.0% "
                                       "(raw 73.3%, 1 row excused at a near tie) >= 99%")
    v = judge([codes, emb, own(12.0)], 40.0, gated, agreement_min=0.99)
    assert not v.accepted and v.reason == ("output 'embedding_own_codes' against the sum of the codebook rows its "
                                           "own codes select, 12.0 dB < gate 40 dB")
    flips = OutputScore("codes", None, None, 0.0, agreement=0.9, agreement_raw=0.8, ties=2)
    v = judge([flips, emb, own(60.0)], 40.0, gated, agreement_min=0.99)
    assert v.reason == "output 'codes' agrees with fp32 on 90.0% (raw 80.0%, 2 rows excused at a near tie) < 99% of elements"
