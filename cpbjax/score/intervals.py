"""How sure a forecast is: calibrated intervals, and their coverage, width and pinball loss
against a fitted band.

Every model with price forecasts gets a calibrated interval (config.eval.interval_levels):
bounds point * exp(k * s) around its point forecast, k fitted on the model's own errors
on the splits before the scored one (`fit_before`), as every fitted baseline is, and s
the window's volatility scale (`interval_scale`): the band's EWMA log range blended with
the mean log range of the last VOL_DAYS days, which volatility reverts to (the HAR
idea; the blend was chosen before the test split, benchmarks/interval_scale_choice.py).
The interval fitted on train+val is stored with the saved model, so --mode predict, the
Python API and serve give the interval the test split scored. (How it is fitted was
chosen on validation: benchmarks/interval_choice.py, docs/performance.md.)
This module scores intervals in price units (numpy only), next to the volatility band's
own quantiles: level q of column c at step h is close * exp(k_{h,c,q} * sigma), sigma the
window's EWMA log range (band.ewma_range), with k the pinball-loss minimiser on the
windows of the splits before the scored one (baselines.fit_ends); and, for an interval
with a blended scale, next to the band with that scale (`scaled_band`).
Shape letters (docs/design.md): N windows, H steps, C OHLC columns, J quantile levels, V the
fitted columns (steps x columns, flattened).
"""

from __future__ import annotations

import numpy as np

from cpbjax import band
from cpbjax import config_rules as rules
from cpbjax.columns import COLUMNS
from cpbjax.data import parsing
from cpbjax.data.series import INTERVAL_MS
from cpbjax.score import baseline_cache, baselines
from cpbjax.score.metrics import json_float, json_floats
from cpbjax.score.series_arrays import SeriesArrays

# The scale of a calibration saved before the long-run blend: the band's sigma alone.
WINDOW_ONLY = {"long_candles": 1, "long_weight": 0.0}
# The interval's volatility scale: the window's EWMA log range ^ (1 - VOL_WEIGHT) times the
# mean log range of the last VOL_DAYS days ^ VOL_WEIGHT. Chosen on the windows before test,
# 40 real series (docs/performance.md "Interval scale", benchmarks/interval_scale_choice.py).
VOL_DAYS = 7.0
VOL_WEIGHT = 0.25
VOL_BLEND = (VOL_DAYS, VOL_WEIGHT)  # (days, weight), as fit_before takes it
# (days, weight) of no long-run blend: the window's sigma alone.
NO_BLEND = (1.0, 0.0)


def scale_settings(interval: str, days: float, weight: float) -> dict:
    """A calibration's `scale`: the blend weight and its span in candles of `interval`
    (WINDOW_ONLY for weight 0, whatever the span)."""
    if weight == 0:
        return dict(WINDOW_ONLY)
    candles = max(1, round(days * INTERVAL_MS["1d"] / INTERVAL_MS[interval]))
    return {"long_candles": candles, "long_weight": weight}


def interval_scale(ohlc_TC, ends_N, lookback, scale: dict, arrays=None) -> np.ndarray:
    """The calibrated interval's volatility scale of each window, [N]:
    sigma^(1 - w) * m^w, sigma the window's EWMA log range (the band's scale) and m the
    mean log(high/low) of the n candles up to and including the window's last one (all of
    them where the series has fewer); n, w = scale["long_candles"], scale["long_weight"].
    It reads no candle after the window's end. arrays: the series' SeriesArrays where it
    is scored (a fresh one by default).
    """
    arrays = arrays or SeriesArrays(ohlc_TC)
    n, weight = scale["long_candles"], scale["long_weight"]

    def blended(ends_N):
        sigma_N = arrays.sigma(ends_N, lookback)
        if weight == 0:
            return sigma_N
        ohlc = np.asarray(ohlc_TC, np.float64)
        cum = np.concatenate([[0.0], np.cumsum(np.log(ohlc[:, 1] / ohlc[:, 2]))])
        start_N = np.maximum(ends_N + 1 - n, 0)
        long_N = (cum[ends_N + 1] - cum[start_N]) / (ends_N + 1 - start_N)
        return sigma_N ** (1.0 - weight) * long_N**weight

    return arrays.per_window("interval_scale", ends_N, (lookback, n, weight), blended)


def pinball(actual, pred_J, levels_J) -> np.ndarray:
    """Pinball loss of each level, in the units of the forecasts: pred_J is `actual`'s
    shape plus a trailing axis of J levels, and so is the result."""
    r = np.asarray(pred_J, np.float64) - np.asarray(actual, np.float64)[..., None]
    q_J = np.asarray(levels_J, np.float64)
    return np.maximum(-r * q_J, r * (1.0 - q_J))


def fit_band_quantiles(ohlc_TC, fit_ends_N, lookback, horizon, levels_J, arrays=None) -> np.ndarray:
    """k [H, C, J] of the band's quantiles, fitted by pinball loss in log space.

    sum_i pinball_q(r_i - k * sigma_i) = sum_i sigma_i * pinball_q(r_i / sigma_i - k), so
    each k is a sigma-weighted quantile of r / sigma (r = log(price[t+h] / close[t])).
    arrays: the series' SeriesArrays where it is scored (a fresh one by default).
    """
    arrays = arrays or SeriesArrays(ohlc_TC)
    sigma_N = arrays.sigma(fit_ends_N, lookback)
    ratios_NHC = arrays.log_ratios(fit_ends_N, horizon)
    with np.errstate(divide="ignore", invalid="ignore"):
        score_NHC = ratios_NHC / sigma_N[:, None, None]
    ok_NHC = np.broadcast_to((sigma_N > 0)[:, None, None], score_NHC.shape)
    return _score_quantiles(score_NHC, ok_NHC, sigma_N, levels_J, "sigma")


def band_quantiles(k_HCJ, ohlc_TC, ends_N, lookback, arrays=None) -> np.ndarray:
    """The band's quantile forecasts in prices, [N, H, C, J]."""
    sigma_N = (arrays or SeriesArrays(ohlc_TC)).sigma(ends_N, lookback)
    return _scaled(k_HCJ, ohlc_TC[ends_N, 3][:, None, None], sigma_N)


def _scaled(k_HCJ, base_NHC, scale_N) -> np.ndarray:
    """base * exp(k * scale) of every window, [N, H, C, J] (base may broadcast, e.g. [N, 1, 1])."""
    return base_NHC[..., None] * np.exp(k_HCJ[None] * scale_N[:, None, None, None])


def _score_quantiles(score_NHC, ok_NHC, sigma_N, levels_J, weighting: str) -> np.ndarray:
    """k [H, C, J]: per step and column, the level-q quantiles of the valid scores (ok_NHC),
    sigma-weighted (the pinball-loss minimiser in log price) or split-conformal ("none");
    0 where no score is valid. One sort per column serves every level."""
    n, horizon, columns = score_NHC.shape
    fitted_V = ok_NHC.reshape(n, -1).any(axis=0)  # the columns with a valid score
    valid_NV = np.where(ok_NHC, score_NHC, np.nan).reshape(n, -1)  # NaN: left out
    valid_NV = valid_NV if fitted_V.all() else valid_NV[:, fitted_V]
    k_VJ = np.zeros((horizon * columns, len(levels_J)))
    if weighting == "sigma":
        k_VJ[fitted_V] = band.weighted_quantiles(valid_NV, sigma_N, levels_J)
    else:
        k_VJ[fitted_V] = _conformal_quantiles(valid_NV, levels_J)
    return k_VJ.reshape(horizon, columns, len(levels_J))


def _column(actual_NH, pred_NHJ, losses: dict, levels_J) -> dict:
    """The interval scores of one column; the central interval is the outermost levels.
    losses: name -> `_band_loss` of a band it is compared with ("band", and with a
    blended scale "scaled_band"): <name>_pinball(_h) and skill_vs_<name>."""
    lo_NH, hi_NH = pred_NHJ[..., 0], pred_NHJ[..., -1]
    inside_NH = (actual_NH >= lo_NH) & (actual_NH <= hi_NH)
    loss_NH = pinball(actual_NH, pred_NHJ, levels_J).mean(-1)  # mean over the levels
    model_loss = float(loss_NH.mean())
    out = {
        "coverage": json_float(inside_NH.mean()),
        "coverage_h": json_floats(inside_NH.mean(0)),
        "width": json_float((hi_NH - lo_NH).mean()),
        "width_h": json_floats((hi_NH - lo_NH).mean(0)),
        "pinball": json_float(model_loss),
        "pinball_h": json_floats(loss_NH.mean(0)),
    }
    for name, (loss, loss_h) in losses.items():
        out[f"{name}_pinball"] = json_float(loss)
        out[f"{name}_pinball_h"] = loss_h
        out[f"skill_vs_{name}"] = json_float(1.0 - model_loss / loss) if loss > 0 else None
    return out


def _band_loss(actual_NH, band_NHJ, levels_J) -> tuple:
    """(mean pinball loss over windows, steps and levels, its JSON-ready mean per step [H])
    of a band's quantiles of one column."""
    band_NH = pinball(actual_NH, band_NHJ, levels_J).mean(-1)
    return float(band_NH.mean()), json_floats(band_NH.mean(0))


def band_losses(prep, split, ends_N, spec, scale, arrays) -> dict:
    """column -> band name -> `_band_loss` of the bands an interval of `split` is compared
    with (`score_intervals`): the band, and with a blended scale the band with that
    scale, fitted on the splits before it. Read from the candles alone, so kept in the
    baseline cache (spec.baseline_cache)."""

    def losses():
        lookback, horizon, levels_J = spec.lookback, spec.horizon, spec.interval_levels
        actual_NHC = arrays.next_candles(ends_N, horizon)
        k_HCJ = fit_band_quantiles(prep.ohlc, fit_on, lookback, horizon, levels_J, arrays)
        bands = {"band": band_quantiles(k_HCJ, prep.ohlc, ends_N, lookback, arrays)}
        if scale["long_weight"] > 0:
            bands["scaled_band"] = scaled_band(prep, fit_on, ends_N, spec, scale, arrays)
        return {
            col: {
                name: _band_loss(actual_NHC[..., c], b[..., c, :], levels_J)
                for name, b in bands.items()
            }
            for c, col in enumerate(COLUMNS)
        }

    fit_on = baselines.fit_ends(prep, split)
    settings = {
        "lookback": spec.lookback,
        "horizon": spec.horizon,
        "levels": [float(q) for q in spec.interval_levels],
        "scale": dict(scale),
    }
    ends = {"fit": fit_on, "scored": ends_N}
    return baseline_cache.cached(
        spec.baseline_cache, "band_losses", settings, prep, arrays, ends, losses
    )


def score_intervals(prep, split, ends_N, spec, pred_NHCJ, scale=WINDOW_ONLY, arrays=None) -> dict:
    """results.json's `intervals` block of one split: per column and step, model and band.

    Args:
      prep: windows.PreparedSeries. split: the scored split ("val" or "test").
      ends_N: its window ends. spec: an evaluate.EvalSpec whose interval_levels are the
        levels of pred_NHCJ, increasing; the central interval is the first to the last
        (`EvalSpec.at_levels`).
      pred_NHCJ: the interval's bounds (at those levels) in prices.
      scale: the interval's `interval_scale`; with a blend it is also scored against the
        band with that scale (`scaled_band`), the strongest simple competitor: how much
        the network adds beyond its scale.
      arrays: the series' SeriesArrays where it is scored (a fresh one by default).
    """
    arrays = arrays or SeriesArrays(prep.ohlc)
    actual_NHC = arrays.next_candles(ends_N, spec.horizon)
    losses = band_losses(prep, split, ends_N, spec, scale, arrays)
    levels_J = spec.interval_levels
    return {
        "levels": [float(q) for q in levels_J],
        "central": [float(levels_J[0]), float(levels_J[-1])],
        "columns": {
            col: _column(actual_NHC[..., c], pred_NHCJ[..., c, :], losses[col], levels_J)
            for c, col in enumerate(COLUMNS)
        },
    }


def _conformal_quantiles(valid_NV, levels_J) -> np.ndarray:
    """The split-conformal bounds [V, J] of each column's n valid scores (not NaN), n >= 1,
    assumed exchangeable: the ceil((n+1)q)-th smallest for an upper level q, the
    floor((n+1)q)-th for a lower one, so that a new score falls beyond it with probability
    at most min(q, 1 - q). One sort per column: its left-out scores sorted last, as +inf."""
    left_out_NV = np.isnan(valid_NV)
    sorted_VN = np.sort(np.where(left_out_NV, np.inf, valid_NV).T, axis=1)
    n_V1 = (len(valid_NV) - left_out_NV.sum(axis=0))[:, None]
    q_1J = np.asarray(levels_J, np.float64)[None, :]
    rank_VJ = np.where(q_1J >= 0.5, np.ceil((n_V1 + 1) * q_1J), np.floor((n_V1 + 1) * q_1J))
    rank_VJ = np.clip(rank_VJ.astype(np.int64), 1, n_V1)
    return np.take_along_axis(sorted_VN, rank_VJ - 1, axis=1)


def fit_calibration(
    prep, ends_N, point_NHC, spec, weighting="none", scale=WINDOW_ONLY, arrays=None
):
    """The calibrated interval of a point forecast, fitted on the windows ending at ends_N,
    at the levels spec.interval_levels (spec: an evaluate.EvalSpec).

    Bound j of column c at step h is point * exp(k[h, c, j] * s), s the window's
    `interval_scale` under `scale` (so the interval widens with volatility), and k a
    quantile of the scores log(actual / point) / s of those windows:
      weighting "none": the split-conformal quantile. Fitted on windows that training
        never fits, the interval covers about levels[-1] - levels[0] of later outcomes
        that behave like those windows'.
      weighting "sigma": the s-weighted quantile, which minimises the pinball loss
        in log price on those windows (the band's own fit, `fit_band_quantiles`).

    Returns:
      meta.json's `interval_calibration`: levels, k [H][C][J], scale, the windows fitted on.
    """
    lookback, levels_J = spec.lookback, spec.interval_levels
    arrays = arrays or SeriesArrays(prep.ohlc)
    actual_NHC = arrays.next_candles(ends_N, spec.horizon)
    s_N = interval_scale(prep.ohlc, ends_N, lookback, scale, arrays)
    point_NHC = np.asarray(point_NHC, np.float64)
    ok_NHC = (s_N[:, None, None] > 0) & (point_NHC > 0) & (actual_NHC > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        score_NHC = np.log(actual_NHC / point_NHC) / s_N[:, None, None]
    k = _score_quantiles(score_NHC, ok_NHC, s_N, levels_J, weighting)
    return {
        "method": "split_conformal" if weighting == "none" else "sigma_weighted_quantile",
        "levels": [float(q) for q in levels_J],
        "k": k.tolist(),
        "scale": dict(scale),
        "fitted_on_windows": int(len(ends_N)),
        "first_window_end": parsing.iso(prep.open_time_ms[ends_N[0]]),
        "last_window_end": parsing.iso(prep.open_time_ms[ends_N[-1]]),
    }


def fit_before(prep, split, point_by_split, spec, arrays=None) -> dict:
    """`fit_calibration` (s-weighted) on the splits before `split`, as every fitted
    baseline is fitted (baselines.fit_ends): train for val, train+val for test.

    Args:
      point_by_split: split -> the model's point forecasts of its windows, [N, H, C].
      spec: the run's evaluate.EvalSpec: its window sizes, interval_levels, and
        interval_vol, the (days, weight) of the scale's long-run blend (VOL_BLEND in a run).
      arrays: the series' SeriesArrays where it is scored (a fresh one by default).
    """
    point_NHC = np.concatenate([point_by_split[s] for s in baselines.SPLITS_BEFORE[split]])
    ends_N = baselines.fit_ends(prep, split)
    scale = scale_settings(prep.interval, *spec.interval_vol)
    return fit_calibration(prep, ends_N, point_NHC, spec, "sigma", scale, arrays)


def check_calibration(calibration, horizon: int, where: str) -> dict | None:
    """A saved `interval_calibration` (None passes), or ValueError naming what is wrong
    with it: levels two increasing numbers in (0, 1), k of shape [H][C][2], and a valid
    scale (absent from a calibration saved before the long-run blend: the window's sigma)."""
    if calibration is None:
        return None
    try:
        levels = [float(q) for q in calibration["levels"]]
        k = np.asarray(calibration["k"], np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: interval_calibration is malformed ({e})") from None
    if not (len(levels) == 2 and 0 < levels[0] < levels[1] < 1):
        raise ValueError(f"{where}: interval_calibration levels {levels} are not (lower, upper)")
    if k.shape != (horizon, len(COLUMNS), 2) or not np.isfinite(k).all():
        raise ValueError(
            f"{where}: interval_calibration k has shape {k.shape}, expected finite "
            f"[{horizon}, {len(COLUMNS)}, 2]"
        )
    _check_scale(calibration.get("scale", WINDOW_ONLY), where)
    return calibration


def _check_scale(scale, where: str) -> None:
    """ValueError unless `scale` is {"long_candles": int >= 1, "long_weight": in [0, 1)}."""
    n, w = (scale.get(k) if isinstance(scale, dict) else None for k in WINDOW_ONLY)
    if not (rules.is_int(n) and n >= 1 and rules.is_num(w) and 0 <= w < 1):
        raise ValueError(
            f"{where}: interval_calibration scale {scale!r} is not "
            "{'long_candles': an integer >= 1, 'long_weight': a number in [0, 1)}"
        )


def calibrated_bounds(
    calibration: dict, ohlc_TC, ends_N, point_NHC, lookback, arrays=None
) -> np.ndarray:
    """The interval bounds of the windows ending at ends_N in prices, [N, H, C, J]."""
    k_HCJ = np.asarray(calibration["k"], np.float64)
    scale = calibration.get("scale", WINDOW_ONLY)
    s_N = interval_scale(ohlc_TC, ends_N, lookback, scale, arrays)
    return _scaled(k_HCJ, np.asarray(point_NHC, np.float64), s_N)


def score_calibrated(prep, split, ends_N, spec, point_NHC, calibration, arrays=None) -> dict:
    """results.json's `calibrated_interval` of one split: `score_intervals` of the bounds,
    with where the calibration was fitted and its scale (spec: the run's evaluate.EvalSpec;
    arrays: the series' SeriesArrays where it is scored, a fresh one by default)."""
    arrays = arrays or SeriesArrays(prep.ohlc)
    bounds = calibrated_bounds(calibration, prep.ohlc, ends_N, point_NHC, spec.lookback, arrays)
    scale = calibration.get("scale", WINDOW_ONLY)
    at_levels = spec.at_levels(calibration["levels"])
    out = score_intervals(prep, split, ends_N, at_levels, bounds, scale, arrays)
    out["fitted_on"] = {
        k: calibration[k] for k in ("fitted_on_windows", "first_window_end", "last_window_end")
    }
    out["scale"] = scale
    return out


def scaled_band(prep, fit_ends_N, ends_N, spec, scale, arrays=None) -> np.ndarray:
    """The band's quantiles at spec.interval_levels with the scale `scale`, in prices
    [N, H, C, J]: the s-weighted calibrated interval of the last close, fitted on the
    windows ending at fit_ends_N. With WINDOW_ONLY they are the band's own
    (`fit_band_quantiles`). arrays: the series' SeriesArrays where it is scored (a fresh
    one by default)."""

    def close(e):  # [N, H, C]: every column at the window's last close
        return np.repeat(prep.ohlc[e, 3][:, None, None], len(COLUMNS), 2).repeat(spec.horizon, 1)

    arrays = arrays or SeriesArrays(prep.ohlc)
    cal = fit_calibration(prep, fit_ends_N, close(fit_ends_N), spec, "sigma", scale, arrays)
    return calibrated_bounds(cal, prep.ohlc, ends_N, close(ends_N), spec.lookback, arrays)
