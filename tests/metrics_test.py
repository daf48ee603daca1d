"""Tests of cpbjax.score.metrics and cpbjax.score.baselines: price-space statistics and fitted baselines (numpy)."""

import os
import subprocess
import sys

import chex
import numpy as np
import pytest
from scipy import stats

from cpbjax import band, columns
from cpbjax.score import baselines, metrics
from tests.fake_data import H, L, make_prep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------
# Errors, naive baselines, skill.


def test_errors_hand_computed():
    actual = np.array([[[10.0], [20.0]], [[10.0], [40.0]]])  # [N=2, H=2, 1]
    pred = np.array([[[11.0], [18.0]], [[7.0], [40.0]]])
    # Errors: h=1: +1, -3; h=2: -2, 0.
    e = metrics.errors(actual, pred, columns=("close",))["close"]
    np.testing.assert_allclose(e["mae_h"], [2.0, 1.0])
    np.testing.assert_allclose(e["mae"], 1.5)
    np.testing.assert_allclose(e["rmse_h"], [np.sqrt(5.0), np.sqrt(2.0)])
    np.testing.assert_allclose(e["rmse"], np.sqrt(14.0 / 4))
    np.testing.assert_allclose(e["mape_h"], [100 * (0.1 + 0.3) / 2, 100 * (0.1 + 0.0) / 2])
    np.testing.assert_allclose(e["mape"], 100 * 0.5 / 4)


def test_naive_forecasts():
    last = np.array([[1.0, 4.0, 0.5, 2.0], [3.0, 5.0, 2.0, 4.0]])
    naive = metrics.naive_forecasts(last, 2)
    chex.assert_shape(naive["persistence"], (2, 2, 4))
    np.testing.assert_array_equal(naive["persistence"][1, 1], [4.0, 4.0, 4.0, 4.0])
    np.testing.assert_array_equal(naive["last_candle"][0, 1], [1.0, 4.0, 0.5, 2.0])


def test_skill_uses_the_better_naive_per_column():
    last = np.array([[100.0, 110.0, 90.0, 100.0]] * 2)
    # Future highs near 110 (last_candle wins), lows near 100 (persistence wins).
    actual = np.tile(np.array([100.0, 109.0, 99.0, 101.0]), (2, 1, 1))  # [2, 1, 4]
    pred = np.tile(np.array([100.0, 108.0, 100.5, 100.0]), (2, 1, 1))
    cols = metrics.score_prices(last, actual, pred)["columns"]
    assert cols["high"]["best_naive"] == "last_candle"
    assert cols["low"]["best_naive"] == "persistence"
    assert cols["close"]["best_naive"] == "persistence"  # a tie: persistence is preferred
    np.testing.assert_allclose(cols["high"]["naive_mae"], 1.0)
    np.testing.assert_allclose(cols["high"]["skill"], 1 - 1.0 / 1.0)
    np.testing.assert_allclose(cols["low"]["naive_mae"], 1.0)
    np.testing.assert_allclose(cols["low"]["skill"], 1 - 1.5 / 1.0)
    np.testing.assert_allclose(cols["close"]["skill_h"], [0.0])
    np.testing.assert_allclose(cols["high"]["naive"]["persistence"]["mae"], 9.0)


# ---------------------------------------------------------------------------
# Direction.


def test_direction_hand_computed_with_ties():
    last = np.array([10.0, 10.0, 10.0, 10.0])
    actual = np.array([[11.0, 9.0], [9.0, 10.0], [10.0, 12.0], [12.0, 13.0]])
    pred = np.array([[12.0, 11.0], [9.5, 8.0], [11.0, 11.0], [10.0, 14.0]])
    # h=1: signs actual (+,-,0,+), pred (+,-,+,0) -> scored windows 0,1: both hits.
    # h=2: actual (-,0,+,+), pred (+,-,+,+) -> scored 0,2,3: hits at 2,3.
    d = metrics.direction(last, actual, pred)
    assert d["scored_h"] == [2, 3]
    np.testing.assert_allclose(d["accuracy_h"], [1.0, 2 / 3])
    np.testing.assert_allclose(d["up_share_h"], [0.5, 2 / 3])
    assert d["scored"] == 5
    np.testing.assert_allclose(d["accuracy"], 4 / 5)
    np.testing.assert_allclose(d["up_share"], 3 / 5)


def test_always_up_scores_up_share_and_is_not_significant():
    rng = np.random.default_rng(0)
    n = 400
    last = np.full(n, 100.0)
    actual = 100.0 + np.where(rng.random((n, 2)) < 0.7, 1.0, -1.0)
    pred = np.full((n, 2), 101.0)
    d = metrics.direction(last, actual, pred)
    np.testing.assert_allclose(d["accuracy"], d["up_share"])
    assert d["up_share"] > 0.6
    assert min(d["p_value_h"]) >= 0.5  # no better than the majority class


def test_direction_significant_for_a_real_signal():
    rng = np.random.default_rng(1)
    n = 500
    last = np.full(n, 100.0)
    move = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    actual = (100.0 + move)[:, None]
    right = rng.random(n) < 0.8
    pred = (100.0 + np.where(right, move, -move))[:, None]
    d = metrics.direction(last, actual, pred)
    assert d["p_value_h"][0] < 1e-6


# ---------------------------------------------------------------------------
# Diebold-Mariano.


def _dm_reference(d, lag):
    """Plain DM with Newey-West variance and the HLN factor, written out by loops."""
    n = len(d)
    mean = sum(d) / n
    gammas = []
    for k in range(lag + 1):
        total = 0.0
        for t in range(k, n):
            total += (d[t] - mean) * (d[t - k] - mean)
        gammas.append(total / n)
    lrv = gammas[0] + 2 * sum((1 - k / (lag + 1)) * gammas[k] for k in range(1, lag + 1))
    h = lag + 1
    stat = mean / np.sqrt(lrv / n) * np.sqrt((n + 1 - 2 * h + h * (h - 1) / n) / n)
    return stat, stats.t.cdf(stat, n - 1), 2 * stats.t.sf(abs(stat), n - 1)


@pytest.mark.parametrize("lag", [0, 2, 9])
def test_dm_matches_reference(lag):
    rng = np.random.default_rng(lag)
    e = rng.standard_normal(203)
    d = np.convolve(e, np.ones(lag + 1), mode="valid") + 0.1  # MA(lag) differential
    loss_ref = rng.random(len(d))
    out = metrics.diebold_mariano(loss_ref + d, loss_ref, lag)
    stat, p_better, p_two = _dm_reference(list(d), lag)
    np.testing.assert_allclose(out["statistic"], stat, rtol=1e-10)
    np.testing.assert_allclose(out["p_value_better"], p_better, rtol=1e-10)
    np.testing.assert_allclose(out["p_value_two_sided"], p_two, rtol=1e-10)
    assert out["n"] == len(d) and out["lag"] == lag


def test_dm_equal_and_better_models():
    rng = np.random.default_rng(3)
    n, h = 300, 5
    actual = np.cumsum(rng.standard_normal(n + h)) + 1000.0
    naive = np.repeat(actual[:n, None], h, axis=1)  # [N, H]
    target = np.stack([actual[i + 1 : i + 1 + h] for i in range(n)])
    naive_loss = np.abs(naive - target)
    same = metrics.diebold_mariano(naive_loss.mean(1), naive_loss.mean(1), h - 1)
    assert same["p_value_better"] == 0.5 and same["p_value_two_sided"] == 1.0
    noisy = np.abs(naive + rng.standard_normal(naive.shape) - target).mean(1)
    assert metrics.diebold_mariano(noisy, naive_loss.mean(1), h - 1)["p_value_better"] > 0.5
    good = np.abs(target + 0.1 * rng.standard_normal(target.shape) - target).mean(1)
    assert metrics.diebold_mariano(good, naive_loss.mean(1), h - 1)["p_value_better"] < 1e-6


def test_close_dm_lags_h_minus_1_as_a_loop_over_the_close_errors():
    """close_dm tests window-mean close errors with the HAC lag H-1 (overlapping windows'
    errors are correlated up to H-1 windows apart) and step h's errors with lag h-1: the
    same numbers as _dm_reference on differentials built by a loop. On these overlapping
    windows lag 0 gives a statistic far from lag H-1's, so a wrong lag cannot pass."""
    rng = np.random.default_rng(11)
    n, h = 240, 6
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n + h)))
    idx_NH = np.arange(n)[:, None] + np.arange(1, h + 1)[None, :]
    actual = np.repeat(close[idx_NH][..., None], 4, axis=2)  # [N, H, C]
    ref = np.repeat(close[:n, None, None], h, axis=1).repeat(4, axis=2)  # persistence
    pred = ref + 0.7 * (actual - ref) + rng.normal(0.0, 0.3, actual.shape)
    assert columns.COLUMNS[3] == "close"
    d, d_h = [], [[] for _ in range(h)]
    for t in range(n):
        errs = [
            abs(pred[t, j, 3] - actual[t, j, 3]) - abs(ref[t, j, 3] - actual[t, j, 3])
            for j in range(h)
        ]
        d.append(sum(errs) / h)
        for j in range(h):
            d_h[j].append(errs[j])
    out = metrics.close_dm(actual, pred, ref, "last_close")
    assert out["lag"] == h - 1 and out["n"] == n and out["baseline"] == "last_close"
    stat, p_better, p_two = _dm_reference(d, h - 1)
    np.testing.assert_allclose(out["statistic"], stat, rtol=1e-10)
    np.testing.assert_allclose(out["p_value_better"], p_better, rtol=1e-10)
    np.testing.assert_allclose(out["p_value_two_sided"], p_two, rtol=1e-10)
    per_step = [_dm_reference(d_h[j], j)[1] for j in range(h)]
    np.testing.assert_allclose(out["p_value_better_h"], per_step, rtol=1e-10)
    assert abs(_dm_reference(d, 0)[0] / stat - 1) > 0.2  # the lag matters on this data


# ---------------------------------------------------------------------------
# Fitted baselines.


def test_ridge_matches_augmented_least_squares():
    prep = make_prep()
    ends = baselines.fit_ends(prep, "test")
    fit = baselines.fit_ridge(prep.ohlc, ends, L, H, alpha=3.0)
    x = baselines.ridge_features(prep.ohlc, ends, L)
    z = (x - x.mean(0)) / x.std(0)
    y = np.log(prep.ohlc[ends[:, None] + np.arange(1, H + 1)]).reshape(len(ends), -1)
    y = y - np.repeat(np.log(prep.ohlc[ends, 3]), H * 4).reshape(len(ends), -1)
    y = y - y.mean(0)
    p = z.shape[1]
    coef = np.linalg.lstsq(
        np.vstack([z, np.sqrt(3.0) * np.eye(p)]),
        np.vstack([y, np.zeros((p, y.shape[1]))]),
        rcond=None,
    )[0]
    np.testing.assert_allclose(fit["coef"], coef, rtol=1e-6, atol=1e-10)
    assert x.shape[1] == (L - 1) + L + 3


def test_weighted_median_minimises_weighted_abs_deviation():
    rng = np.random.default_rng(4)
    v, w = rng.standard_normal(31), rng.random(31)
    k = band.weighted_median(v, w)
    cost = lambda c: np.sum(w * np.abs(v - c))
    assert all(cost(k) <= cost(c) + 1e-12 for c in v)


def test_fitted_baselines_never_see_test_candles():
    prep = make_prep()
    fit_on = baselines.fit_ends(prep, "test")
    np.testing.assert_array_equal(fit_on, np.concatenate([prep.ends["train"], prep.ends["val"]]))
    last_read = fit_on.max() + H  # the newest candle a fitted window reads
    assert last_read < prep.ends["test"][0] + 1  # before the first test target

    def fits(ohlc):
        return (
            baselines.fit_ridge(ohlc, fit_on, L, H)["coef"],
            band.fit_vol_band(ohlc, fit_on, L, H)["k_high_h"],
        )

    before = fits(prep.ohlc)
    changed = prep.ohlc.copy()
    noise = np.random.default_rng(5).normal(0, 0.05, (len(changed) - last_read - 1, 1))
    changed[last_read + 1 :] *= np.exp(noise)  # every test-period candle moves
    after = fits(changed)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    # The same kind of change on the newest fitted candle does move the fit.
    changed[last_read] *= 1.05
    assert not np.array_equal(before[0], fits(changed)[0])


def test_metrics_and_baselines_import_without_jax():
    # The statistics are numpy only: they must work where jax is not installed.
    code = (
        "import sys; sys.modules['jax'] = None; import cpbjax.score.metrics, cpbjax.score.baselines"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
