"""--mode train with a sweep: every (series, setting) coin trained together, the best kept.

The grid of `sweep.<field>` (cpbjax/config/sweep_grid.py) crossed with the run's series gives
one coin per pair, named "<SERIES>@<setting>" and carrying its hyperparameters as
per-coin arrays, so the whole grid trains in the run's usual compiled programs, through
the same driver as a train run (cpbjax/modes/driver.py: resume ledger, checkpoints,
compaction, sharding), in the run folder <workdir>/sweep/. A setting is chosen per
series by validation loss only (`choose`; the test scores are reported, never read), and
the run is then published as a train run of the chosen settings: models/<SERIES>/ (its
meta.json holding the config of the chosen setting alone), results.json (each entry
adding "sweep": the chosen setting; its top-level "sweep" the grid, `by_setting` and the
series whose lowest val loss several settings tie on), the report (with a sweep section,
cpbjax/report/sweep_section.py), config.json and timings.json, so
predict, export and serve use it unchanged. <workdir>/sweep.json holds the whole grid.

With train.share=pooled a setting is ONE model over every series: its coins form a group
of their own (`plan_for`), purged across series as a pooled train run's, and the
groups train one after another in the same compiled program (each has one coin per
series); the setting's values reach the pooled step from the group's coin arrays.
"""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import numpy as np
from absl import logging

from cpbjax import sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config import sweep_grid
from cpbjax.data import pooling
from cpbjax.modes import driver, facts
from cpbjax.modes import plan as plan_lib
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report import sweep_section as report_sweep
from cpbjax.report.runlog import StageClock
from cpbjax.training import checkpoint, sharing

# Per-coin fields left out of sweep.json: wall-clock times (the same run resumed gives
# the same file) and the series' data notes (in results.json once per series).
OMITTED_FIELDS = ("train_seconds", "group_train_seconds", "peak_memory_bytes", "data")


def grid(config) -> dict:
    """sweep.json's "sweep": the swept values, the settings in grid order (both also in
    the resume ledger), and the selection rule."""
    return writers.to_jsonable(
        {
            "fields": {f: list(config.sweep[f]) for f in sweep_grid.swept(config)},
            "settings": [sweep_grid.setting_name(s) for s in sweep_grid.settings(config)],
            "select": config.sweep.select,
        }
    )


def table(series_names: list[str], entries: dict, config) -> dict:
    """series -> setting name -> its coin's numbers: the setting's values, training
    status, best val loss (the selection criterion), val and test scores."""
    out = {}
    for series in series_names:
        out[series] = {}
        for setting in sweep_grid.settings(config):
            coin = sweep_grid.coin_name(series, setting)
            entry = {k: v for k, v in entries[coin].items() if k not in OMITTED_FIELDS}
            out[series][sweep_grid.setting_name(setting)] = {"coin": coin, **setting, **entry}
    return out


def val_loss(cell: dict) -> float:
    """A coin's selection criterion: its best val loss (train.loss on the val windows of
    the params it keeps), inf when it has none that is finite."""
    v = cell.get("best_val_loss")
    return float(v) if v is not None and math.isfinite(v) else math.inf


def pooled_scores(tab: dict) -> dict:
    """setting -> mean over series of its val loss / the series' lowest val loss.

    1.0 means best on every series; the ratio makes series of any loss scale count
    alike. Series whose lowest val loss is not finite and positive are left out.
    """
    ratios: dict = {}
    for row in tab.values():
        losses = {name: val_loss(cell) for name, cell in row.items()}
        low = min(losses.values())
        if not (math.isfinite(low) and low > 0):
            continue
        for name, v in losses.items():
            ratios.setdefault(name, []).append(v / low)
    return {name: float(np.mean(r)) for name, r in ratios.items()}


def lowest(row: dict) -> list[str]:
    """The settings of one series' row at its lowest finite val loss, ties included (the
    untrained baseline, kept, has the same val loss at every setting); [] if none is finite."""
    losses = {name: val_loss(cell) for name, cell in row.items()}
    low = min(losses.values())
    if not math.isfinite(low):
        return []
    return [
        name for name, v in losses.items() if math.isclose(v, low, rel_tol=report_sweep.TIE_RTOL)
    ]


def by_setting(tab: dict, chosen: dict) -> dict:
    """results.json's sweep.by_setting, the report's sweep section: setting (grid order) ->
    the median over series of its val loss, its `pooled_scores` ("relative_val_loss"),
    how many series chose it and on how many its val loss is the lowest, ties included."""
    scores, rows = pooled_scores(tab), list(tab.values())
    out = {}
    for name in rows[0] if rows else ():
        finite = [v for v in (val_loss(row[name]) for row in rows) if math.isfinite(v)]
        out[name] = {
            "median_val_loss": float(np.median(finite)) if finite else None,
            "relative_val_loss": scores.get(name),
            "chosen_by": sum(c == name for c in chosen.values()),
            "lowest_on": sum(name in lowest(row) for row in rows),
        }
    return out


def choose(tab: dict, select: str) -> dict:
    """series -> chosen setting name (None where no setting has a finite val loss).

    select "series": each series' setting of lowest val loss; "pooled": for every series
    the setting of lowest `pooled_scores`. Ties go to the first setting in grid order.
    """
    if select == "pooled":
        scores = pooled_scores(tab)
        best = min(scores, key=scores.get) if scores else None
    chosen = {}
    for series, row in tab.items():
        losses = {name: val_loss(cell) for name, cell in row.items()}
        if not math.isfinite(min(losses.values())):
            chosen[series] = None
        else:
            chosen[series] = best if select == "pooled" else min(losses, key=losses.get)
    return chosen


def _publish_model(config, run_dir: str, workdir: str, series: str, cell: dict) -> None:
    """Copies a chosen coin's model to <workdir>/models/<SERIES>/, its meta.json naming
    the series and holding the config that trains this setting alone."""
    setting = {f: cell[f] for f in sweep_grid.swept(config)}
    params, meta = checkpoint.load_series_model(workdir_lib.series_model(run_dir, cell["coin"]))
    alone = sweep_grid.setting_config(config, setting)
    meta.update(series=series, config=alone.to_dict(), sweep={"coin": cell["coin"], **setting})
    checkpoint.save_series_model(workdir_lib.series_model(workdir, series), params, meta)


def _history(run_dir: str, coin_series: dict) -> list[dict]:
    """The sweep's metrics.jsonl records with each chosen coin renamed to its series."""
    records = writers.MetricsLog(run_dir).records()
    return [{**r, "series": [coin_series.get(n, n) for n in r["series"]]} for r in records]


class _Trained(NamedTuple):
    """A trained sweep, as publishing reads it."""

    run_dir: str  # <workdir>/sweep/
    table: dict  # `table`
    entries: dict  # coin name -> results.json entry
    records: dict  # coin name -> test forecast record


def _publish(config, workdir: str, trained: _Trained, chosen: dict, skipped: dict) -> tuple:
    """Writes models/<SERIES>/ of each chosen setting; returns the results.json series
    entries, the report's history and its forecasts, by series name. A series with no
    chosen setting goes to `skipped`."""
    run_dir, tab, entries, records = trained
    series_entries, forecasts, coin_series = {}, {}, {}
    for series, name in chosen.items():
        if name is None:
            skipped[series] = "no sweep setting has a finite val loss (every one diverged)"
            continue
        cell = tab[series][name]
        _publish_model(config, run_dir, workdir, series, cell)
        setting = {f: cell[f] for f in sweep_grid.swept(config)}
        sweep = {"setting": name, "coin": cell["coin"], **setting}
        series_entries[series] = {**entries[cell["coin"]], "sweep": sweep}
        coin_series[cell["coin"]] = series
        if cell["coin"] in records:
            forecasts[series] = {**records[cell["coin"]], "series": np.array(series)}
    return series_entries, _history(run_dir, coin_series), forecasts


def _write(config, workdir: str, results: dict, out: dict, published: tuple, clock) -> None:
    """Writes results.json, sweep.json, config.json and the report (`published`: the
    report's history and forecasts, as `_publish` returns them)."""
    history, forecasts = published
    writers.write_config(workdir, config)
    writers.write_results(workdir, results)
    writers.write_json(workdir_lib.sweep_json(workdir), out)
    with clock.stage("report"):
        inputs = report.PlotInputs(history, forecasts)
        report.write_reports(workdir, results, report_spec.make_spec(config), inputs)


def plan_for(config, clock: StageClock) -> tuple[plan_lib.Plan, list[str]]:
    """The sweep's plan, and the names of the series that train.

    Every (series, setting) coin, a series' settings adjacent, in chunks of group_size;
    with train.share=pooled one group per setting, each ONE pooled model over every
    series at that setting, purged across series as a pooled train run is
    (data/pooling.py). The ledger's fingerprint holds the grid without sweep.select: the
    choice only reads the trained coins, so a rerun may change it.
    """
    preps, skipped = plan_lib.prepare_all(config, clock)
    trained = {k: v for k, v in grid(config).items() if k != "select"}
    fields = {"extra_print": {"sweep": trained}}
    if not sharing.from_config(config.train).pools_windows:
        coins = sweep_grid.expand(preps, config)
        return plan_lib.chunked(config, coins, skipped=skipped, **fields), [p.name for p in preps]
    preps, kept, emptied = pooling.pooled_series(preps, config.data)
    groups = sweep_grid.by_setting(preps, config)
    pool = {c.name: kept[sweep_grid.series_of(c.name)] for group in groups for c in group}
    fields.update(skipped={**skipped, **emptied}, pool_ends=pool)
    return plan_lib.of_groups(config, groups, **fields), [p.name for p in preps]


def run_sweep(config, workdir: str) -> dict:
    """Trains every (series, setting) coin of the sweep, chooses and publishes settings.

    Rerunning with the same workdir resumes as a train run does (the ledger of
    sweep/checkpoints/ also holds the grid, so another grid is refused); a finished
    sweep rerun with another sweep.select only chooses and publishes again.

    Returns:
      The sweep.json dict: "run", "sweep" (`grid`), "series" (per series its "settings"
      by name and the "chosen" one), "pooled_scores" (`pooled_scores`), "skipped".

    Raises:
      ConfigError: a bad config value. RunMismatch: sweep/ holds another sweep.
      NothingTrained: every series was skipped (nothing is written).
    """
    config_lib.validate(config)
    started, clock = time.time(), StageClock()
    run_dir = workdir_lib.sweep_run(workdir)
    os.makedirs(run_dir, exist_ok=True)
    plan, series_names = plan_for(config, clock)
    skipped = dict(plan.skipped)
    if not series_names:
        raise driver.NothingTrained(f"no series could be trained; skipped: {skipped}")
    entries, records = driver.train_groups(config, run_dir, plan, clock)
    tab = table(series_names, entries, config)
    chosen = choose(tab, config.sweep.select)
    logging.info("sweep: chosen settings (by val loss): %s", chosen)
    run = facts.run_facts("sweep", config, started, **plan.facts(config))
    extra = {"sweep": grid(config)}
    series = {s: {"settings": row, "chosen": chosen[s]} for s, row in tab.items()}
    out = {"run": run, **extra, "series": series, "pooled_scores": pooled_scores(tab)}
    if sharding.is_primary():
        trained = _Trained(run_dir, tab, entries, records)
        got = _publish(config, workdir, trained, chosen, skipped)
        results = _results(run, extra["sweep"], tab, chosen, got[0], skipped)
        out = writers.to_jsonable({**out, "skipped": skipped})
        _write(config, workdir, writers.to_jsonable(results), out, got[1:], clock)
        writers.write_json(workdir_lib.timings_json(workdir), clock.timings(started))
    sharding.barrier("cpbjax sweep finished")
    return writers.to_jsonable({**out, "skipped": skipped})


def _results(run: dict, grid_facts: dict, tab, chosen, series: dict, skipped: dict) -> dict:
    """The sweep's results.json: its published series and the grid's summary."""
    tied = sorted(s for s, row in tab.items() if len(lowest(row)) > 1)
    summary = {**grid_facts, "by_setting": by_setting(tab, chosen), "tied_series": tied}
    return {"run": run, "series": series, "skipped": skipped, "sweep": summary}
