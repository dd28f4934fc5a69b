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
