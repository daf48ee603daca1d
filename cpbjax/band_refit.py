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
train+val, which is also the model that is saved.
Shapes (docs/design.md): N windows, H steps, C OHLC columns.
"""

from __future__ import annotations

import numpy as np

from cpbjax import baselines, forecast
from cpbjax.metrics import CLOSE
from cpbjax.models import common


def applies(module) -> bool:
    """Whether `module` has band factors to refit (model.baseline=vol_band)."""
    return getattr(getattr(module, "cfg", None), "baseline", None) == "vol_band"


def fit_shift(prep, fcs: dict, fit_splits, lookback: int, horizon: int) -> np.ndarray:
    """d [H, 2] (high, low): the factor shifts fitted on the model's forecasts `fcs`
    (split -> forecast.SplitForecast) of the splits `fit_splits`; 0 where no window
    has a range."""
    ends_N = np.concatenate([fcs[s].ends_N for s in fit_splits]).astype(np.int64)
    pred_NHC = np.concatenate([fcs[s].prices_NHC for s in fit_splits])
    close_N11 = prep.ohlc[ends_N, CLOSE][:, None, None]
    err_NHC = baselines.future_log_ratios(prep.ohlc, ends_N, horizon) - np.log(pred_NHC / close_N11)
    sigma_N = baselines.ewma_range(prep.ohlc, ends_N, lookback)
    ok = sigma_N > 0
    shift = np.zeros((horizon, 2))
    if not ok.any():
        return shift
    score_NHC, s = err_NHC[ok] / sigma_N[ok, None, None], sigma_N[ok]
    for h in range(horizon):
        shift[h, 0] = baselines.weighted_median(score_NHC[:, h, common.HIGH], s)
        shift[h, 1] = -baselines.weighted_median(score_NHC[:, h, common.LOW], s)
    return shift


def shifted(params, shift_H2) -> dict:
    """params with the band factors moved by shift_H2 [H, 2] (high, low)."""
    out = params["output"]
    k_H2 = np.stack([np.asarray(out["band_high"]), np.asarray(out["band_low"])], axis=-1)
    return common.with_band(params, (k_H2 + shift_H2).astype(np.float32))


def refit_per_split(module, params, prep, lookback: int, horizon: int):
    """({"val": params refit on train, "test": params refit on train+val},
    {"val": d, "test": d} with d the JSON-ready {"high": [H], "low": [H]} shifts)."""
    fcs = {
        s: forecast.split_forecast(module, params, prep, s, lookback, horizon)
        for s in ("train", "val")
    }
    fitted, shifts = {}, {}
    for split in ("val", "test"):
        shift = fit_shift(prep, fcs, baselines.SPLITS_BEFORE[split], lookback, horizon)
        fitted[split] = shifted(params, shift)
        shifts[split] = {"high": shift[:, 0].tolist(), "low": shift[:, 1].tolist()}
    return fitted, shifts
