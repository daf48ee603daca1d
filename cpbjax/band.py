"""The volatility band, in one place: high/low = last close * exp(+-k_h * sigma), where sigma
is the EWMA of log(high/low) over the window's L candles, newest weighing most.

Every network starts as this band (cpbjax/models/heads.py), the baselines score it
(cpbjax/score/baselines.py), the context reads sigma as its scale (cpbjax/data/context.py)
and the calibrated interval scales by it (cpbjax/score/intervals.py). sigma is here twice,
with one decay: from prices in numpy float64 (`ewma_range`) and from a window's normalised
inputs in JAX float32 (`window_range`). numpy only: the caller passes its array module
to `window_range`, so the numpy baselines never import jax.

It also owns the weighted quantile every scoring fit takes (`weighted_quantiles`: the band's
k_h, HAR's, the band refit's shifts and the calibrated interval's k), batched over columns.

Shapes (docs/design.md): T candles, N windows, L lookback, H steps, C OHLC columns, B batch,
V the columns of one weighted_quantiles call, J its levels.
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


# Columns of more rows than this search each quantile among the values a strided sample
# brackets it with (`_bracketed_quantiles`) instead of sorting the whole column: the same
# picks, 1.6x (an interval's 2 levels) to 2x (a median) faster for 60,000 windows
# (benchmarks/quantile_speed.py; the sorts of the values inside are small).
BRACKET_MIN_ROWS = 8192
BRACKET_SAMPLE = 2048  # rows of that sample
BRACKET_SE = 5.0  # the bracket's half width in standard errors of the sample's quantile
# The bracketed search keeps a pick only where q of the total weight lies this many times
# n * eps of the total away from the cumulative weights around it: further than any sum's
# rounding (at most n * eps / 2 of the total, summed in any order) can move them.
PICK_MARGIN = 8.0


def weighted_quantiles(values_NV, weights_N, levels_J) -> np.ndarray:
    """The minimisers k of sum_n weights * pinball_q(values - k) of V columns at J levels
    q, float64 [V, J]: level 0.5 is the weighted median (the least-absolute-deviation
    fit); intervals.py fits others. Each is the first value, in ascending order, at which
    the cumulative weight reaches q of the column's total.

    An entry is left out by giving it the value NaN: it is sorted last (as +inf, which
    keeps numpy's vectorised sort), so the valid entries come first, in the order a sort
    of them alone gives, and the pick is the same entry, bit for bit (up to the order in
    which exactly tied values are summed). A long column is searched near the pick only
    (`_bracketed_quantiles`), with the same result.

    Args:
      values_NV: float [N, V], one column per fit, NaN where an entry is left out.
      weights_N: float >= 0 [N], the weight of each row in every column.
      levels_J: the levels q, in (0, 1].

    Raises:
      NoRange: a column without a positive weight (the weights are sigmas: all 0 when
        every window is flat), where the minimiser is any k.
    """
    values_NV, weights_N = np.asarray(values_NV, np.float64), np.asarray(weights_N, np.float64)
    left_out_NV = np.isnan(values_NV)
    any_left_out = left_out_NV.any()
    if any_left_out:
        total_V, count_V = weights_N @ ~left_out_NV, len(values_NV) - left_out_NV.sum(axis=0)
        keys_NV = np.where(left_out_NV, np.inf, values_NV)
    else:  # every column's total weight is the same
        total_V = np.full(values_NV.shape[1], weights_N.sum())
        count_V, keys_NV = np.full(values_NV.shape[1], len(values_NV)), values_NV
    if not (total_V > 0).all():
        raise NoRange(f"no window with a positive weight among {len(weights_N)} to fit on")
    if any_left_out and np.isposinf(values_NV).any():  # +inf ties the left-out
        ones = [(values_NV[~out, v, None], ~out) for v, out in enumerate(left_out_NV.T)]
        return np.concatenate(
            [_sorted_quantiles(x, [len(x)], weights_N[ok], levels_J) for x, ok in ones]
        )
    if len(keys_NV) < BRACKET_MIN_ROWS:
        return _sorted_quantiles(keys_NV, count_V, weights_N, levels_J)
    out_VJ, exact_VJ = _bracketed_quantiles(keys_NV, weights_N, total_V, levels_J)
    redo_V = ~exact_VJ.all(axis=1)  # a bracket that missed, or a pick too close to call
    if redo_V.any():
        out_VJ[redo_V] = _sorted_quantiles(keys_NV[:, redo_V], count_V[redo_V], weights_N, levels_J)
    return out_VJ


def _sorted_quantiles(keys_NV, count_V, weights_N, levels_VJ) -> np.ndarray:
    """`weighted_quantiles` [V, J] of the first count_V [V] keys of each column in
    ascending order (the others: +inf, left out), from a sort of the column; levels_VJ:
    [J], or a level per column [V, J]."""
    keys_VN = np.ascontiguousarray(keys_NV.T)
    order_VN = np.argsort(keys_VN, axis=1)
    cum_VN = np.cumsum(np.take(weights_N, order_VN), axis=1)
    levels_VJ = np.asarray(levels_VJ, np.float64)
    levels_VJ = np.broadcast_to(levels_VJ, (len(keys_VN), levels_VJ.shape[-1]))
    out_VJ = np.empty(levels_VJ.shape)
    for v, (n, cum_N) in enumerate(zip(count_V, cum_VN, strict=True)):
        # the first entry whose cumulative weight reaches q of the total
        at_J = np.searchsorted(cum_N[:n], levels_VJ[v] * cum_N[n - 1])
        out_VJ[v] = keys_VN[v, order_VN[v, at_J]]
    return out_VJ


def _bracketed_quantiles(keys_NV, weights_N, total_V, levels_J):
    """(`weighted_quantiles` [V, J], which of them are exact [V, J]) of long columns.

    A strided sample of BRACKET_SAMPLE rows brackets each quantile between its own
    quantiles at q -/+ BRACKET_SE standard errors; only the values inside are sorted, and
    their cumulative weights continue the weight below the bracket. The pick is kept
    where the bracket holds q of the total and q lies PICK_MARGIN * n * eps of the total
    away from the cumulative weights on both sides of the pick: those of the whole sort
    differ by rounding alone, far less, so it picks the same entry.
    """
    n, stride = len(keys_NV), max(1, len(keys_NV) // BRACKET_SAMPLE)
    shape_VJ = (keys_NV.shape[1], len(levels_J))
    out_VJ, exact_VJ = np.full(shape_VJ, np.nan), np.zeros(shape_VJ, bool)
    margin_V = PICK_MARGIN * n * np.finfo(np.float64).eps * total_V
    for j, q in enumerate(levels_J):
        low_V, high_V = _sample_bracket(keys_NV[::stride], weights_N[::stride], q)
        below_NV = keys_NV < low_V
        below_V = weights_N @ below_NV  # the weight under each bracket
        # the values in the bracket, all finite (a left-out entry is +inf): [V, N]
        inside_VN = (~below_NV & (keys_NV <= np.minimum(high_V, np.finfo(float).max))).T
        target_V = q * total_V
        for v, inside_N in enumerate(np.ascontiguousarray(inside_VN)):
            idx = np.flatnonzero(inside_N)
            values = keys_NV[idx, v]
            order = np.argsort(values)
            cum = below_V[v] + np.cumsum(weights_N[idx[order]])
            at = np.searchsorted(cum, target_V[v])
            before = cum[at - 1] if at else below_V[v]
            low, high = target_V[v] - margin_V[v], target_V[v] + margin_V[v]
            if at < len(cum) and before < low and high <= cum[at]:
                out_VJ[v, j], exact_VJ[v, j] = values[order[at]], True
    return out_VJ, exact_VJ


def _sample_bracket(sample_SV, weights_S, q):
    """(low [V], high [V]): the sample's weighted quantiles at q -/+ BRACKET_SE of their
    standard errors (-inf / +inf past 0 and 1, or where the sample has no weight)."""
    valid_SV = sample_SV < np.inf
    weight_V, square_V = weights_S @ valid_SV, weights_S**2 @ valid_SV
    sampled_V = weight_V > 0
    effective_V = np.where(sampled_V, weight_V**2 / np.where(sampled_V, square_V, 1.0), 1.0)
    half_V = BRACKET_SE * np.sqrt(q * (1 - q) / np.maximum(effective_V, 1.0))
    levels_V2 = np.stack([q - half_V, q + half_V], axis=1)
    bounds_V2 = np.full(levels_V2.shape, np.nan)
    bounds_V2[sampled_V] = _sorted_quantiles(
        sample_SV[:, sampled_V],
        np.count_nonzero(valid_SV[:, sampled_V], axis=0),
        weights_S,
        np.clip(levels_V2[sampled_V], 1e-12, 1.0),
    )
    low_V = np.where((levels_V2[:, 0] <= 0) | ~sampled_V, -np.inf, bounds_V2[:, 0])
    high_V = np.where((levels_V2[:, 1] >= 1) | ~sampled_V, np.inf, bounds_V2[:, 1])
    return low_V, high_V


def weighted_quantile(values_N, weights_N, level: float) -> float:
    """`weighted_quantiles` of one column at one level."""
    return float(weighted_quantiles(np.asarray(values_N)[:, None], weights_N, [level])[0, 0])


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
    k_V1 = weighted_quantiles(moves_NH2.reshape(len(s_N), -1), s_N, [0.5])
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
