"""Fitted baselines, scored beside every model: ridge regression and a volatility band (numpy only).

Both are fitted on the windows of the splits before the scored one only (train+val for
test, train for val), so no score is in-sample:
  - ridge: a fixed-alpha ridge regression from the window's close log returns and
    log(high/low) ranges to the H x 4 future log ratios;
  - vol_band: high/low = last close * exp(+-k_h * EWMA of log(high/low)), with per-step
    factors k_h fitted by least absolute deviation.
"""

from __future__ import annotations

import numpy as np

from cpbjax.metrics import (
    CLOSE,
    close_dm,
    errors,
    json_floats,
    naive_forecasts,
    next_candles,
    skill,
)

RIDGE_ALPHA = 10.0  # Fixed ridge penalty on standardised features; never tuned on test.
EWMA_DECAY = 0.9  # Weight ratio between consecutive candles of the window's range EWMA.


def _window_log_prices(ohlc_TC, ends_N, lookback):
    idx_NL = ends_N[:, None] + np.arange(-lookback + 1, 1)[None, :]
    return np.log(ohlc_TC[idx_NL])  # [N, L, 4]


def future_log_ratios(ohlc_TC, ends_N, horizon):
    """log(OHLC[t+h] / close[t]) of each window, float64 [N, H, 4]."""
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    return np.log(ohlc_TC[idx_NH]) - np.log(ohlc_TC[ends_N, CLOSE])[:, None, None]


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


def ewma_range(ohlc_TC, ends_N, lookback, decay=EWMA_DECAY):
    """EWMA of log(high/low) over each window's own L candles (newest weighs most), [N]."""
    logp_NLC = _window_log_prices(ohlc_TC, ends_N, lookback)
    weights_L = decay ** np.arange(lookback - 1, -1, -1, dtype=np.float64)
    return (logp_NLC[..., 1] - logp_NLC[..., 2]) @ weights_L / weights_L.sum()


def weighted_median(values, weights) -> float:
    """The minimiser of sum(weights * |values - k|) over k."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, 0.5 * cum[-1])])


def fit_vol_band(ohlc_TC, fit_ends_N, lookback, horizon, decay=EWMA_DECAY) -> dict:
    """k_h of high = close * exp(k_h * sigma), low = close * exp(-k_h * sigma).

    Each k_h is the least-absolute-deviation fit in log space, i.e. minimises
    sum_t |log(high[t+h] / close[t]) - k_h * sigma_t|: a weighted median of the
    ratios with weights sigma_t. Windows with sigma = 0 carry no information.
    """
    sigma_N = ewma_range(ohlc_TC, fit_ends_N, lookback, decay)
    ratios_NHC = future_log_ratios(ohlc_TC, fit_ends_N, horizon)
    ok = sigma_N > 0
    s = sigma_N[ok]
    k_high = [weighted_median(ratios_NHC[ok, j, 1] / s, s) for j in range(horizon)]
    k_low = [weighted_median(-ratios_NHC[ok, j, 2] / s, s) for j in range(horizon)]
    return {"k_high_h": np.array(k_high), "k_low_h": np.array(k_low), "decay": decay}


def vol_band_predict(fit, ohlc_TC, ends_N, lookback):
    """Band forecasts in prices: (high [N, H], low [N, H])."""
    sigma_N1 = ewma_range(ohlc_TC, ends_N, lookback, fit["decay"])[:, None]
    close_N1 = ohlc_TC[ends_N, CLOSE][:, None]
    return close_N1 * np.exp(fit["k_high_h"] * sigma_N1), close_N1 * np.exp(
        -fit["k_low_h"] * sigma_N1
    )


def fit_ends(prep, split):
    """Windows a baseline may be fitted on when scoring `split`: the splits before it.

    Test is scored with a fit on train+val; val with a fit on train alone, so that
    no score is in-sample.
    """
    before = {"train": (), "val": ("train",), "test": ("train", "val")}[split]
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


def fitted_predictions(prep, split, ends_N, lookback, horizon):
    """Ridge and volatility-band forecasts of `split`'s windows, fitted on the splits before it.

    Returns:
      (ridge prices float64 [N, H, 4], band prices float64 [N, H, 2] (high, low), the
      fitted band, the number of windows fitted on).
    """
    fit_on = fit_ends(prep, split)
    ridge = fit_ridge(prep.ohlc, fit_on, lookback, horizon)
    ridge_pred = ridge_predict(ridge, prep.ohlc, ends_N, lookback, horizon)
    band = fit_vol_band(prep.ohlc, fit_on, lookback, horizon)
    high, low = vol_band_predict(band, prep.ohlc, ends_N, lookback)
    return ridge_pred, np.stack([high, low], axis=-1), band, len(fit_on)


def fitted_baselines(prep, split, ends_N, lookback, horizon, model_cols) -> dict:
    """Ridge and volatility-band scores on `split`, fitted on the splits before it."""
    ohlc, actual = prep.ohlc, next_candles(prep.ohlc, ends_N, horizon)
    ridge_pred, band_pred, band, fitted = fitted_predictions(prep, split, ends_N, lookback, horizon)
    best = model_cols["close"]["best_naive"]
    ref = naive_forecasts(ohlc[ends_N], horizon)[best]
    return {
        "ridge": {
            "alpha": RIDGE_ALPHA,
            "fit_windows": int(fitted),
            "columns": _against_naive(errors(actual, ridge_pred), model_cols),
            "dm": close_dm(actual, ridge_pred, ref, best),
        },
        "vol_band": {
            "ewma_decay": EWMA_DECAY,
            "fit_windows": int(fitted),
            "k_high_h": json_floats(band["k_high_h"]),
            "k_low_h": json_floats(band["k_low_h"]),
            "columns": _against_naive(
                errors(actual[..., 1:3], band_pred, ("high", "low")), model_cols
            ),
        },
    }
