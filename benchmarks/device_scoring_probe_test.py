"""benchmarks/device_scoring_probe.py's JAX kernels against numpy (no timing asserted)."""

import jax
import numpy as np

from benchmarks import device_scoring_probe as probe
from cpbjax import band


def test_the_jax_weighted_quantile_picks_band_py_s_values():
    rng = np.random.default_rng(0)
    values, weights = rng.standard_normal((3_000, 6)), rng.random(3_000)
    values[::7, 2] = values[1, 2]  # ties: the first value reaching q is still the pick
    levels = np.array([0.1, 0.5, 0.9])
    with jax.enable_x64(True):
        got = np.asarray(probe.weighted_quantiles(values, weights, levels))
    np.testing.assert_array_equal(got, band.weighted_quantiles(values, weights, levels))


def test_a_probe_row_per_kernel_and_size():
    rows = probe.probe(windows=500, repeats=1)
    assert [r["kernel"] for r in rows] == ["weighted quantile 40 x 2", "ridge Gram 62 x 62"]
    assert all(r["windows"] == rows[0]["windows"] > 400 for r in rows)
