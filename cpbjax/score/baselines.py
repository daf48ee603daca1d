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

from cpbjax.band import (
    EWMA_DECAY,
    fit_vol_band,
    future_log_ratios,
    vol_band_predict,
    weighted_median,
    window_index,
)
from cpbjax.columns import CLOSE
from cpbjax.data import features
from cpbjax.data.series import INTERVAL_MS
from cpbjax.score.metrics import (
    close_dm,
    errors,
    json_floats,
    naive_forecasts,
    next_candles,
    skill,
)

RIDGE_ALPHA = 10.0  # Fixed ridge penalty on standardised features; never tuned on test.
HOUR_MS = 3_600_000
# HAR's volatility regressors, in the order of its coefficients (features.py's names).
HAR_REGRESSORS = tuple(
    f"{est}_{span}" for est in features.VOL_ESTIMATORS for span in features.SPANS_MS
)


def _window_log_prices(ohlc_TC, ends_N, lookback):
    # [N, L, 4]; each candle's log once, not L times
    return np.log(ohlc_TC)[window_index(ends_N, lookback)]


def ridge_features(ohlc_TC, ends_N, lookback):
    """Close log returns, log(high/low) ranges and the last candle's shape, [N, X]."""
    logp_NLC = _window_log_prices(ohlc_TC, ends_N, lookback)
    returns = np.diff(logp_NLC[..., CLOSE], axis=1)  # [N, L-1]
    ranges = logp_NLC[..., 1] - logp_NLC[..., 2]  # [N, L]
    shape = logp_NLC[:, -1, :3] - logp_NLC[:, -1, CLOSE:]  # [N, 3] open/high/low vs close
    return np.concatenate([returns, ranges, shape], axis=1)


def fit_ridge(ohlc_TC, fit_ends_N, lookback, horizon, alpha=RIDGE_ALPHA) -> dict:
    """Closed-form ridge from standardised features to the H x 4 future log ratios.

    The intercept is not penalised (features and targets are centred first).
    """
    x_NX = ridge_features(ohlc_TC, fit_ends_N, lookback)
    y_NO = future_log_ratios(ohlc_TC, fit_ends_N, horizon).reshape(len(fit_ends_N), -1)
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


def har_design(ohlc_TC, open_time_ms_T, interval, ends_N, horizon) -> np.ndarray:
    """HAR's regressors of step h of each window, float64 [N, H, X] (X = 6 + 24).

    The 6 log volatilities at the window's end t (expanding before a full span), the
    same for every step, then a one-hot UTC hour of day of candle t+h.
    """
    o, h, lo, c = np.asarray(ohlc_TC, np.float64).T
    per_candle = {
        "parkinson": features.parkinson_var(h, lo),
        "garman_klass": features.garman_klass_var(o, h, lo, c),
    }
    spans, vols = features.window_candles(interval), []
    for name in HAR_REGRESSORS:
        estimator, _, span = name.rpartition("_")
        vols.append(features.log_volatility(per_candle[estimator], spans[span], 1)[ends_N])
    vols_NX = np.stack(vols, axis=1)
    steps_H = np.arange(1, horizon + 1, dtype=np.int64) * INTERVAL_MS[interval]
    target_ms_NH = np.asarray(open_time_ms_T, np.int64)[ends_N][:, None] + steps_H
    hour_NH = (target_ms_NH % features.DAY_MS) // HOUR_MS
    hours_NHX = (hour_NH[..., None] == np.arange(24)).astype(np.float64)
    vols_NHX = np.broadcast_to(vols_NX[:, None, :], (len(ends_N), horizon, vols_NX.shape[1]))
    return np.concatenate([vols_NHX, hours_NHX], axis=-1)


def fit_har(ohlc_TC, open_time_ms_T, interval, fit_ends_N, horizon) -> dict:
    """HAR coefficients (least squares on log log-ranges) and LAD step factors k_h.

    The regression pools every (window, step) with a non-flat target candle; the hour
    levels act as the intercept. k_h minimises sum_t |log(high[t+h] / close[t]) -
    k_h * sigma_hat[t, h]| as in `fit_vol_band` (low alike, with the sign turned).
    """
    z_NHX = har_design(ohlc_TC, open_time_ms_T, interval, fit_ends_N, horizon)
    idx_NH = fit_ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    range_NH = np.log(ohlc_TC[idx_NH, 1] / ohlc_TC[idx_NH, 2])
    ok_NH = range_NH > 0
    coef_X = np.linalg.lstsq(z_NHX[ok_NH], np.log(range_NH[ok_NH]), rcond=None)[0]
    sigma_NH = np.exp(z_NHX @ coef_X)
    ratios_NHC = future_log_ratios(ohlc_TC, fit_ends_N, horizon)
    k_high = [
        weighted_median(ratios_NHC[:, j, 1] / sigma_NH[:, j], sigma_NH[:, j])
        for j in range(horizon)
    ]
    k_low = [
        weighted_median(-ratios_NHC[:, j, 2] / sigma_NH[:, j], sigma_NH[:, j])
        for j in range(horizon)
    ]
    return {"coef": coef_X, "k_high_h": np.array(k_high), "k_low_h": np.array(k_low)}


def har_predict(fit, ohlc_TC, open_time_ms_T, interval, ends_N, horizon):
    """HAR band forecasts in prices: (high [N, H], low [N, H])."""
    sigma_NH = np.exp(har_design(ohlc_TC, open_time_ms_T, interval, ends_N, horizon) @ fit["coef"])
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
    ridge = fit_ridge(prep.ohlc, fit_on, lookback, horizon)
    ridge_pred = ridge_predict(ridge, prep.ohlc, ends_N, lookback, horizon)
    band = fit_vol_band(prep.ohlc, fit_on, lookback, horizon)
    high, low = vol_band_predict(band, prep.ohlc, ends_N, lookback)
    return ridge_pred, np.stack([high, low], axis=-1), band, len(fit_on)


def har_band(prep, split, ends_N, horizon) -> np.ndarray:
    """HAR's high and low forecasts of `split`'s windows, fitted on the splits before it:
    prices float64 [N, H, 2]."""
    times, interval = prep.open_time_ms, prep.interval
    har = fit_har(prep.ohlc, times, interval, fit_ends(prep, split), horizon)
    return np.stack(har_predict(har, prep.ohlc, times, interval, ends_N, horizon), axis=-1)


def fitted_baselines(prep, split, ends_N, spec, model_cols) -> dict:
    """Ridge, volatility-band and HAR scores on `split`, fitted on the splits before it
    (spec: the run's evaluate.EvalSpec, its window sizes)."""
    fit_on, actual = fit_ends(prep, split), next_candles(prep.ohlc, ends_N, spec.horizon)
    return {
        "ridge": _ridge_block(prep, fit_on, ends_N, spec, actual, model_cols),
        "vol_band": _band_block(prep, fit_on, ends_N, spec, actual, model_cols),
        "har": _har_block(prep, fit_on, ends_N, spec.horizon, actual, model_cols),
    }


def _high_low_columns(actual_NHC, high_NH, low_NH, model_cols) -> dict:
    pred_NH2 = np.stack([high_NH, low_NH], axis=-1)
    return _against_naive(errors(actual_NHC[..., 1:3], pred_NH2, ("high", "low")), model_cols)


def _ridge_block(prep, fit_on, ends_N, spec, actual_NHC, model_cols) -> dict:
    """results.json's "ridge": all four columns, and DM on close against the best naive."""
    lookback, horizon = spec.lookback, spec.horizon
    ridge = fit_ridge(prep.ohlc, fit_on, lookback, horizon)
    pred_NHC = ridge_predict(ridge, prep.ohlc, ends_N, lookback, horizon)
    best = model_cols["close"]["best_naive"]
    ref_NHC = naive_forecasts(prep.ohlc[ends_N], horizon)[best]
    return {
        "alpha": RIDGE_ALPHA,
        "fit_windows": int(len(fit_on)),
        "columns": _against_naive(errors(actual_NHC, pred_NHC), model_cols),
        "dm": close_dm(actual_NHC, pred_NHC, ref_NHC, best),
    }


def _band_block(prep, fit_on, ends_N, spec, actual_NHC, model_cols) -> dict:
    """results.json's "vol_band": its k_h and its high/low scores."""
    band = fit_vol_band(prep.ohlc, fit_on, spec.lookback, spec.horizon)
    high_NH, low_NH = vol_band_predict(band, prep.ohlc, ends_N, spec.lookback)
    return {
        "ewma_decay": EWMA_DECAY,
        "fit_windows": int(len(fit_on)),
        "k_high_h": json_floats(band["k_high_h"]),
        "k_low_h": json_floats(band["k_low_h"]),
        "columns": _high_low_columns(actual_NHC, high_NH, low_NH, model_cols),
    }


def _har_block(prep, fit_on, ends_N, horizon, actual_NHC, model_cols) -> dict:
    """results.json's "har": its volatility coefficients, k_h and high/low scores."""
    times, interval = prep.open_time_ms, prep.interval
    har = fit_har(prep.ohlc, times, interval, fit_on, horizon)
    high_NH, low_NH = har_predict(har, prep.ohlc, times, interval, ends_N, horizon)
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
