"""How sure a forecast is: calibrated intervals, and their coverage, width and pinball loss
against a fitted band.

Every model with price forecasts gets a calibrated interval (config.eval.interval_levels):
bounds point * exp(k * sigma) around its point forecast, k fitted on the model's own
errors on the splits before the scored one (`fit_before`), as every fitted baseline is.
The interval fitted on train+val is stored with the saved model, so --mode predict, the
Python API and serve give the interval the test split scored. (How it is fitted was
chosen on validation: benchmarks/interval_choice.py, docs/performance.md.)
A model with config.model.quantiles also forecasts J levels of every column and step.
This module scores intervals in price units (numpy only), next to the volatility band's
own quantiles: level q of column c at step h is close * exp(k_{h,c,q} * sigma), sigma the
window's EWMA log range (baselines.ewma_range), with k the pinball-loss minimiser on the
windows of the splits before the scored one (baselines.fit_ends).
Shape letters (docs/design.md): N windows, H steps, C OHLC columns, J quantile levels.
"""

from __future__ import annotations

import math

import numpy as np

from cpbjax import baselines
from cpbjax.data import parsing
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
    with np.errstate(divide="ignore", invalid="ignore"):
        score_NHC = ratios_NHC / sigma_N[:, None, None]
    ok_NHC = np.broadcast_to((sigma_N > 0)[:, None, None], score_NHC.shape)
    return _score_quantiles(score_NHC, ok_NHC, sigma_N, levels_J, "sigma")


def band_quantiles(k_HCJ, ohlc_TC, ends_N, lookback) -> np.ndarray:
    """The band's quantile forecasts in prices, [N, H, C, J]."""
    sigma_N = baselines.ewma_range(ohlc_TC, ends_N, lookback)
    return _scaled(k_HCJ, ohlc_TC[ends_N, 3][:, None, None], sigma_N)


def _scaled(k_HCJ, base_NHC, sigma_N) -> np.ndarray:
    """base * exp(k * sigma) of every window, [N, H, C, J] (base may broadcast, e.g. [N, 1, 1])."""
    return base_NHC[..., None] * np.exp(k_HCJ[None] * sigma_N[:, None, None, None])


def _score_quantiles(score_NHC, ok_NHC, sigma_N, levels_J, weighting: str) -> np.ndarray:
    """k [H, C, J]: per step and column, the level-q quantiles of the valid scores (ok_NHC),
    sigma-weighted (the pinball-loss minimiser in log price) or split-conformal ("none");
    0 where no score is valid."""
    _, horizon, columns = score_NHC.shape
    k = np.zeros((horizon, columns, len(levels_J)))
    for h, c in np.ndindex(horizon, columns):
        ok = ok_NHC[:, h, c]
        if not ok.any():
            continue
        if weighting == "sigma":
            s, w = score_NHC[ok, h, c], sigma_N[ok]
            k[h, c] = [baselines.weighted_quantile(s, w, q) for q in levels_J]
        else:
            k[h, c] = [_conformal_quantile(score_NHC[ok, h, c], q) for q in levels_J]
    return k


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


def _conformal_quantile(scores, level: float) -> float:
    """The split-conformal bound of `level` from n exchangeable scores: the ceil((n+1)q)-th
    smallest for an upper level, the floor((n+1)q)-th for a lower one, so that a new score
    falls beyond it with probability at most min(q, 1 - q)."""
    s, n = np.sort(scores), len(scores)
    rank = math.ceil((n + 1) * level) if level >= 0.5 else math.floor((n + 1) * level)
    return float(s[min(max(rank, 1), n) - 1])


def fit_calibration(prep, ends_N, point_NHC, lookback, horizon, levels_J, weighting="none"):
    """The calibrated interval of a point forecast, fitted on the windows ending at ends_N.

    Bound j of column c at step h is point * exp(k[h, c, j] * sigma), sigma the window's
    EWMA log range (the band's scale, so the interval widens with recent volatility),
    and k a quantile of the scores log(actual / point) / sigma of those windows:
      weighting "none": the split-conformal quantile. Fitted on windows that training
        never fits, the interval covers about levels[-1] - levels[0] of later outcomes
        that behave like those windows'.
      weighting "sigma": the sigma-weighted quantile, which minimises the pinball loss
        in log price on those windows (the band's own fit, `fit_band_quantiles`).

    Returns:
      meta.json's `interval_calibration`: levels, k [H][C][J], the windows fitted on.
    """
    actual_NHC = next_candles(prep.ohlc, ends_N, horizon)
    sigma_N = baselines.ewma_range(prep.ohlc, ends_N, lookback)
    point_NHC = np.asarray(point_NHC, np.float64)
    ok_NHC = (sigma_N[:, None, None] > 0) & (point_NHC > 0) & (actual_NHC > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        score_NHC = np.log(actual_NHC / point_NHC) / sigma_N[:, None, None]
    k = _score_quantiles(score_NHC, ok_NHC, sigma_N, levels_J, weighting)
    return {
        "method": "split_conformal" if weighting == "none" else "sigma_weighted_quantile",
        "levels": [float(q) for q in levels_J],
        "k": k.tolist(),
        "fitted_on_windows": int(len(ends_N)),
        "first_window_end": parsing.iso(prep.open_time_ms[ends_N[0]]),
        "last_window_end": parsing.iso(prep.open_time_ms[ends_N[-1]]),
    }


def fit_before(prep, split, point_by_split, lookback, horizon, levels_J) -> dict:
    """`fit_calibration` (sigma-weighted) on the splits before `split`, as every fitted
    baseline is fitted (baselines.fit_ends): train for val, train+val for test.

    Args:
      point_by_split: split -> the model's point forecasts of its windows, [N, H, C].
    """
    point_NHC = np.concatenate([point_by_split[s] for s in baselines.SPLITS_BEFORE[split]])
    ends_N = baselines.fit_ends(prep, split)
    return fit_calibration(prep, ends_N, point_NHC, lookback, horizon, levels_J, "sigma")


def check_calibration(calibration, horizon: int, where: str) -> dict | None:
    """A saved `interval_calibration` (None passes), or ValueError naming what is wrong
    with it: levels two increasing numbers in (0, 1), k of shape [H][C][2]."""
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
    return calibration


def calibrated_bounds(calibration: dict, ohlc_TC, ends_N, point_NHC, lookback) -> np.ndarray:
    """The interval bounds of the windows ending at ends_N in prices, [N, H, C, J]."""
    k_HCJ = np.asarray(calibration["k"], np.float64)
    sigma_N = baselines.ewma_range(ohlc_TC, np.asarray(ends_N), lookback)
    return _scaled(k_HCJ, np.asarray(point_NHC, np.float64), sigma_N)


def score_calibrated(prep, split, ends_N, lookback, horizon, point_NHC, calibration) -> dict:
    """results.json's `calibrated_interval` of one split: `score_intervals` of the bounds,
    with where the calibration was fitted."""
    bounds = calibrated_bounds(calibration, prep.ohlc, ends_N, point_NHC, lookback)
    levels = calibration["levels"]
    out = score_intervals(prep, split, ends_N, lookback, horizon, bounds, levels)
    out["fitted_on"] = {
        k: calibration[k] for k in ("fitted_on_windows", "first_window_end", "last_window_end")
    }
    return out
