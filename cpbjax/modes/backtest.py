"""--mode backtest: a rolling-origin backtest, every (series, fold) pair one coin.

Each series is cut into `backtest.folds` folds (cpbjax/data/folds.py); every fold is a
PreparedSeries named "<SERIES>@fold<f>", trained as one coin of the group programs by
the same driver as a train run (cpbjax/modes/driver.py: resume ledger, checkpoints,
compaction, sharding), in the run folder <workdir>/backtest/. Each fold is scored on its
test block as a train run scores its test split (cpbjax/score/evaluate.py: the naive
forecasts, and the fitted baselines refit on the fold's own train+val windows); its test
forecasts are saved (<workdir>/backtest/forecasts/), never its model, and the folds are
pooled per series and over all series (cpbjax/score/backtest_scores.py) into
<workdir>/backtest.json and <workdir>/backtest.md. A train run's files in the same
workdir (results.json, models/, checkpoints/) are never touched.

With train.share=pooled each fold is one group, one pooled model over that fold's
series, its windows purged across them (cpbjax/data/pooling.py): a model over all folds
would learn later folds' test blocks.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import logging

from cpbjax import sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config import sweep_grid
from cpbjax.config_rules import ConfigError
from cpbjax.data import folds, pooling, sources
from cpbjax.modes import driver, facts
from cpbjax.modes import plan as plan_lib
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report.runlog import StageClock
from cpbjax.score import backtest_scores, baselines, evaluate, forecast
from cpbjax.training import sharing

# Per-window wall-clock fields left out of a fold's backtest.json entry: the same run
# resumed gives the same file.
TIMING_FIELDS = ("train_seconds", "group_train_seconds", "peak_memory_bytes")


class NothingBacktested(RuntimeError):
    """No fold of any series could be trained; the reasons are listed."""


def _prepare(config, clock: StageClock) -> tuple[list, dict]:
    """Every fold PreparedSeries of the run's series, and name -> skip reason."""
    with clock.stage("load"):
        series, skipped = sources.load_all(config.data)
    with clock.stage("prepare"):
        preps, unusable = folds.prepare_all(series, config.data, config.backtest)
    return preps, {**skipped, **unusable}


def _fold_arrays(prep, run_dir: str, spec: evaluate.EvalSpec) -> dict | str:
    """The arrays `backtest_scores` pools for one fold, or why it cannot be pooled.

    The model's test forecasts come from the fold's forecasts file (written when its
    group finished); the baselines (ridge, volatility band, HAR) are refit here on the
    fold's train+val windows.
    """
    path = workdir_lib.forecasts_file(run_dir, prep.name)
    if not os.path.exists(path):
        return f"no test forecasts: {path} is missing"
    record = forecast.load_forecasts(path)
    ends_N = prep.ends["test"]
    if not np.array_equal(record["last_open_time_ms"], prep.open_time_ms[ends_N]):
        return f"{path} does not hold this fold's test windows (the data changed)"
    ridge, band_N2, _, _ = baselines.fitted_predictions(prep, "test", ends_N, spec)
    har_N2 = baselines.har_band(prep, "test", ends_N, spec.horizon)
    keys = ("last_open_time_ms", "last_candle", "actual", "predicted")
    return {
        **{k: record[k] for k in keys},
        "ridge": ridge,
        "vol_band": _high_low_only(band_N2, ridge.shape),
        "har": _high_low_only(har_N2, ridge.shape),
    }


def _high_low_only(high_low_NH2, shape) -> np.ndarray:
    """A band's [N, H, 2] forecasts as [N, H, 4] OHLC arrays, open and close NaN."""
    out = np.full(shape, np.nan)
    out[..., 1:3] = high_low_NH2
    return out


def _blocks(prep) -> dict:
    """Each split of a fold: its window count and first/last window end (ISO times)."""
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t) / 1000))  # noqa: E731
    return {
        split: {
            "windows": int(len(e)),
            "first_window_end": iso(prep.open_time_ms[e[0]]),
            "last_window_end": iso(prep.open_time_ms[e[-1]]),
        }
        for split, e in prep.ends.items()
    }


def _series_scores(preps: list, entries: dict, run_dir: str, config, skipped: dict):
    """backtest.json's "series" (per series its folds and pooled scores) and the scaled
    losses of each series for the panel tests; folds that cannot be pooled go to `skipped`."""
    spec = evaluate.make_spec(config)
    grouped: dict = {}
    for prep in preps:
        grouped.setdefault(folds.series_of(prep.name), []).append(prep)
    series, losses = {}, {}
    for name, fold_preps in grouped.items():
        fold_entries, arrays = [], []
        for prep in fold_preps:
            entry = {k: v for k, v in entries[prep.name].items() if k not in TIMING_FIELDS}
            fold = {"fold": folds.fold_of(prep.name), "name": prep.name, "blocks": _blocks(prep)}
            fold_entries.append({**fold, **entry})
            got = _fold_arrays(prep, run_dir, spec)
            if isinstance(got, str):
                skipped[prep.name] = f"not pooled: {got}"
                logging.warning("%s: %s", prep.name, skipped[prep.name])
            else:
                arrays.append(got)
        series[name] = {"folds": fold_entries}
        if arrays:
            pooled_arrays = backtest_scores.concat_folds(arrays)
            series[name]["pooled"] = backtest_scores.series_pooled(pooled_arrays)
            series[name]["pooled"]["folds"] = len(arrays)
            losses[name] = backtest_scores.scaled_losses(pooled_arrays, series[name]["pooled"])
    return series, losses


def _score_folds(preps: list, entries: dict, run_dir: str, config, skipped: dict):
    """backtest.json's "series" (`_series_scores`) and "pooled" (over all series)."""
    series, losses = _series_scores(preps, entries, run_dir, config, skipped)
    intervals = {folds.series_of(p.name): p.interval for p in preps}
    pooled = backtest_scores.all_series_pooled(
        {n: e["pooled"] for n, e in series.items() if "pooled" in e},
        losses,
        intervals,
        config.data.horizon,
    )
    return series, pooled


def _settings(config) -> dict:
    """backtest.json's "backtest": the fold settings (also in the resume ledger)."""
    return writers.to_jsonable(config.backtest.to_dict())


def _check(config) -> None:
    """Raises ConfigError where a backtest cannot pool the folds' price-space errors,
    would silently ignore a sweep (sweeps are not crossed with folds), or would score a
    fine-tuning start (train.init_from) on windows it may have trained on."""
    if sweep_grid.is_sweep(config):
        raise ConfigError(
            f"config.sweep.{sweep_grid.swept(config)[0]} is set, but --mode backtest does not "
            "cross sweeps with folds: run the sweep with --mode train, or the backtest of "
            "one setting without sweep.*"
        )
    if config.train.init_from:
        raise ConfigError(
            f"train.init_from={config.train.init_from!r} is set, but a backtest's folds "
            "would score a start trained on their own months: backtest the starting run's "
            "config instead"
        )


def plan_for(config, clock: StageClock) -> plan_lib.Plan:
    """The backtest's plan: every (series, fold) coin in chunks of group_size, models not
    kept, the fold settings in the ledger's fingerprint; with train.share=pooled one group
    per fold in time order, each purged across its own series only."""
    preps, skipped = _prepare(config, clock)
    fields = {"keep_models": False, "extra_print": {"backtest": _settings(config)}}
    if not sharing.from_config(config.train).pools_windows:
        return plan_lib.chunked(config, preps, skipped=skipped, **fields)
    groups, pool = [], {}
    for f in sorted({folds.fold_of(p.name) for p in preps}):
        fold = [p for p in preps if folds.fold_of(p.name) == f]
        kept_fold, kept, emptied = pooling.pooled_series(fold, config.data)
        groups.append(kept_fold)
        pool.update(kept)
        skipped = {**skipped, **emptied}
    groups = [g for g in groups if g]
    return plan_lib.of_groups(config, groups, skipped=skipped, pool_ends=pool, **fields)


def run_backtest(config, workdir: str) -> dict:
    """Trains every (series, fold) pair as a coin, scores and pools the folds.

    Writes <workdir>/backtest.json, <workdir>/backtest.md and the run folder
    <workdir>/backtest/ (config.json, metrics.jsonl, checkpoints/, forecasts/), and prints
    the pooled skill and those paths. Rerunning
    with the same workdir resumes it as a train run resumes (the ledger of
    backtest/checkpoints/ also holds the fold settings, so other folds are refused).

    Returns:
      The backtest.json dict.

    Raises:
      ConfigError: a bad config value. RunMismatch: backtest/ holds another backtest.
      NothingBacktested: no fold of any series could be trained (nothing is written).
    """
    config_lib.validate(config)
    _check(config)
    started, clock = time.time(), StageClock()
    run_dir = workdir_lib.backtest_run(workdir)
    os.makedirs(run_dir, exist_ok=True)
    plan = plan_for(config, clock)
    preps, skipped = plan.coins, dict(plan.skipped)
    if not preps:
        raise NothingBacktested(f"no fold of any series could be trained; skipped: {skipped}")
    entries, _ = driver.train_groups(config, run_dir, plan, clock)
    with clock.stage("evaluate"):
        series, pooled = _score_folds(preps, entries, run_dir, config, skipped)
    run = facts.run_facts("backtest", config, started, **plan.facts(config))
    out = {"run": run, "backtest": _settings(config), "series": series, "pooled": pooled}
    out = writers.to_jsonable({**out, "skipped": skipped})
    if sharding.is_primary():
        writers.write_json(workdir_lib.backtest_json(workdir), out)
        with clock.stage("report"):
            md = report.write_backtest_report(workdir, out, report_spec.make_spec(config))
        html = workdir_lib.report_html(workdir, workdir_lib.BACKTEST_STEM)
        report.print_backtest(out, [workdir_lib.backtest_json(workdir), md, html, run_dir])
    sharding.barrier("cpbjax backtest finished")
    return out
