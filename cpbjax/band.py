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
    log_TC = np.log(ohlc_TC)  # each candle's log once (the same bits as after the gather)
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    return log_TC[idx_NH] - log_TC[ends_N, CLOSE][:, None, None]


def weighted_quantiles(values_NV, weights_NV, levels_J) -> np.ndarray:
    """The minimisers k of sum_n weights * pinball_q(values - k) of V columns at J levels
    q, float64 [V, J], from one sort of each column: level 0.5 is the weighted median
    (the least-absolute-deviation fit); intervals.py fits others.

    An entry of weight 0 is never picked, so an invalid entry (of any value, NaN too) is
    left out by giving it weight 0: the cumulative weights only repeat at it, and the
    search picks the entry a sort of the valid entries alone picks, bit for bit (up to
    the order in which exactly tied values are summed).

    Args:
      values_NV: float [N, V], one column per fit. weights_NV: >= 0, [N, V] or [N, 1].
      levels_J: the levels q, in (0, 1].

    Raises:
      NoRange: a column without a positive weight (the weights are sigmas: all 0 when
        every window is flat), where the minimiser is any k.
    """
    values_VN = np.asarray(values_NV, np.float64).T
    weights_VN = np.broadcast_to(np.asarray(weights_NV, np.float64).T, values_VN.shape)
    order_VN = np.argsort(values_VN, axis=1)
    cum_VN = np.cumsum(np.take_along_axis(weights_VN, order_VN, axis=1), axis=1)
    total_V1 = cum_VN[:, -1:] if cum_VN.shape[1] else np.zeros((len(cum_VN), 1))
    if not (total_V1 > 0).all():
        raise NoRange(f"no window with a positive weight among {cum_VN.shape[1]} to fit on")
    # searchsorted, column by column: the first entry whose cumulative weight reaches q
    at_VJ = np.stack([np.count_nonzero(cum_VN < q * total_V1, axis=1) for q in levels_J], 1)
    return np.take_along_axis(values_VN, np.take_along_axis(order_VN, at_VJ, axis=1), axis=1)


def weighted_quantile(values_N, weights_N, level: float) -> float:
    """`weighted_quantiles` of one column at one level."""
    values_N1, weights_N1 = np.asarray(values_N)[:, None], np.asarray(weights_N)[:, None]
    return float(weighted_quantiles(values_N1, weights_N1, [level])[0, 0])


def weighted_median(values, weights) -> float:
    """The minimiser of sum(weights * |values - k|) over k."""
    return weighted_quantile(values, weights, 0.5)


def fit_vol_band(ohlc_TC, fit_ends_N, lookback, horizon, decay=EWMA_DECAY) -> dict:
    """k_h of high = close * exp(k_h * sigma), low = close * exp(-k_h * sigma).

    Raises:
      NoRange: no fit window has a range (`require_range`).
    """
    sigma_N = require_range(ohlc_TC, fit_ends_N, lookback, decay)
    return band_factors(sigma_N, future_log_ratios(ohlc_TC, fit_ends_N, horizon), decay)


def band_factors(sigma_N, ratios_NHC, decay=EWMA_DECAY) -> dict:
    """`fit_vol_band` from the fit windows' sigma [N] (`require_range`'s) and future log
    ratios [N, H, C].

    Each k_h is the least-absolute-deviation fit in log space, i.e. minimises
    sum_t |log(high[t+h] / close[t]) - k_h * sigma_t|: a weighted median of the
    ratios with weights sigma_t. Windows with sigma = 0 carry no information.
    """
    ok = sigma_N > 0
    s_N = sigma_N[ok]
    # [N, H, 2]: how far high rose and low fell, in sigmas
    moves_NH2 = (
        np.stack([ratios_NHC[ok, :, HIGH], -ratios_NHC[ok, :, LOW]], -1) / s_N[:, None, None]
    )
    k_V1 = weighted_quantiles(moves_NH2.reshape(len(s_N), -1), s_N[:, None], [0.5])
    k_H2 = k_V1.reshape(-1, 2)
    return {"k_high_h": k_H2[:, 0], "k_low_h": k_H2[:, 1], "decay": decay}


def require_range(ohlc_TC, fit_ends_N, lookback, decay=EWMA_DECAY) -> np.ndarray:
    """sigma [N] of the fit windows, where at least one is above 0.

    Raises:
      NoRange: every fit window's candles are flat (or there is no fit window).
    """
    return check_range(ewma_range(ohlc_TC, np.asarray(fit_ends_N, np.int64), lookback, decay))


def check_range(sigma_N) -> np.ndarray:
    """sigma_N [N] of the fit windows, or NoRange where none is above 0."""
    if not (sigma_N > 0).any():
        raise NoRange(
            "flat candles: the volatility band has no window with a range to fit on "
            f"(high == low in every candle of its {len(sigma_N)} fit windows)"
        )
    return sigma_N


def vol_band_predict(fit, ohlc_TC, ends_N, lookback):
    """Band forecasts in prices: (high [N, H], low [N, H])."""
    sigma_N = ewma_range(ohlc_TC, ends_N, lookback, fit["decay"])
    return band_prices(fit, ohlc_TC[ends_N, CLOSE], sigma_N)


def band_prices(fit, close_N, sigma_N):
    """`vol_band_predict` from the windows' last close [N] and sigma [N] (of fit's decay)."""
    sigma_N1, close_N1 = sigma_N[:, None], close_N[:, None]
    return close_N1 * np.exp(fit["k_high_h"] * sigma_N1), close_N1 * np.exp(
        -fit["k_low_h"] * sigma_N1
    )
