import math

import numpy as np
import pytest

from omni_export.parity.metrics import Accumulator, psnr_db, score_outputs, snr, snr_db


def test_snr_matches_definition():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(10_000)
    noise = rng.standard_normal(10_000) * 0.01
    expected = 10 * math.log10((ref ** 2).sum() / (noise ** 2).sum())
    assert snr(ref, ref + noise) == pytest.approx(expected, abs=1e-9)
    assert 39 < expected < 41


def test_psnr_uses_reference_peak_and_rmse():
    ref = np.array([0.0, 1.0, -2.0, 0.5])
    out = ref + np.array([0.1, -0.1, 0.1, -0.1])
    acc = Accumulator("x")
    acc.add(ref, out)
    s = acc.score()
    assert s.psnr_db == pytest.approx(20 * math.log10(2.0 / 0.1))
    assert s.max_abs_err == pytest.approx(0.1)


def test_exact_and_degenerate_cases():
    assert snr_db(1.0, 0.0) == math.inf
    assert snr_db(0.0, 1.0) == -math.inf
    assert psnr_db(0.0, 1.0, 4) == -math.inf
    x = np.ones(5)
    assert snr(x, x) == math.inf


def test_accumulates_over_samples_before_the_ratio():
    a, b = np.ones(100), np.ones(100) * 10
    acc = Accumulator("y")
    acc.add(a, a + 0.1)        # per-sample SNR 20 dB
    acc.add(b, b)              # per-sample SNR inf
    expected = 10 * math.log10((100 + 100 * 100) / (100 * 0.01))
    assert acc.score().snr_db == pytest.approx(expected)


def test_nan_or_inf_output_is_not_finite_and_minus_inf_db():
    ref = np.ones(4)
    for bad in (np.nan, np.inf):
        acc = Accumulator("z")
        acc.add(ref, np.array([1.0, bad, 1.0, 1.0]))
        s = acc.score()
        assert not s.finite and s.snr_db == -math.inf


def test_top1_agreement_for_logits():
    ref = [{"logits": np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1]])}]
    out = [{"logits": np.array([[0.2, 0.7, 0.1], [0.1, 0.8, 0.1]])}]
    (s,) = score_outputs(["logits"], ref, out, logits=["logits"])
    assert s.top1 == 0.5


def test_shape_mismatch_raises():
    acc = Accumulator("w")
    with pytest.raises(ValueError):
        acc.add(np.ones(3), np.ones(4))


def _frame(tables, code0, codes, scale=1.0):
    """A fused frame's outputs for picks [code0, *codes]: codes and their summed codebook rows."""
    from omni_export.parity.metrics import row_sum

    picks = np.array([[code0, *codes]])
    return {"codes": np.array([codes], dtype=np.int32),
            "embedding": (scale * row_sum(tables, picks)).astype(np.float32).reshape(1, 1, -1)}


def _row_sum_scores(refs, outs, code0, tables):
    from omni_export.core import RowSum

    rs = {"embedding": RowSum(("code0", "codes"), own="embedding_own_codes", words=("codebook", "code"))}
    ins = [{"code0": np.array([[c]], dtype=np.int32)} for c in code0]
    scored = score_outputs(["codes", "embedding"], refs, outs, row_sums=rs, inputs=ins, tables=tables)
    return {s.name: s for s in scored}


def test_a_summed_embedding_is_scored_against_its_own_codes_rows_and_fp32_up_to_the_first_flip():
    """RowSum: an embedding exact for the build's own codes passes both scores though its codes went
    another way after the first pick (raw against fp32 it would be far off); one that fp32 gets
    equally wrong (a graph bug, fp32 included) fails its own-codes score while matching fp32."""
    rng = np.random.default_rng(0)
    tables = {"embedding": tuple(rng.normal(size=(8, 6)).astype(np.float32) for _ in range(4))}
    t = tables["embedding"]
    refs = [_frame(t, 1, [2, 3, 4]), _frame(t, 5, [6, 7, 0])]
    flipped = [_frame(t, 1, [2, 5, 5]), _frame(t, 5, [6, 7, 0])]          # sample 0 flips at its 2nd code
    s = _row_sum_scores(refs, flipped, [1, 5], tables)
    assert s["embedding"].snr_db > 100 and s["embedding_own_codes"].snr_db > 100
    assert "first code that differs" in s["embedding"].against and "own codes" in s["embedding_own_codes"].against
    assert score_outputs(["embedding"], refs, flipped)[0].snr_db < 10      # raw: the frame went another way
    broken = [_frame(t, 1, [2, 3, 4], 1.05), _frame(t, 5, [6, 7, 0], 1.05)]  # a scaled table, fp32 too
    s = _row_sum_scores(broken, broken, [1, 5], tables)
    assert s["embedding"].snr_db == math.inf and s["embedding_own_codes"].snr_db < 30
    assert s["codes"].agreement == 1.0                                      # codes intact


def test_without_its_tables_a_summed_embedding_compares_only_rows_whose_codes_agree():
    """Device outputs (AI Hub) are scored without the checkpoint: the embedding against fp32 on the
    frames whose codes all agree, and no own-codes score."""
    rng = np.random.default_rng(1)
    t = tuple(rng.normal(size=(8, 6)).astype(np.float32) for _ in range(4))
    refs = [_frame(t, 1, [2, 3, 4]), _frame(t, 5, [6, 7, 0])]
    outs = [_frame(t, 1, [2, 5, 5], 3.0), _frame(t, 5, [6, 7, 0])]         # the flipped frame is left out
    s = _row_sum_scores(refs, outs, [1, 5], {})
    assert "embedding_own_codes" not in s and s["embedding"].snr_db == math.inf
    assert "not at hand" in s["embedding"].against
