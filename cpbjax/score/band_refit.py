"""Refitting a trained model's volatility band on its own errors (config.eval.refit_band).

With model.baseline=vol_band the model forecasts high = close * exp(c + k_h * sigma)
(low with -k'_h), c the network's correction, sigma the window's EWMA log range and
k, k' [H] the band factors (ForecastOutput's band_high, band_low). Training starts
them at the train split's fit and moves them by gradient on train windows only. The
fitted volatility band that every report scores against is refit on the splits before
the scored one (train+val for test), so it sees the newest volatility and the model
does not. The refit closes that gap the same way: per step h, a shift d_h of each factor
is the least-absolute-deviation fit of the model's own log errors on the windows of the
splits before the scored one,

  d_h = argmin_d sum_i |r_ih - p_ih - d * sigma_i|  (high; low with the signs turned),

i.e. a sigma-weighted median of (r - p) / sigma, r = log(high[t+h] / close[t]) and p the
model's forecast of it. Forecasts are linear in k, so the refit model is the trained one
with k + d: val is scored by the model refit on train, test by the one refit on
train+val, which is also the model that is saved. Being linear, the refit also moves
the trained model's forecasts without another forward pass (`shifted_forecast`).
Shapes (docs/design.md): N windows, H steps, C OHLC columns.
"""

from __future__ import annotations

import numpy as np

from cpbjax import band, columns
from cpbjax.columns import CLOSE
from cpbjax.models import heads
from cpbjax.score import baselines, forecast
from cpbjax.score.series_arrays import SeriesArrays

HIGH_LOW = np.array([columns.HIGH, columns.LOW])  # the columns the band moves


def applies(module) -> bool:
    """Whether `module` has band factors to refit (model.baseline=vol_band)."""
    return getattr(getattr(module, "cfg", None), "baseline", None) == "vol_band"


def fit_shift(prep, fcs: dict, fit_splits, lookback: int, horizon: int, arrays=None) -> np.ndarray:
    """d [H, 2] (high, low): the factor shifts fitted on the model's forecasts `fcs`
    (split -> forecast.SplitForecast) of the splits `fit_splits`; 0 where no window
    has a range. arrays: the series' SeriesArrays where it is scored (a fresh one by
    default)."""
    arrays = arrays or SeriesArrays(prep.ohlc)
    ends_N = np.concatenate([fcs[s].ends_N for s in fit_splits]).astype(np.int64)
    pred_NH2 = np.concatenate([fcs[s].prices_NHC[..., HIGH_LOW] for s in fit_splits])
    close_N11 = prep.ohlc[ends_N, CLOSE][:, None, None]
    ratios_NH2 = arrays.log_ratios(ends_N, horizon)[..., HIGH_LOW]
    err_NH2 = ratios_NH2 - np.log(pred_NH2 / close_N11)
    sigma_N = arrays.sigma(ends_N, lookback)
    ok = sigma_N > 0
    if not ok.any():
        return np.zeros((horizon, 2))
    s_N = sigma_N[ok]
    score_NV = (err_NH2[ok] / s_N[:, None, None]).reshape(len(s_N), -1)
    shift_H2 = band.weighted_quantiles(score_NV, s_N, [0.5]).reshape(horizon, 2)
    return shift_H2 * [1.0, -1.0]  # the low factor moves the low down


def shifted(params, shift_H2) -> dict:
    """params with the band factors moved by shift_H2 [H, 2] (high, low); an ensemble's
    members each move theirs by it, so their mean forecast moves as one model's would."""
    k_H2 = np.asarray(heads.band_factors(params))  # [Y, H, 2] for an ensemble
    return heads.with_band(params, (k_H2 + shift_H2).astype(np.float32))


def shifted_forecast(prep, fc: forecast.SplitForecast, shift_H2, lookback: int, arrays=None):
    """fc as the model with its band factors moved by shift_H2 [H, 2] forecasts it.

    The band enters each forecast additively in the log space (ForecastOutput: high +
    k_h * sigma, low - k'_h * sigma), so moving k by d moves
    the log forecast by d * sigma, with sigma the window's EWMA log range. One forward
    pass of the trained model thus serves every refit. It equals a forward pass of
    `shifted(params, shift_H2)` to float32 rounding (sigma here is float64 from prices).
    """
    sigma_N = (arrays or SeriesArrays(prep.ohlc)).sigma(fc.ends_N, lookback)
    log_move_NHC = np.zeros(fc.norm_NHC.shape)
    log_move_NHC[:, :, columns.HIGH] = shift_H2[None, :, 0] * sigma_N[:, None]
    log_move_NHC[:, :, columns.LOW] = -shift_H2[None, :, 1] * sigma_N[:, None]
    factor_NHC = np.exp(log_move_NHC)
    return forecast.SplitForecast(
        fc.ends_N,
        fc.prices_NHC * factor_NHC,
        (fc.norm_NHC + log_move_NHC).astype(fc.norm_NHC.dtype),
    )


def shift_json(shift_H2) -> dict:
    """results.json's band_refit entry of a split: {"high": [H], "low": [H]} shifts."""
    return {"high": shift_H2[:, 0].tolist(), "low": shift_H2[:, 1].tolist()}


def refit_for(split: str, prep, fcs: dict, spec, arrays=None):
    """(split -> the forecasts of `fcs` refit for scoring `split`, shift [H, 2]): the
    shift is fitted on the splits before `split` (train for val, train+val for test),
    and the forecasts of those splits and of `split` are refit;
    spec: the run's evaluate.EvalSpec (its window sizes); arrays: the series'
    SeriesArrays where it is scored (a fresh one by default)."""
    L, arrays = spec.lookback, arrays or SeriesArrays(prep.ohlc)
    before = baselines.SPLITS_BEFORE[split]
    shift_H2 = fit_shift(prep, fcs, before, L, spec.horizon, arrays)
    # the splits up to the scored one: what its scores read (its interval's fit, before it)
    refit = {s: shifted_forecast(prep, fcs[s], shift_H2, L, arrays) for s in (*before, split)}
    return refit, shift_H2
