"""--mode ablate: do the covariates help? Every covariate setting trained as one sweep.

A setting keeps some of the covariates: "all", "none", and "without-<name>" per thing
left out (none when there is only one: that would be "none" again): each data.covariates
column alone, and each data.market_series symbol's two columns together (`left_out`;
"without-BTCUSDT" drops BTCUSDT_return and BTCUSDT_range). Its coin is the
series' PreparedSeries renamed "<SERIES>@<setting>" whose inputs [T, F + K] hold 0 in the
columns of the covariates it leaves out (`coin`). A zero input column reaches no
activation and gets its first-layer weights no gradient, so the coin is the model
without those inputs, and every setting keeps the input width F + K: all settings train
in the run's usual compiled programs, through the same driver as a sweep
(cpbjax/modes/sweep.py), in <workdir>/ablate/, and are scored on the same windows, val
and test, with their left-out columns still 0. With train.share=pooled a setting is ONE
model over every series (a group per setting, as a pooled sweep's), so no two settings
share params; every setting starts from the same initial params.

The verdict (cpbjax/score/ablation.py) reads the scores and the scorer's per-window
losses (saved under ablate/window_mae/): results.json's "ablate", its report section
(cpbjax/report/ablate_section.py), ablate.json (every coin's entry) and the sentences the
run prints last. results.json's "series" are the "all" setting's entries. No model is
published under models/: the settings are compared here; a covariate model is trained
for use with --mode train.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from cpbjax import columns, sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.data import pooling
from cpbjax.modes import driver, facts, sweep
from cpbjax.modes import plan as plan_lib
from cpbjax.report import ablate_section
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report.runlog import StageClock
from cpbjax.score import ablation, saved
from cpbjax.training import sharing

SEPARATOR = "@"
ALL, NONE, WITHOUT = "all", "none", "without-"


class NoCovariates(ValueError):
    """--mode ablate without data.covariates or data.market_series: nothing to leave out."""


def left_out(covariates, market_series=()) -> dict[str, tuple]:
    """What one setting leaves out at once, name -> its covariate columns: each of
    `covariates` (data.covariates) alone, each symbol of `market_series` its two columns."""
    out = {name: (name,) for name in covariates}
    out.update({symbol: columns.market_columns((symbol,)) for symbol in market_series})
    return out


def settings(covariates, market_series=()) -> dict[str, tuple]:
    """Setting name -> the covariate columns it keeps, in `columns.covariate_names` order."""
    groups = left_out(covariates, market_series)
    names = tuple(c for cols in groups.values() for c in cols)
    out = {ALL: names, NONE: ()}
    if len(groups) > 1:
        out.update(
            {
                f"{WITHOUT}{g}": tuple(c for c in names if c not in cols)
                for g, cols in groups.items()
            }
        )
    return out


def data_settings(data_cfg) -> dict[str, tuple]:
    """`settings` of a run's data config."""
    return settings(data_cfg.covariates, data_cfg.market_series)


def without(name: str, groups) -> str:
    """The setting without `name`, one of `groups` (`left_out`'s keys): "none" when it is
    the only one."""
    return f"{WITHOUT}{name}" if len(groups) > 1 else NONE


def coin(prep, setting: str, kept: tuple, covariates: tuple):
    """The PreparedSeries `prep` as one setting's coin: inputs [T, F + K] with the columns
    of the covariates not `kept` set to 0 (the K covariates are the last columns); "all"
    shares the series' inputs, the others copy them."""
    coin_name = f"{prep.name}{SEPARATOR}{setting}"
    if set(kept) == set(covariates):
        return dataclasses.replace(prep, name=coin_name)
    inputs_TF = prep.inputs.copy()
    first = inputs_TF.shape[1] - len(covariates)
    for k, name in enumerate(covariates):
        if name not in kept:
            inputs_TF[:, first + k] = 0.0
    return dataclasses.replace(prep, name=coin_name, inputs=inputs_TF)


def plan_for(config, clock: StageClock) -> tuple[plan_lib.Plan, list[str]]:
    """The ablation's plan and the names of the series that train: every (series,
    setting) coin in groups of train.group_size, a series' settings adjacent; with
    train.share=pooled one group per setting, purged across series as a pooled train run."""
    preps, skipped = plan_lib.prepare_all(config, clock)
    covariates, grid = columns.covariate_names(config.data), data_settings(config.data)
    fields = {"extra_print": {"ablate": list(grid)}, "keep_window_mae": True}
    if not sharing.from_config(config.train).pools_windows:
        coins = [coin(p, s, kept, covariates) for p in preps for s, kept in grid.items()]
        return plan_lib.chunked(config, coins, skipped=skipped, **fields), [p.name for p in preps]
    preps, kept_ends, emptied = pooling.pooled_series(preps, config.data)
    groups = [[coin(p, s, kept, covariates) for p in preps] for s, kept in grid.items()]
    pool = {c.name: kept_ends[c.name.split(SEPARATOR)[0]] for g in groups for c in g}
    fields.update(skipped={**skipped, **emptied}, pool_ends=pool)
    return plan_lib.of_groups(config, groups, **fields), [p.name for p in preps]


def _rows(series_names: list[str], entries: dict, grid: dict) -> dict:
    """series -> setting -> its coin's results entry, for the scored coins."""
    rows = {}
    for series in series_names:
        row = {s: entries.get(f"{series}{SEPARATOR}{s}") for s in grid}
        rows[series] = {s: e for s, e in row.items() if e is not None and "val" in e}
    return rows


def verdict(config, rows: dict, window_mae: dict) -> dict:
    """results.json's "ablate": the settings, `ablation.by_setting`, the gain of "all"
    over "none" and, per thing left out (`left_out`: a covariate or a market symbol), over
    the setting without it, the val ranking and the sentences (`ablate_section.sentences`)."""
    groups = left_out(config.data.covariates, config.data.market_series)
    grid, lag = data_settings(config.data), config.data.horizon - 1
    gains = {n: ablation.gain(rows, window_mae, ALL, without(n, groups), lag) for n in groups}
    out = {
        "covariates": list(groups),
        "settings": {s: list(kept) for s, kept in grid.items()},
        "by_setting": ablation.by_setting(rows, list(grid)),
        "all_over_none": ablation.gain(rows, window_mae, ALL, NONE, lag),
        "all_over_without": gains,
        "ranked_on_val": ablation.rank(gains),
        "significance": ablation.SIGNIFICANT,
    }
    out["sentences"] = ablate_section.sentences(out)
    return writers.to_jsonable(out)


def _window_mae(run_dir: str, rows: dict) -> dict:
    """series -> setting -> split -> float64 [N, C], as the scorer saved them."""
    return {
        series: {s: saved.load_window_mae(run_dir, f"{series}{SEPARATOR}{s}") for s in row}
        for series, row in rows.items()
    }


def run_ablate(config, workdir: str) -> dict:
    """Trains every (series, setting) coin, scores the settings, writes and prints the verdict.

    Rerunning with the same workdir resumes as a train run does.

    Returns:
      The results.json dict ("run", "series": the "all" setting's entries, "skipped",
      "ablate": `verdict`).

    Raises:
      NoCovariates: data.covariates and data.market_series are empty. ConfigError: a bad
        config value.
      RunMismatch: ablate/ holds another run. NothingTrained: every series was skipped.
    """
    config_lib.validate(config)
    if not columns.covariate_names(config.data):
        raise NoCovariates(
            "--mode ablate needs data.covariates or data.market_series, the columns to leave "
            "out in turn, e.g. --config configs/mlp.py:covariates"
        )
    started, clock = time.time(), StageClock()
    run_dir = workdir_lib.ablate_run(workdir)
    os.makedirs(run_dir, exist_ok=True)
    plan, series_names = plan_for(config, clock)
    if not series_names:
        raise driver.NothingTrained(f"no series could be trained; skipped: {plan.skipped}")
    entries, records = driver.train_groups(config, run_dir, plan, clock)
    rows = _rows(series_names, entries, data_settings(config.data))
    results = {
        "run": facts.run_facts("ablate", config, started, **plan.facts(config)),
        "series": {s: entries[f"{s}{SEPARATOR}{ALL}"] for s, row in rows.items() if ALL in row},
        "skipped": dict(plan.skipped),
    }
    if sharding.is_primary():
        results["ablate"] = verdict(config, rows, _window_mae(run_dir, rows))
        results = writers.to_jsonable(results)
        _write(config, workdir, results, rows, records, clock)
        writers.write_json(workdir_lib.timings_json(workdir), clock.timings(started))
        print("\n".join(results["ablate"]["sentences"]), flush=True)
    sharding.barrier("cpbjax ablate finished")
    return results


def _write(config, workdir: str, results: dict, rows: dict, records: dict, clock) -> None:
    """Writes config.json, results.json, ablate.json (every coin's entry, series ->
    setting) and the report, whose plots show the "all" setting's test forecasts."""
    table = {
        s: {
            n: {k: v for k, v in e.items() if k not in sweep.OMITTED_FIELDS} for n, e in row.items()
        }
        for s, row in rows.items()
    }
    writers.write_config(workdir, config)
    writers.write_results(workdir, results)
    writers.write_json(
        workdir_lib.ablate_json(workdir),
        writers.to_jsonable({"run": results["run"], "series": table}),
    )
    forecasts = {
        s: {**records[f"{s}{SEPARATOR}{ALL}"], "series": np.array(s)}
        for s in results["series"]
        if f"{s}{SEPARATOR}{ALL}" in records
    }
    with clock.stage("report"):
        inputs = report.PlotInputs(None, forecasts)
        report.write_reports(workdir, results, report_spec.make_spec(config), inputs)
