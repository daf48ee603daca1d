"""The per-column fallback's bar (eval.column_fallback), chosen on the tuning pairs' val split
without scoring a decision on the windows that made it: each series' val windows are cut
in two halves in time (purged by H); the fallback is decided on the first half as the
product decides it (column_fallback.window_errors on the kept params, each bar's margin
as early stopping's, `keep_with_bar`), and the second half is scored as the product scores val (the band refit on
train, skill against the better naive forecast in prices). Test is never read.

Bars: a number b keeps a column's correction where its val error beats the baseline's
by more than b standard errors (b = 0: any gain; b = -1: kept unless it is worse by one
standard error, i.e. it falls back only where it is significantly worse); "never" keeps
every correction. "close worse" counts the series whose close is significantly worse than
persistence on the second half (Diebold-Mariano, one-sided p < 0.05).

  python experiments/global_model/fallback_bar.py runs/gm/<tuning run> [--bars 1,0.5,0,-1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cpbjax import writers
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.data import sources, windows  # noqa: E402
from cpbjax.models import heads  # noqa: E402
from cpbjax.score import band_refit, column_fallback, evaluate, forecast, metrics, saved
from cpbjax.training import early_stopping

COLUMNS = ("close", "high", "low")


def halves(ends_N: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The val windows' first and second halves in time; the first loses the windows whose
    targets reach the second half's first window's last input."""
    first, second = ends_N[: len(ends_N) // 2], ends_N[len(ends_N) // 2 :]
    return first[first + horizon < second[0]], second


def keep_with_bar(model_CN, base_CN, bar: float, lag: int) -> np.ndarray:
    """bool [C]: the model's mean error is below the baseline's by more than `bar` standard
    errors of the paired per-window difference (early_stopping.bar, gain_se: Newey-West
    over `lag` lags); bar 0 is column_fallback.keep_mask, the product's decision."""
    model_CN, base_CN = jnp.asarray(model_CN, jnp.float32), jnp.asarray(base_CN, jnp.float32)
    se_C = early_stopping.gain_se(model_CN, base_CN, jnp.ones(model_CN.shape, bool), lag)
    bar_C = early_stopping.bar(bar, jnp.mean(base_CN, axis=1), se_C)
    return np.asarray(jnp.mean(model_CN, axis=1) < bar_C)


def masked(prep, model: forecast.SplitForecast, base: forecast.SplitForecast, keep_C):
    """The forecasts of the params with fallback mask keep_C: the baseline's where a column
    falls back (ForecastOutput adds the masked correction to the baseline)."""
    norm = np.where(keep_C[None, None, :], model.norm_NHC, base.norm_NHC)
    return forecast.SplitForecast(model.ends_N, windows.to_prices(prep, model.ends_N, norm), norm)


def series_scores(loaded, prep, entry, spec, bars) -> dict:
    """bar -> column -> skill on the second half of val, for one series."""
    shift = np.stack([entry["test"]["band_refit"][c] for c in ("high", "low")], axis=1)
    kept = band_refit.shifted(heads.without_keep(loaded.params), -shift)  # before its refit
    first, second = halves(prep.ends["val"], spec.horizon)
    fc = {}
    for name, keep in (("model", True), ("base", False)):
        p = heads.with_keep(kept, np.full(4, keep))
        for split, ends in (("train", prep.ends["train"]), ("first", first), ("second", second)):
            fc[name, split] = forecast.forecast_ends(
                loaded.module, p, prep, ends, spec.lookback, spec.horizon
            )
    idx = first[:, None] + np.arange(1, spec.horizon + 1)
    y = prep.targets[idx].astype(np.float64) - prep.anchor[first][:, None, None]
    errs = {
        n: column_fallback.window_errors(spec.loss, fc[n, "first"].norm_NHC, y)
        for n in ("model", "base")
    }
    out = {}
    for bar in bars:
        keep_C = (
            np.ones(4, bool)
            if bar == "never"
            else keep_with_bar(errs["model"], errs["base"], float(bar), spec.horizon - 1)
        )
        fcs = {
            "train": masked(prep, fc["model", "train"], fc["base", "train"], keep_C),
            "val": masked(prep, fc["model", "second"], fc["base", "second"], keep_C),
        }
        scored = band_refit.refit_for("val", prep, fcs, spec)[0]["val"]
        actual = metrics.next_candles(prep.ohlc, second, spec.horizon)
        scores = metrics.score_prices(prep.ohlc[second], actual, scored.prices_NHC)
        out[str(bar)] = {c: scores["columns"][c]["skill"] for c in COLUMNS}
        out[str(bar)]["worse"] = (scores["dm"]["p_value_better"] or 0) > 0.95
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workdir")
    p.add_argument("--bars", default="1,0.5,0,-1,never")
    args = p.parse_args()
    bars = args.bars.split(",")
    config = config_lib.upgrade(writers.read_json(os.path.join(args.workdir, "config.json")))
    results = writers.read_json(os.path.join(args.workdir, "results.json"))["series"]
    series, _ = sources.load_all(config.data)
    preps, _ = windows.prepare_all([s for s in series if s.name in results], config.data)
    spec = evaluate.make_spec(config)
    available = saved.available_models(args.workdir)
    per_series = {}
    for prep in preps:
        loaded = saved.load_model(available[prep.name])
        per_series[prep.name] = series_scores(loaded, prep, results[prep.name], spec, bars)
    for bar in bars:
        row = {
            c: round(100 * statistics.median(s[bar][c] for s in per_series.values()), 2)
            for c in COLUMNS
        }
        gain = (
            {
                f"{c} vs never (mean)": round(
                    100 * statistics.mean(s[bar][c] - s["never"][c] for s in per_series.values()),
                    2,
                )
                for c in COLUMNS
            }
            if "never" in bars
            else {}
        )
        worse = sum(s[bar]["worse"] for s in per_series.values())  # close DM-worse, one-sided
        print(
            json.dumps({"bar": bar, "series": len(per_series), **row, **gain, "close worse": worse})
        )


if __name__ == "__main__":
    main()
