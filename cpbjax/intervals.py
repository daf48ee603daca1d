"""How sure a quantile forecast is: coverage, width and pinball loss, against a fitted band.

A model with config.model.quantiles forecasts J levels of every column and step. This
module scores those levels in price units (numpy only), next to the volatility band's own
quantiles: level q of column c at step h is close * exp(k_{h,c,q} * sigma), sigma the
window's EWMA log range (baselines.ewma_range), with k the pinball-loss minimiser on the
windows of the splits before the scored one (baselines.fit_ends), as every fitted
baseline here is.
Shape letters (docs/design.md): N windows, H steps, C OHLC columns, J quantile levels.
"""

from __future__ import annotations

import numpy as np

from cpbjax import baselines
from cpbjax.metrics import COLUMNS, json_float, json_floats, next_candles


def pinball(actual, pred_J, levels_J) -> np.ndarray:
    """Pinball loss of each level, in the units of the forecasts: pred_J is `actual`'s
    shape plus a trailing axis of J levels, and so is the result."""
    r = np.asarray(pred_J, np.float64) - np.asarray(actual, np.float64)[..., None]
    q_J = np.asarray(levels_J, np.float64)
    return np.maximum(-r * q_J, r * (1.0 - q_J))


def fit_band_quantiles(ohlc_TC, fit_ends_N, lookback, horizon, levels_J) -> np.ndarray:
    """k [H, C, J] of the band's quantiles, fitted by pinball loss in log space.

    sum_i pinball_q(r_i - k * sigma_i) = sum_i sigma_i * pinball_q(r_i / sigma_i - k), so
    each k is a sigma-weighted quantile of r / sigma (r = log(price[t+h] / close[t])).
    """
    sigma_N = baselines.ewma_range(ohlc_TC, fit_ends_N, lookback)
    ratios_NHC = baselines.future_log_ratios(ohlc_TC, fit_ends_N, horizon)
    ok = sigma_N > 0
    s_N = sigma_N[ok]
    k = np.zeros((horizon, ratios_NHC.shape[2], len(levels_J)))
    for h in range(horizon):
        for c in range(ratios_NHC.shape[2]):
            for j, q in enumerate(levels_J):
                k[h, c, j] = baselines.weighted_quantile(ratios_NHC[ok, h, c] / s_N, s_N, q)
    return k


def band_quantiles(k_HCJ, ohlc_TC, ends_N, lookback) -> np.ndarray:
    """The band's quantile forecasts in prices, [N, H, C, J]."""
    sigma_N = baselines.ewma_range(ohlc_TC, ends_N, lookback)
    close_N = ohlc_TC[ends_N, 3]
    return close_N[:, None, None, None] * np.exp(k_HCJ[None] * sigma_N[:, None, None, None])


def _column(actual_NH, pred_NHJ, band_NHJ, levels_J) -> dict:
    """The interval scores of one column; the central interval is the outermost levels."""
    lo_NH, hi_NH = pred_NHJ[..., 0], pred_NHJ[..., -1]
    inside_NH = (actual_NH >= lo_NH) & (actual_NH <= hi_NH)
    loss_NH = pinball(actual_NH, pred_NHJ, levels_J).mean(-1)  # mean over the levels
    band_NH = pinball(actual_NH, band_NHJ, levels_J).mean(-1)
    model_loss, band = float(loss_NH.mean()), float(band_NH.mean())
    return {
        "coverage": json_float(inside_NH.mean()),
        "coverage_h": json_floats(inside_NH.mean(0)),
        "width": json_float((hi_NH - lo_NH).mean()),
        "width_h": json_floats((hi_NH - lo_NH).mean(0)),
        "pinball": json_float(model_loss),
        "pinball_h": json_floats(loss_NH.mean(0)),
        "band_pinball": json_float(band),
        "band_pinball_h": json_floats(band_NH.mean(0)),
        "skill_vs_band": json_float(1.0 - model_loss / band) if band > 0 else None,
    }


def score_intervals(prep, split, ends_N, lookback, horizon, pred_NHCJ, levels_J) -> dict:
    """results.json's `intervals` block of one split: per column and step, model and band.

    Args:
      prep: windows.PreparedSeries. split: the scored split ("val" or "test").
      ends_N: its window ends. pred_NHCJ: the model's quantile forecasts in prices.
      levels_J: their levels, increasing; the central interval is the first to the last.
    """
    actual_NHC = next_candles(prep.ohlc, ends_N, horizon)
    fit_on = baselines.fit_ends(prep, split)
    k_HCJ = fit_band_quantiles(prep.ohlc, fit_on, lookback, horizon, levels_J)
    band_NHCJ = band_quantiles(k_HCJ, prep.ohlc, ends_N, lookback)
    return {
        "levels": [float(q) for q in levels_J],
        "central": [float(levels_J[0]), float(levels_J[-1])],
        "columns": {
            col: _column(actual_NHC[..., c], pred_NHCJ[..., c, :], band_NHCJ[..., c, :], levels_J)
            for c, col in enumerate(COLUMNS)
        },
    }
