"""The volatility band, in one place: high/low = last close * exp(+-k_h * sigma), where sigma
is the EWMA of log(high/low) over the window's L candles, newest weighing most.

Every network starts as this band (cpbjax/models/heads.py), the baselines score it
(cpbjax/score/baselines.py), the context reads sigma as its scale (cpbjax/data/context.py)
and the calibrated interval scales by it (cpbjax/score/intervals.py). sigma is here twice,
with one decay: from prices in numpy float64 (`ewma_range`) and from a window's normalised
inputs in JAX float32 (`window_range`). numpy only: the caller passes its array module
to `window_range`, so the numpy baselines never import jax.

Shapes (docs/design.md): T candles, N windows, L lookback, H steps, C OHLC columns, B batch.
"""

from __future__ import annotations

import numpy as np

from cpbjax.columns import CLOSE, HIGH, LOW

EWMA_DECAY = 0.9  # weight ratio between consecutive candles of sigma's EWMA


class NoRange(ValueError):
    """Flat candles (high == low, as in a halted pair's hours) wherever a fit would read
    them: sigma is 0 in every fit window, so the band (and every fit weighted by sigma)
    has nothing to fit on. The data layer skips such a series with this reason."""


def decay_weights(lookback: int, xp=np, dtype=np.float64, decay: float = EWMA_DECAY):
    """The EWMA's unnormalised weights [L], oldest candle first (array module `xp`)."""
    return decay ** xp.arange(lookback - 1, -1, -1, dtype=dtype)


def window_index(ends_N, lookback: int):
    """[N, L] the indices of each window's L candles, oldest first (any leading axes of
    ends, numpy or jax: stacking.gather_inputs slices the device's windows with it too)."""
    return ends_N[..., None] + np.arange(-lookback + 1, 1, dtype=np.int32)


def ewma_range(ohlc_TC, ends_N, lookback: int, decay: float = EWMA_DECAY) -> np.ndarray:
    """sigma of each window from its prices, float64 [N]."""
    log_range_T = np.log(ohlc_TC[:, HIGH]) - np.log(ohlc_TC[:, LOW])
    weights_L = decay_weights(lookback, decay=decay)
    return log_range_T[window_index(ends_N, lookback)] @ weights_L / weights_L.sum()


def window_range(x_BLF, xp, decay: float = EWMA_DECAY):
    """sigma of each window from its normalised inputs, float32 [B] (`xp`: jax.numpy).

    Under last_close normalisation the high and low input columns are log prices less
    one anchor, so their difference is the log range: the same number as `ewma_range`
    computes from prices.
    """
    range_BL = (x_BLF[..., HIGH] - x_BLF[..., LOW]).astype(xp.float32)
    w_L = decay_weights(x_BLF.shape[1], xp, xp.float32, decay)
    return range_BL @ (w_L / xp.sum(w_L))


def future_log_ratios(ohlc_TC, ends_N, horizon):
    """log(OHLC[t+h] / close[t]) of each window, float64 [N, H, 4]."""
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    return np.log(ohlc_TC[idx_NH]) - np.log(ohlc_TC[ends_N, CLOSE])[:, None, None]


def weighted_quantile(values, weights, level: float) -> float:
    """The minimiser k of sum(weights * pinball_level(values - k)): level 0.5 is the
    weighted median (the least-absolute-deviation fit); intervals.py fits other levels.

    Raises:
      NoRange: no value with a positive weight (the weights are sigmas: all 0 when
        every window is flat), where the minimiser is any k.
    """
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    if not len(cum) or not cum[-1] > 0:
        raise NoRange(f"no window with a positive weight among {len(cum)} to fit on")
    return float(values[order][np.searchsorted(cum, level * cum[-1])])


def weighted_median(values, weights) -> float:
    """The minimiser of sum(weights * |values - k|) over k."""
    return weighted_quantile(values, weights, 0.5)


def fit_vol_band(ohlc_TC, fit_ends_N, lookback, horizon, decay=EWMA_DECAY) -> dict:
    """k_h of high = close * exp(k_h * sigma), low = close * exp(-k_h * sigma).

    Each k_h is the least-absolute-deviation fit in log space, i.e. minimises
    sum_t |log(high[t+h] / close[t]) - k_h * sigma_t|: a weighted median of the
    ratios with weights sigma_t. Windows with sigma = 0 carry no information.

    Raises:
      NoRange: no fit window has a range (`require_range`).
    """
    sigma_N = require_range(ohlc_TC, fit_ends_N, lookback, decay)
    ratios_NHC = future_log_ratios(ohlc_TC, fit_ends_N, horizon)
    ok = sigma_N > 0
    s = sigma_N[ok]
    k_high = [weighted_median(ratios_NHC[ok, j, HIGH] / s, s) for j in range(horizon)]
    k_low = [weighted_median(-ratios_NHC[ok, j, LOW] / s, s) for j in range(horizon)]
    return {"k_high_h": np.array(k_high), "k_low_h": np.array(k_low), "decay": decay}


def require_range(ohlc_TC, fit_ends_N, lookback, decay=EWMA_DECAY) -> np.ndarray:
    """sigma [N] of the fit windows, where at least one is above 0.

    Raises:
      NoRange: every fit window's candles are flat (or there is no fit window).
    """
    sigma_N = ewma_range(ohlc_TC, np.asarray(fit_ends_N, np.int64), lookback, decay)
    if not (sigma_N > 0).any():
        raise NoRange(
            "flat candles: the volatility band has no window with a range to fit on "
            f"(high == low in every candle of its {len(sigma_N)} fit windows)"
        )
    return sigma_N


def vol_band_predict(fit, ohlc_TC, ends_N, lookback):
    """Band forecasts in prices: (high [N, H], low [N, H])."""
    sigma_N1 = ewma_range(ohlc_TC, ends_N, lookback, fit["decay"])[:, None]
    close_N1 = ohlc_TC[ends_N, CLOSE][:, None]
    return close_N1 * np.exp(fit["k_high_h"] * sigma_N1), close_N1 * np.exp(
        -fit["k_low_h"] * sigma_N1
    )
