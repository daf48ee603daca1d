"""The verdict of `--mode ablate` (cpbjax/modes/ablate.py) from its settings' scores (numpy only).

Every setting of an ablation is a model trained on the same windows with some covariates
masked to 0: "all", "none" and "without-<name>" per covariate. Here, per split (val,
then test once):

  - `by_setting`: each setting's median over series of its high, low and close skill
    against the better naive forecast and against the volatility band;
  - `gain`: the gain of one setting over another per series, in points (100 x the skill
    difference against the same naive forecast, the same windows), with the one-sided
    Diebold-Mariano p-value that the first has the lower per-window MAE (lag H-1, on the
    scorer's per-window losses, metrics.window_mae), how many series it is significant
    on (p < SIGNIFICANT) and significantly worse on, and the median over series.

Shapes: N windows, C OHLC columns.
"""

from __future__ import annotations

import statistics

import numpy as np

from cpbjax.columns import COLUMNS
from cpbjax.score import metrics

SPLITS = ("val", "test")
JUDGED = ("high", "low", "close")  # in the order the verdict reads them
SIGNIFICANT = 0.05  # one-sided DM p-value below which a gain (or a loss) counts


def _median(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return float(statistics.median(kept)) if kept else None


def skills(split_metrics: dict, column: str) -> dict:
    """One series' split metrics -> {"vs_naive", "vs_band"} skill on `column` (None where
    there is none: close has no band)."""
    mae = ((split_metrics.get("columns") or {}).get(column) or {}).get("mae")
    naive = ((split_metrics.get("columns") or {}).get(column) or {}).get("skill")
    band_cols = (split_metrics.get("vol_band") or {}).get("columns") or {}
    band = (band_cols.get(column) or {}).get("mae")
    return {"vs_naive": naive, "vs_band": metrics.skill(mae, band) if band else None}


def by_setting(rows: dict, settings: list[str]) -> dict:
    """setting -> split -> column -> {"vs_naive", "vs_band"}: medians over series of the
    skill fractions; `rows`: series -> setting -> results entry."""
    out = {}
    for name in settings:
        out[name] = {}
        for split in SPLITS:
            cells = [row[name][split] for row in rows.values() if split in row.get(name, {})]
            out[name][split] = {
                c: {k: _median([skills(m, c)[k] for m in cells]) for k in ("vs_naive", "vs_band")}
                for c in JUDGED
            }
    return out


def series_gain(entry_a: dict, entry_b: dict, mae_a: dict, mae_b: dict, split, column, lag):
    """One series' gain of model a over model b on `split` and `column`: {"points",
    "p_value"} (None where either has no score or their windows differ)."""
    a = skills(entry_a.get(split) or {}, column)["vs_naive"]
    b = skills(entry_b.get(split) or {}, column)["vs_naive"]
    loss_a_N, loss_b_N = mae_a.get(split), mae_b.get(split)
    if a is None or b is None or loss_a_N is None or loss_b_N is None:
        return {"points": None, "p_value": None}
    if len(loss_a_N) != len(loss_b_N):
        return {"points": None, "p_value": None}
    c = COLUMNS.index(column)
    dm = metrics.diebold_mariano(loss_a_N[:, c], loss_b_N[:, c], lag)
    return {"points": 100.0 * (a - b), "p_value": dm["p_value_better"]}


def gain(rows: dict, window_mae: dict, a: str, b: str, lag: int) -> dict:
    """split -> column -> the gain of setting `a` over setting `b`: "per_series" (series ->
    `series_gain`), "median_points", "significant_on", "worse_on" (p > 1 - SIGNIFICANT:
    b significantly better) and "series" (how many have a p-value).

    Args:
      rows: series -> setting -> results entry. window_mae: series -> setting -> split ->
        float64 [N, C] (metrics.window_mae). lag: H - 1.
    """
    out = {}
    for split in SPLITS:
        out[split] = {}
        for column in JUDGED:
            per = {
                s: series_gain(
                    row[a], row[b], window_mae[s][a], window_mae[s][b], split, column, lag
                )
                for s, row in rows.items()
                if a in row and b in row
            }
            p_values = [g["p_value"] for g in per.values() if g["p_value"] is not None]
            out[split][column] = {
                "per_series": per,
                "median_points": _median([g["points"] for g in per.values()]),
                "significant_on": sum(p < SIGNIFICANT for p in p_values),
                "worse_on": sum(p > 1.0 - SIGNIFICANT for p in p_values),
                "series": len(p_values),
            }
    return out


def rank(covariates: dict) -> list[str]:
    """Covariate names by their val gain (all over without it), the mean of the high and
    low median points, largest first; None medians count as 0."""

    def val_gain(name: str) -> float:
        val = covariates[name]["val"]
        return float(np.mean([val[c]["median_points"] or 0.0 for c in ("high", "low")]))

    return sorted(covariates, key=val_gain, reverse=True)
