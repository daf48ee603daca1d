"""Fitted baselines, scored beside every model: ridge, a volatility band and HAR (numpy only).

All are fitted on the windows of the splits before the scored one only (train+val for
test, train for val), so no score is in-sample:
  - ridge: a fixed-alpha ridge regression from the window's close log returns and
    log(high/low) ranges to the H x 4 future log ratios;
  - vol_band: high/low = last close * exp(+-k_h * EWMA of log(high/low)), with per-step
    factors k_h fitted by least absolute deviation;
  - har: high/low = last close * exp(+-k_h * sigma_hat[t, h]), where log sigma_hat is a
    least-squares HAR regression of the log of candle t+h's log(high/low) on the log
    Parkinson and Garman-Klass volatilities over 1 day, 1 week and 1 month of candles up
    to t, plus one level per UTC hour of day of candle t+h (known at t: it is the
    calendar); k_h again by least absolute deviation. Close is persistence (HAR makes
    no close forecast), so only high and low are scored, like vol_band.

HAR reads only the kept candles up to each window's end t. Where fewer than a span's
candles lie before t, its volatility is the mean over the candles there are (an
expanding mean; every window has at least its own L). A flat candle (high == low) has
no log range: it is left out of the least-squares fit, not out of k_h or the scores.

Shapes (docs/design.md): N windows, H steps, C OHLC columns, T candles, X regressors.
"""

from __future__ import annotations

import numpy as np

from cpbjax import band
from cpbjax.band import EWMA_DECAY, window_index
from cpbjax.columns import CLOSE, HIGH, LOW
from cpbjax.data import features
from cpbjax.data.series import INTERVAL_MS
from cpbjax.score.metrics import (
    close_dm,
    errors,
    json_floats,
    naive_forecasts,
    skill,
)
from cpbjax.score.series_arrays import SeriesArrays

RIDGE_ALPHA = 10.0  # Fixed ridge penalty on standardised features; never tuned on test.
HOUR_MS = 3_600_000
# HAR's volatility regressors, in the order of its coefficients (features.py's names).
HAR_REGRESSORS = tuple(
    f"{est}_{span}" for est in features.VOL_ESTIMATORS for span in features.SPANS_MS
)


def ridge_features(ohlc_TC, ends_N, lookback):
    """Close log returns, log(high/low) ranges and the last candle's shape, [N, X]."""
    log_TC = np.log(ohlc_TC)  # each candle's log, return and range once, not L times
    return_T = np.concatenate([[np.nan], np.diff(log_TC[:, CLOSE])])  # from the candle before
    index_NL = window_index(np.asarray(ends_N), lookback)
    returns = return_T[index_NL[:, 1:]]  # [N, L-1]
    ranges = (log_TC[:, HIGH] - log_TC[:, LOW])[index_NL]  # [N, L]
    shape = log_TC[ends_N, :3] - log_TC[ends_N, CLOSE:]  # [N, 3] open/high/low vs close
    return np.concatenate([returns, ranges, shape], axis=1)


def fit_ridge(ohlc_TC, fit_ends_N, lookback, horizon, alpha=RIDGE_ALPHA, arrays=None) -> dict:
    """Closed-form ridge from standardised features to the H x 4 future log ratios.

    The intercept is not penalised (features and targets are centred first).
    arrays: the series' SeriesArrays, where it is scored (a fresh one by default).
    """
    arrays = arrays or SeriesArrays(ohlc_TC)
    x_NX = ridge_features(ohlc_TC, fit_ends_N, lookback)
    y_NO = arrays.log_ratios(fit_ends_N, horizon).reshape(len(fit_ends_N), -1)
    x_mean, x_scale = x_NX.mean(axis=0), x_NX.std(axis=0)
    x_scale = np.where(x_scale > 0, x_scale, 1.0)
    z_NX = (x_NX - x_mean) / x_scale
    y_mean = y_NO.mean(axis=0)
    gram = z_NX.T @ z_NX + alpha * np.eye(z_NX.shape[1])
    coef = np.linalg.solve(gram, z_NX.T @ (y_NO - y_mean))
    return {"x_mean": x_mean, "x_scale": x_scale, "y_mean": y_mean, "coef": coef}


def ridge_predict(fit, ohlc_TC, ends_N, lookback, horizon):
    """Ridge forecasts in prices, float64 [N, H, 4]."""
    z_NX = (ridge_features(ohlc_TC, ends_N, lookback) - fit["x_mean"]) / fit["x_scale"]
    log_ratio = (z_NX @ fit["coef"] + fit["y_mean"]).reshape(len(ends_N), horizon, 4)
    return ohlc_TC[ends_N, CLOSE][:, None, None] * np.exp(log_ratio)


def har_log_vols(ohlc_TC, interval) -> np.ndarray:
    """HAR's 6 log volatilities (HAR_REGRESSORS) at every candle t, float64 [T, 6]: over
    each span's candles up to t (an expanding mean before a full span)."""
    o, h, lo, c = np.asarray(ohlc_TC, np.float64).T
    per_candle = {
        "parkinson": features.parkinson_var(h, lo),
        "garman_klass": features.garman_klass_var(o, h, lo, c),
    }
    spans, vols = features.window_candles(interval), []
    for name in HAR_REGRESSORS:
        estimator, _, span = name.rpartition("_")
        vols.append(features.log_volatility(per_candle[estimator], spans[span], 1))
    return np.stack(vols, axis=1)


def har_hours(open_time_ms_T, interval, ends_N, horizon) -> np.ndarray:
    """The UTC hour of day of candle t+h of each window, int64 [N, H] (known at t: it is
    the calendar)."""
    steps_H = np.arange(1, horizon + 1, dtype=np.int64) * INTERVAL_MS[interval]
    target_ms_NH = np.asarray(open_time_ms_T, np.int64)[ends_N][:, None] + steps_H
    return (target_ms_NH % features.DAY_MS) // HOUR_MS


def har_design(vols_NX, hours_NH) -> np.ndarray:
    """HAR's regressors of step h of each window, float64 [N, H, X] (X = 6 + 24): the
    6 log volatilities at the window's end t, the same for every step, then a one-hot
    UTC hour of day of candle t+h."""
    n, horizon = hours_NH.shape
    hours_NHX = (hours_NH[..., None] == np.arange(24)).astype(np.float64)
    vols_NHX = np.broadcast_to(vols_NX[:, None, :], (n, horizon, vols_NX.shape[1]))
    return np.concatenate([vols_NHX, hours_NHX], axis=-1)


def har_sigma(coef_X, vols_NX, hours_NH) -> np.ndarray:
    """HAR's forecast sigma_hat [N, H]: exp(the regression `har_design` @ coef)."""
    num_vols = vols_NX.shape[1]
    return np.exp((vols_NX @ coef_X[:num_vols])[:, None] + coef_X[num_vols:][hours_NH])


# Above this condition number of the hour-demeaned regressors' correlations, HAR's normal
# equations would lose more than ~1e-10 of the coefficients: np.linalg.lstsq of the
# whole design solves them (real series: at most ~3e4; collinear only on short ones).
HAR_COND_LIMIT = 1e6


def har_least_squares(vols_NX, hours_NH, y_NH, ok_NH) -> np.ndarray:
    """The least-squares coef [X] of y on `har_design` over the (window, step) pairs ok_NH.

    The design is the window's log volatilities plus one level per hour, so the
    volatilities' coefficients are those of the regression on them less their mean in
    each hour (Frisch-Waugh-Lovell): 6 x 6 normal equations, summed per window (its
    volatilities are the same at every step) and per hour, never per pair. Each hour's
    level is then its mean y less its mean volatilities times them (0 for an hour without
    a pair, as the minimum-norm solution of the whole design has it). Where the demeaned
    volatilities are (nearly) collinear, the whole design goes to np.linalg.lstsq.
    """
    n = len(vols_NX)
    steps_N = np.count_nonzero(ok_NH, axis=1).astype(np.float64)
    if not steps_N.any():  # no pair: lstsq's zeros
        return np.zeros(vols_NX.shape[1] + 24)
    # pairs per window and hour [N, 24], and per hour [24]
    pairs_N24 = np.bincount(
        (np.arange(n)[:, None] * 24 + hours_NH)[ok_NH], minlength=n * 24
    ).reshape(n, 24)
    count_24 = pairs_N24.sum(axis=0)
    seen_24, per_pair_24 = count_24 > 0, 1.0 / np.maximum(count_24, 1)
    # centred first, so that no sum below cancels most of its digits
    center_X, y_center = steps_N @ vols_NX / steps_N.sum(), y_NH[ok_NH].mean()
    c_NX = vols_NX - center_X
    yc_NH = np.where(ok_NH, y_NH - y_center, 0.0)
    sums_24X = pairs_N24.T.astype(np.float64) @ c_NX
    y_sums_24 = np.bincount(hours_NH[ok_NH], yc_NH[ok_NH], minlength=24)
    gram_XX = c_NX.T @ (steps_N[:, None] * c_NX) - sums_24X.T @ (sums_24X * per_pair_24[:, None])
    rhs_X = c_NX.T @ yc_NH.sum(axis=1) - sums_24X.T @ (y_sums_24 * per_pair_24)
    scale_X = np.sqrt(np.maximum(np.diag(gram_XX), 0.0))
    if (
        not (scale_X > 0).all()
        or np.linalg.cond(gram_XX / np.outer(scale_X, scale_X)) > HAR_COND_LIMIT
    ):
        design_AX = har_design(vols_NX, hours_NH)[ok_NH]
        return np.linalg.lstsq(design_AX, y_NH[ok_NH], rcond=None)[0]
    beta_X = np.linalg.solve(gram_XX, rhs_X)
    mean_vols_24X = sums_24X * per_pair_24[:, None] + center_X
    level_24 = y_sums_24 * per_pair_24 + y_center - mean_vols_24X @ beta_X
    return np.concatenate([beta_X, np.where(seen_24, level_24, 0.0)])


def fit_har(ohlc_TC, open_time_ms_T, interval, fit_ends_N, horizon, arrays=None) -> dict:
    """HAR coefficients (least squares on log log-ranges) and LAD step factors k_h.

    The regression pools every (window, step) with a non-flat target candle; the hour
    levels act as the intercept. k_h minimises sum_t |log(high[t+h] / close[t]) -
    k_h * sigma_hat[t, h]| as in `fit_vol_band` (low alike, with the sign turned).
    arrays: the series' SeriesArrays, where it is scored (a fresh one by default).
    """
    arrays = arrays or SeriesArrays(ohlc_TC)
    fit_ends_N = np.asarray(fit_ends_N, np.int64)
    vols_NX = _har_vols(arrays, interval)[fit_ends_N]
    hours_NH = har_hours(open_time_ms_T, interval, fit_ends_N, horizon)
    next_NHC = arrays.next_candles(fit_ends_N, horizon)
    range_NH = np.log(next_NHC[..., HIGH] / next_NHC[..., LOW])
    ok_NH = range_NH > 0
    with np.errstate(divide="ignore"):  # a flat target candle's: -inf, left out (ok_NH)
        log_range_NH = np.log(range_NH)
    coef_X = har_least_squares(vols_NX, hours_NH, log_range_NH, ok_NH)
    sigma_NH = har_sigma(coef_X, vols_NX, hours_NH)
    ratios_NHC = arrays.log_ratios(fit_ends_N, horizon)
    # [N, H, 2]: how far high rose and low fell, in sigma_hats, weighted by step h's sigma_hat
    moves_NH2 = np.stack([ratios_NHC[..., HIGH], -ratios_NHC[..., LOW]], -1) / sigma_NH[..., None]
    k_H2 = np.stack(
        [
            band.weighted_quantiles(moves_NH2[:, h], sigma_NH[:, h], [0.5])[:, 0]
            for h in range(horizon)
        ]
    )
    return {"coef": coef_X, "k_high_h": k_H2[:, 0], "k_low_h": k_H2[:, 1]}


def _har_vols(arrays, interval) -> np.ndarray:
    """`har_log_vols` of the series, computed once per SeriesArrays, [T, 6]."""
    return arrays.once(("har_log_vols", interval), lambda: har_log_vols(arrays.ohlc_TC, interval))


def har_predict(fit, ohlc_TC, open_time_ms_T, interval, ends_N, horizon, arrays=None):
    """HAR band forecasts in prices: (high [N, H], low [N, H])."""
    arrays = arrays or SeriesArrays(ohlc_TC)
    ends_N = np.asarray(ends_N, np.int64)
    hours_NH = har_hours(open_time_ms_T, interval, ends_N, horizon)
    sigma_NH = har_sigma(fit["coef"], _har_vols(arrays, interval)[ends_N], hours_NH)
    close_N1 = ohlc_TC[ends_N, CLOSE][:, None]
    return close_N1 * np.exp(fit["k_high_h"] * sigma_NH), close_N1 * np.exp(
        -fit["k_low_h"] * sigma_NH
    )


# The splits a fit may use when `split` is scored: those before it, so no score is in-sample.
SPLITS_BEFORE = {"train": (), "val": ("train",), "test": ("train", "val")}


def fit_ends(prep, split):
    """Windows a baseline may be fitted on when scoring `split`: the splits before it.

    Test is scored with a fit on train+val; val with a fit on train alone, so that
    no score is in-sample.
    """
    before = SPLITS_BEFORE[split]
    if not before:
        raise ValueError("fitted baselines are scored on 'val' or 'test', not 'train'")
    return np.concatenate([prep.ends[s] for s in before]).astype(np.int64)


def _against_naive(errs: dict, model_cols: dict) -> dict:
    """Adds skill against the column's best naive (the one the model is judged by)."""
    out = {}
    for col, e in errs.items():
        ref = model_cols[col]["naive"][model_cols[col]["best_naive"]]
        out[col] = dict(
            e,
            skill=skill(e["mae"], ref["mae"]),
            skill_h=[skill(a, b) for a, b in zip(e["mae_h"], ref["mae_h"], strict=True)],
        )
    return out


def fitted_predictions(prep, split, ends_N, spec):
    """Ridge and volatility-band forecasts of `split`'s windows, fitted on the splits before
    it (spec: the run's evaluate.EvalSpec, its window sizes).

    Returns:
      (ridge prices float64 [N, H, 4], band prices float64 [N, H, 2] (high, low), the
      fitted band, the number of windows fitted on).
    """
    fit_on, lookback, horizon = fit_ends(prep, split), spec.lookback, spec.horizon
    arrays = SeriesArrays(prep.ohlc)
    ridge = fit_ridge(prep.ohlc, fit_on, lookback, horizon, arrays=arrays)
    ridge_pred = ridge_predict(ridge, prep.ohlc, ends_N, lookback, horizon)
    fit, (high, low) = _vol_band(arrays, fit_on, ends_N, spec)
    return ridge_pred, np.stack([high, low], axis=-1), fit, len(fit_on)


def _vol_band(arrays, fit_on, ends_N, spec):
    """(the volatility band fitted on the windows ending at fit_on, its (high [N, H],
    low [N, H]) forecasts of those ending at ends_N)."""
    sigma_N = band.check_range(arrays.sigma(fit_on, spec.lookback))
    fit = band.band_factors(sigma_N, arrays.log_ratios(fit_on, spec.horizon))
    close_N = arrays.ohlc_TC[ends_N, CLOSE]
    return fit, band.band_prices(fit, close_N, arrays.sigma(ends_N, spec.lookback))


def har_band(prep, split, ends_N, horizon) -> np.ndarray:
    """HAR's high and low forecasts of `split`'s windows, fitted on the splits before it:
    prices float64 [N, H, 2]."""
    times, interval, arrays = prep.open_time_ms, prep.interval, SeriesArrays(prep.ohlc)
    har = fit_har(prep.ohlc, times, interval, fit_ends(prep, split), horizon, arrays)
    high_NH, low_NH = har_predict(har, prep.ohlc, times, interval, ends_N, horizon, arrays)
    return np.stack([high_NH, low_NH], axis=-1)


def fitted_baselines(prep, split, ends_N, spec, model_cols, arrays=None) -> dict:
    """Ridge, volatility-band and HAR scores on `split`, fitted on the splits before it
    (spec: the run's evaluate.EvalSpec, its window sizes; arrays: the series'
    SeriesArrays where it is scored, a fresh one by default)."""
    arrays = arrays or SeriesArrays(prep.ohlc)
    fit_on, actual = fit_ends(prep, split), arrays.next_candles(ends_N, spec.horizon)
    return {
        "ridge": _ridge_block(prep, fit_on, ends_N, spec, actual, model_cols, arrays),
        "vol_band": _band_block(fit_on, ends_N, spec, actual, model_cols, arrays),
        "har": _har_block(prep, fit_on, ends_N, spec.horizon, actual, model_cols, arrays),
    }


def _high_low_columns(actual_NHC, high_NH, low_NH, model_cols) -> dict:
    pred_NH2 = np.stack([high_NH, low_NH], axis=-1)
    return _against_naive(errors(actual_NHC[..., 1:3], pred_NH2, ("high", "low")), model_cols)


def _ridge_block(prep, fit_on, ends_N, spec, actual_NHC, model_cols, arrays) -> dict:
    """results.json's "ridge": all four columns, and DM on close against the best naive."""
    lookback, horizon = spec.lookback, spec.horizon
    ridge = fit_ridge(prep.ohlc, fit_on, lookback, horizon, arrays=arrays)
    pred_NHC = ridge_predict(ridge, prep.ohlc, ends_N, lookback, horizon)
    best = model_cols["close"]["best_naive"]
    ref_NHC = naive_forecasts(prep.ohlc[ends_N], horizon)[best]
    return {
        "alpha": RIDGE_ALPHA,
        "fit_windows": int(len(fit_on)),
        "columns": _against_naive(errors(actual_NHC, pred_NHC), model_cols),
        "dm": close_dm(actual_NHC, pred_NHC, ref_NHC, best),
    }


def _band_block(fit_on, ends_N, spec, actual_NHC, model_cols, arrays) -> dict:
    """results.json's "vol_band": its k_h and its high/low scores."""
    fit, (high_NH, low_NH) = _vol_band(arrays, fit_on, ends_N, spec)
    return {
        "ewma_decay": EWMA_DECAY,
        "fit_windows": int(len(fit_on)),
        "k_high_h": json_floats(fit["k_high_h"]),
        "k_low_h": json_floats(fit["k_low_h"]),
        "columns": _high_low_columns(actual_NHC, high_NH, low_NH, model_cols),
    }


def _har_block(prep, fit_on, ends_N, horizon, actual_NHC, model_cols, arrays) -> dict:
    """results.json's "har": its volatility coefficients, k_h and high/low scores."""
    times, interval = prep.open_time_ms, prep.interval
    har = fit_har(prep.ohlc, times, interval, fit_on, horizon, arrays)
    high_NH, low_NH = har_predict(har, prep.ohlc, times, interval, ends_N, horizon, arrays)
    return {
        "fit_windows": int(len(fit_on)),
        "spans": features.window_candles(interval),
        "coef": dict(
            zip(HAR_REGRESSORS, json_floats(har["coef"][: len(HAR_REGRESSORS)]), strict=True)
        ),
        "k_high_h": json_floats(har["k_high_h"]),
        "k_low_h": json_floats(har["k_low_h"]),
        "columns": _high_low_columns(actual_NHC, high_NH, low_NH, model_cols),
    }
