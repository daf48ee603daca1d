"""experiments/global_model/score.py: the band's factors per series are the weighted
medians of a plain loop, and a series with no window to fit on gets none (NaN)."""

import numpy as np

from experiments.global_model import score

H = 3


def _plain_weighted_median(values, weights):
    """The smallest value whose cumulative weight reaches half of the total."""
    order = np.argsort(values)
    total, acc = weights.sum(), 0.0
    for i in order:
        acc += weights[i]
        if acc >= 0.5 * total:
            return values[i]
    raise AssertionError("unreachable")


def test_band_factors_match_a_plain_loop_and_a_series_without_fit_windows_gets_nan():
    rng = np.random.default_rng(0)
    n = 60
    t = {
        "names": np.array(["AUSDT-1h", "BUSDT-1h"]),
        "series": np.array([0] * 40 + [1] * 20),
        "split": np.array([0] * 30 + [1] * 5 + [2] * 5 + [2] * 20),  # B: test windows only
        "sigma": rng.uniform(0.005, 0.02, n).astype(np.float32),
        "y": rng.normal(0, 0.01, (n, H, 4)).astype(np.float32),
    }
    k = score.band_factors(t, (0, 1))
    assert k.shape == (2, H, 2) and np.isnan(k[1]).all()
    fit = slice(0, 35)
    s = t["sigma"][fit].astype(np.float64)
    for h in range(H):
        want_high = _plain_weighted_median(t["y"][fit][:, h, 1] / s, s)
        want_low = _plain_weighted_median(-t["y"][fit][:, h, 2] / s, s)
        np.testing.assert_allclose(k[0, h], [want_high, want_low], rtol=1e-12)
