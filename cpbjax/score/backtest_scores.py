"""Pooled scores of a rolling-origin backtest: over a series' folds and over all series
(numpy only, like cpbjax/score/metrics.py, from the arrays of the folds' forecasts files).

Per series, the folds' test windows are concatenated in time order (the test blocks are
consecutive, so the loss series runs on across the seams) and scored per column (close,
high, low) as one split: MAE, the better naive on the pooled windows and skill against
it, and the fitted baselines (ridge; the volatility band and HAR for high and low) each
refit on its own fold. Each comparison gets a Diebold-Mariano test on the per-window mean
absolute errors with the Newey-West variance (lag H-1) over the concatenated folds.

Over all series, MAE in price units cannot be pooled, so a column's pooled figures are
the mean and median of the series' skills, and a panel DM test per interval: at each
window time, the loss differentials of the series with a window then, each divided by its
series' pooled naive MAE (so every series weighs alike), are averaged across series, and
that one time series is tested with the same HAC variance. Averaging first keeps the
cross-series correlation of crypto prices inside the variance, instead of treating 40
series as 40 independent samples.
"""

from __future__ import annotations

import numpy as np

from cpbjax.columns import COLUMNS
from cpbjax.score.metrics import (
    NAIVES,
    diebold_mariano,
    json_float,
    naive_forecasts,
    skill,
)

POOLED_COLUMNS = ("close", "high", "low")
# The forecasts each column is compared with besides the naive ones: baseline -> columns.
BASELINE_COLUMNS = {"ridge": POOLED_COLUMNS, "vol_band": ("high", "low"), "har": ("high", "low")}


def window_losses(actual_NHC, pred_NHC, column: str) -> np.ndarray:
    """Mean absolute error over the H steps of each window for one column, float64 [N]."""
    j = COLUMNS.index(column)
    return np.abs(np.asarray(pred_NHC)[..., j] - np.asarray(actual_NHC)[..., j]).mean(axis=1)


def concat_folds(folds: list[dict]) -> dict:
    """The folds' arrays (each a dict of last_open_time_ms [N], last_candle [N, C],
    actual, predicted, ridge [N, H, C], vol_band and har [N, H, 4] with only high/low
    meaningful) concatenated in time order."""
    folds = sorted(folds, key=lambda f: int(f["last_open_time_ms"][0]))
    return {k: np.concatenate([f[k] for f in folds]) for k in folds[0]}


def _versus(loss_N, ref_loss_N, model_mae, lag) -> dict:
    """The reference's MAE, the model's skill against it and the DM test of their losses."""
    ref_mae = float(np.mean(ref_loss_N))
    return {
        "mae": json_float(ref_mae),
        "skill": skill(float(model_mae), ref_mae),
        "dm": diebold_mariano(loss_N, ref_loss_N, lag),
    }


def series_pooled(arrays: dict) -> dict:
    """Pooled scores of one series from `concat_folds`: per column MAE, the best naive,
    skill and DM against it, and against each fitted baseline.

    Returns:
      {"windows", "columns": {col: {"mae", "best_naive", "naive_mae", "skill", "dm",
      "ridge": {"mae", "skill", "dm"}, "vol_band", "har": ... (high, low)}}}; "skill" of a
      baseline entry is the model's skill against that baseline, and its DM's
      p_value_better is that of "the model beats the baseline".
    """
    actual, last = arrays["actual"], arrays["last_candle"]
    lag = actual.shape[1] - 1
    naive = naive_forecasts(last, actual.shape[1])
    out = {}
    for col in POOLED_COLUMNS:
        loss = window_losses(actual, arrays["predicted"], col)
        naive_loss = {k: window_losses(actual, naive[k], col) for k in NAIVES}
        best = min(NAIVES, key=lambda k: naive_loss[k].mean())
        entry = {"mae": json_float(loss.mean()), "best_naive": best}
        ref = _versus(loss, naive_loss[best], loss.mean(), lag)
        entry.update(naive_mae=ref["mae"], skill=ref["skill"], dm=ref["dm"])
        for name, cols in BASELINE_COLUMNS.items():
            if col in cols:
                base = window_losses(actual, arrays[name], col)
                entry[name] = _versus(loss, base, loss.mean(), lag)
        out[col] = entry
    return {"windows": int(len(actual)), "columns": out}


def scaled_losses(arrays: dict, pooled: dict) -> dict:
    """Per column and reference, the window losses of model and reference divided by the
    series' pooled naive MAE: (times [N], model [N], reference [N]) for `panel_dm`."""
    actual, times = arrays["actual"], arrays["last_open_time_ms"]
    naive = naive_forecasts(arrays["last_candle"], actual.shape[1])
    out = {}
    for col in POOLED_COLUMNS:
        entry = pooled["columns"][col]
        scale = entry["naive_mae"] or 1.0
        refs = {"naive": naive[entry["best_naive"]]}
        refs.update({k: arrays[k] for k, cols in BASELINE_COLUMNS.items() if col in cols})
        model = window_losses(actual, arrays["predicted"], col) / scale
        for ref_name, ref in refs.items():
            out[(col, ref_name)] = (times, model, window_losses(actual, ref, col) / scale)
    return out


def panel_dm(parts: list[tuple], lag: int) -> dict:
    """DM test of the cross-series mean loss differential at each window time.

    Args:
      parts: per series (times [N], model loss [N], reference loss [N]), losses scaled.
      lag: the HAC lag (H-1).

    Returns:
      `metrics.diebold_mariano` of the time-ordered cross-sectional means, with
      "series" (how many took part) added.
    """
    times = np.unique(np.concatenate([p[0] for p in parts]))
    total = np.zeros((2, len(times)))
    count = np.zeros(len(times))
    for t_N, model_N, ref_N in parts:
        at = np.searchsorted(times, t_N)
        np.add.at(total[0], at, model_N)
        np.add.at(total[1], at, ref_N)
        np.add.at(count, at, 1.0)
    out = diebold_mariano(total[0] / count, total[1] / count, lag)
    return {**out, "series": len(parts)}


def _skills(per_series: dict, col: str, ref: str) -> list[float]:
    """The model's pooled skill of every series on `col` against `ref` (naive or a baseline)."""
    cols = (p["columns"][col] for p in per_series.values())
    values = [c["skill"] if ref == "naive" else c.get(ref, {}).get("skill") for c in cols]
    return [v for v in values if v is not None]


def all_series_pooled(per_series: dict, losses: dict, intervals: dict, horizon: int) -> dict:
    """The pooled scores over all series.

    Args:
      per_series: series name -> `series_pooled`. losses: series name -> `scaled_losses`.
      intervals: series name -> interval. horizon: H.

    Returns:
      {"series", "columns": {col: {ref: {"mean_skill", "median_skill", "positive",
      "dm": {interval: panel DM}}}}} with ref naive, ridge and (high, low) vol_band, har.
    """
    out = {}
    for col in POOLED_COLUMNS:
        refs = ("naive", *(k for k, cols in BASELINE_COLUMNS.items() if col in cols))
        out[col] = {}
        for ref in refs:
            skills = _skills(per_series, col, ref)
            dms = {}
            for iv in sorted(set(intervals.values())):
                parts = [losses[n][(col, ref)] for n in losses if intervals[n] == iv]
                dms[iv] = panel_dm(parts, horizon - 1)
            out[col][ref] = {
                "mean_skill": json_float(np.mean(skills)) if skills else None,
                "median_skill": json_float(np.median(skills)) if skills else None,
                "positive": sum(s > 0 for s in skills),
                "dm": dms,
            }
    return {"series": len(per_series), "columns": out}
