"""The scoring fits, batched (issue #53): band.weighted_quantiles, the band, its quantiles, the
calibrated interval, the band refit, ridge's features and HAR, against the per-column code
they replaced (tests/references.py), on a series with flat candles (windows of sigma 0) and
skipped windows, and with a point forecast whose column is the last close (as a column
that kept the baseline forecasts it): equal bit for bit, HAR within float rounding.
"""

import types

import numpy as np
import pytest

from cpbjax import band
from cpbjax.data import synthetic
from cpbjax.score import band_refit, baselines, evaluate, forecast, intervals
from cpbjax.score.series_arrays import SeriesArrays
from tests import references
from tests.fake_data import Probe, make_prep, probe_params

L, H = 30, 10
LEVELS = (0.1, 0.9)
INTERVAL = "1h"


@pytest.fixture(params=["sorted", "bracketed"])
def search(request, monkeypatch):
    """Both searches of band.weighted_quantiles: a sort of each whole column, and the
    strided sample's bracket that long columns get, here on short ones too."""
    if request.param == "bracketed":
        monkeypatch.setattr(band, "BRACKET_MIN_ROWS", 64)
        monkeypatch.setattr(band, "BRACKET_SAMPLE", 64)
    return request.param


def _reference_columns(values_NV, weights_N, levels):
    """[V, J] by the per-column reference, each column's NaN entries left out."""
    out = []
    for column in values_NV.T:
        ok = ~np.isnan(column)
        out.append(
            [references.reference_weighted_quantile(column[ok], weights_N[ok], q) for q in levels]
        )
    return np.array(out)


def _columns(n, seed, left_out=0.05):
    """[n, 6] values (one column of many ties, one scaled up) with NaN left-outs, and
    weights [n] some of them 0."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, 6)) * [1.0, 1.0, 30.0, 1.0, 0.1, 1.0]
    values[:, 1] = np.round(values[:, 1], 1)
    values[rng.random(values.shape) < left_out] = np.nan
    weights = rng.gamma(2.0, 1.0, n)
    weights[rng.random(n) < 0.02] = 0.0
    return values, weights


@pytest.mark.parametrize("n", [40, 3000])
def test_weighted_quantiles_pick_what_a_sort_of_each_column_picks(search, n):
    levels = (0.05, 0.1, 0.5, 0.9, 1.0)
    for seed in range(3):
        values, weights = _columns(n, seed)
        got = band.weighted_quantiles(values, weights, levels)
        np.testing.assert_array_equal(got, _reference_columns(values, weights, levels))


def test_long_columns_are_searched_in_a_bracket_with_the_same_picks(monkeypatch):
    values, weights = _columns(3 * band.BRACKET_MIN_ROWS, seed=7)
    sorted_rows = []
    sort = band._sorted_quantiles
    monkeypatch.setattr(
        band, "_sorted_quantiles", lambda k, *a: sorted_rows.append(len(k)) or sort(k, *a)
    )
    got = band.weighted_quantiles(values, weights, LEVELS)
    np.testing.assert_array_equal(got, _reference_columns(values, weights, LEVELS))
    assert sorted_rows and max(sorted_rows) < len(values) // 2  # only the samples were sorted


@pytest.mark.parametrize("setting", [("BRACKET_SE", 0.0), ("PICK_MARGIN", 1e12)])
def test_a_missed_bracket_or_a_pick_too_close_to_call_falls_back_to_the_sort(monkeypatch, setting):
    """A bracket of width 0 misses the pick; a huge margin calls every pick too close."""
    monkeypatch.setattr(band, "BRACKET_MIN_ROWS", 64)
    monkeypatch.setattr(band, "BRACKET_SAMPLE", 64)
    monkeypatch.setattr(band, *setting)
    values, weights = _columns(2000, seed=5)
    keys = np.where(np.isnan(values), np.inf, values)
    total = weights @ ~np.isnan(values)
    _, exact = band._bracketed_quantiles(keys, weights, total, LEVELS)
    assert not exact.all()
    got = band.weighted_quantiles(values, weights, LEVELS)
    np.testing.assert_array_equal(got, _reference_columns(values, weights, LEVELS))


@pytest.mark.parametrize("left_out", [0.05, 0.0])
def test_a_valid_infinite_value_is_not_taken_for_a_left_out_one(search, left_out):
    values, weights = _columns(300, seed=2, left_out=left_out)
    values[::7, 0] = np.inf
    got = band.weighted_quantiles(values, weights, (0.5, 1.0))
    np.testing.assert_array_equal(got, _reference_columns(values, weights, (0.5, 1.0)))
    assert got[0, 1] == np.inf


def test_a_column_without_weight_raises_no_range():
    values, weights = _columns(100, seed=1)
    values[:, 3] = np.nan
    with pytest.raises(band.NoRange):
        band.weighted_quantiles(values, weights, (0.5,))
    with pytest.raises(band.NoRange):
        band.weighted_quantiles(values[:, :1], np.zeros(100), (0.5,))


# ---------------------------------------------------------------------------------------
# One 1h series: 60 flat candles (a halted pair: windows inside have sigma 0, targets
# inside have no range) and 50 window ends skipped (as around a gap in the candles).


@pytest.fixture(scope="module")
def series():
    s = synthetic.generate("BTCUSDT", INTERVAL, 900, seed=3)
    ohlc = s.ohlcv[:, :4].copy()
    ohlc[200:260] = ohlc[200:260, 3:4]
    ends = np.setdiff1d(np.arange(L - 1, 880), np.arange(400, 450))
    split = {"train": ends[:600], "val": ends[600:700], "test": ends[700:]}
    prep = types.SimpleNamespace(
        ohlc=ohlc, open_time_ms=s.open_time_ms, interval=INTERVAL, ends=split, name="BTCUSDT-1h"
    )
    assert (references.reference_ewma_range(ohlc, ends, L) == 0).sum() > 10  # flat windows
    return prep


def _points(prep, ends, seed):
    """Point forecasts [N, H, C] of the windows ending at `ends`: noise around the actual
    candles, and close at the last close (a column that kept the baseline's forecast)."""
    rng = np.random.default_rng(seed)
    actual = prep.ohlc[ends[:, None] + np.arange(1, H + 1)]
    point = actual * np.exp(rng.normal(0.0, 0.01, actual.shape))
    point[..., 3] = prep.ohlc[ends, 3][:, None]
    return point


def test_band_fits_equal_the_per_column_fits(search, series):
    fit = baselines.fit_ends(series, "test")
    k = band.fit_vol_band(series.ohlc, fit, L, H)
    want_high, want_low = references.reference_fit_vol_band(series.ohlc, fit, L, H)
    np.testing.assert_array_equal(k["k_high_h"], want_high)
    np.testing.assert_array_equal(k["k_low_h"], want_low)
    sigma = references.reference_ewma_range(series.ohlc, fit, L)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = references.reference_log_ratios(series.ohlc, fit, H) / sigma[:, None, None]
    ok = np.broadcast_to((sigma > 0)[:, None, None], score.shape)
    np.testing.assert_array_equal(
        intervals.fit_band_quantiles(series.ohlc, fit, L, H, LEVELS),
        references.reference_score_quantiles(score, ok, sigma, LEVELS, "sigma"),
    )


@pytest.mark.parametrize("weighting", ["sigma", "none"])
def test_calibration_equals_the_per_column_quantiles(search, series, weighting):
    fit, spec = baselines.fit_ends(series, "test"), evaluate.EvalSpec(L, H, LEVELS)
    point = _points(series, fit, seed=0)
    scale = intervals.scale_settings(INTERVAL, *intervals.VOL_BLEND)
    got = intervals.fit_calibration(series, fit, point, spec, weighting, scale)["k"]
    s = intervals.interval_scale(series.ohlc, fit, L, scale)
    actual = series.ohlc[fit[:, None] + np.arange(1, H + 1)]
    ok = (s[:, None, None] > 0) & (point > 0) & (actual > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.log(actual / point) / s[:, None, None]
    want = references.reference_score_quantiles(score, ok, s, LEVELS, weighting)
    np.testing.assert_array_equal(np.array(got), want)


def test_band_refit_equals_the_per_step_medians(search, series):
    fcs = {
        s: forecast.SplitForecast(series.ends[s], _points(series, series.ends[s], seed=i), None)
        for i, s in enumerate(("train", "val"))
    }
    got = band_refit.fit_shift(series, fcs, ("train", "val"), L, H)
    fit = baselines.fit_ends(series, "test")
    pred = np.concatenate([fcs["train"].prices_NHC, fcs["val"].prices_NHC])
    np.testing.assert_array_equal(got, references.reference_fit_shift(series.ohlc, fit, pred, L, H))


def test_har_equals_the_lstsq_of_its_whole_design(search, series):
    fit, scored = baselines.fit_ends(series, "test"), series.ends["test"]
    times = series.open_time_ms
    har = baselines.fit_har(series.ohlc, times, INTERVAL, fit, H)
    high, low = baselines.har_predict(har, series.ohlc, times, INTERVAL, scored, H)
    coef, k_high, k_low, want_high, want_low = references.reference_fit_har(
        series.ohlc, times, INTERVAL, fit, scored, H
    )
    np.testing.assert_allclose(har["coef"], coef, rtol=1e-9, atol=1e-10 * np.abs(coef).max())
    for got, want in (
        (har["k_high_h"], k_high),
        (har["k_low_h"], k_low),
        (high, want_high),
        (low, want_low),
    ):
        np.testing.assert_allclose(got, want, rtol=1e-9)


def test_har_solves_collinear_volatilities_by_the_lstsq_of_its_design():
    """Under a week of candles the week's and the month's volatilities are the same
    expanding mean: the normal equations are singular, and lstsq's minimum-norm solution
    stands (the same design and targets: the same coefficients)."""
    s = synthetic.generate("ETHUSDT", INTERVAL, 150, seed=4)
    ohlc, times = s.ohlcv[:, :4].copy(), s.open_time_ms
    fit, scored = np.arange(L - 1, 120), np.arange(120, 140)
    har = baselines.fit_har(ohlc, times, INTERVAL, fit, H)
    coef, k_high, _, want_high, _ = references.reference_fit_har(
        ohlc, times, INTERVAL, fit, scored, H
    )
    np.testing.assert_array_equal(har["coef"], coef)
    np.testing.assert_allclose(har["k_high_h"], k_high, rtol=1e-12)
    high, _ = baselines.har_predict(har, ohlc, times, INTERVAL, scored, H)
    np.testing.assert_allclose(high, want_high, rtol=1e-12)


def test_ridge_features_equal_the_gathered_windows(series):
    ends = baselines.fit_ends(series, "test")
    np.testing.assert_array_equal(
        baselines.ridge_features(series.ohlc, ends, L),
        references.reference_ridge_features(series.ohlc, ends, L),
    )


def test_series_arrays_keep_the_bits_of_the_direct_calls(series):
    arrays, ends = SeriesArrays(series.ohlc), series.ends["val"]
    sigma = arrays.sigma(ends.astype(np.int32), L)
    np.testing.assert_array_equal(sigma, references.reference_ewma_range(series.ohlc, ends, L))
    assert arrays.sigma(ends.copy(), L) is sigma  # the same ends, by value: kept
    assert arrays.sigma(ends[:-1], L) is not sigma
    np.testing.assert_array_equal(
        arrays.log_ratios(ends, H), references.reference_log_ratios(series.ohlc, ends, H)
    )
    with pytest.raises(ValueError):
        sigma[0] = 1.0  # shared by every reader: read only


def test_scores_sharing_one_series_arrays_equal_fresh_ones():
    prep, spec = make_prep(), evaluate.EvalSpec(8, 3, LEVELS, interval_vol=intervals.VOL_BLEND)
    fcs = {s: forecast.split_forecast(Probe(), probe_params(), prep, s, spec) for s in prep.ends}
    shared = SeriesArrays(prep.ohlc)
    for split in ("val", "test"):
        point = {s: fcs[s].prices_NHC for s in ("train", "val", "test")}
        calibration = intervals.fit_before(prep, split, point, spec, shared)
        assert calibration == intervals.fit_before(prep, split, point, spec)
        got = evaluate.evaluate_split(prep, fcs[split], split, spec, calibration, shared)
        assert got == evaluate.evaluate_split(prep, fcs[split], split, spec, calibration)
        assert "calibrated_interval" in got and "har" in got
