"""--mode evaluate: score every saved best model of a workdir on the data of a config,
without training (cpbjax/score/evaluate.py scores each one)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import time

from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.modes import facts, trained_run
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.score import saved
from cpbjax.score.evaluate import evaluate_models, make_spec


class NothingEvaluated(RuntimeError):
    """Every requested series was skipped; nothing is written and the reasons are listed."""


def _read_results(workdir: str) -> dict:
    path = workdir_lib.results_json(workdir)
    return writers.read_json(path) if os.path.exists(path) else {}


def _score_all(loaded, preps, trained_results, cfg, forecasts_dir):
    """results entries (training facts + val/test scores) and test forecast records."""
    series, records = {}, {}
    # The saved mask stands: it was decided on the training run's own val split.
    spec = dataclasses.replace(make_spec(cfg), column_fallback=False)

    # Series scored side by side, with their count and ETA in the log; the series of one
    # pooled model (the same module and params) have their forecasts batched together.
    by_module = {}
    for name in preps:
        by_module.setdefault(loaded[name].module, []).append(name)
    scored = {}
    for module, names in by_module.items():
        params = [loaded[name].params for name in names]
        group = evaluate_models(module, params, [preps[n] for n in names], spec, forecasts_dir)
        scored.update(zip(names, group, strict=True))
    for name in preps:
        entry, record = scored[name].entry, scored[name].record
        prep = preps[name]
        trained = trained_results.get("series", {}).get(name, {})
        series[name] = {k: v for k, v in trained.items() if k not in ("val", "test")}
        series[name].update(entry, data=prep.notes)  # the evaluated data
        records[name] = record
    return series, records


def run_evaluate(config, workdir: str) -> dict:
    """Scores every saved best model of `workdir` on the data of `config`, without training.

    The series are config.data.symbols x config.data.intervals; series that training
    skipped are listed as skipped. Writes <workdir>/eval-<YYYYmmdd-HHMMSS>.json (the
    results.json schema, with the training facts of each series), the same report as
    <workdir>/eval-<stamp>.md with plots under <workdir>/plots/eval-<stamp>/, and with
    eval.save_forecasts the forecasts under <workdir>/eval-<stamp>/forecasts/.

    Returns:
      The results dict that was written.

    Raises:
      saved.ModelNotFound: a requested series has no model (the message lists those that do).
      NothingEvaluated: no requested series could be scored.
    """
    started = time.time()
    stem = "eval-" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    available = saved.available_models(workdir)
    trained_results = _read_results(workdir)
    names, skipped = saved.select_series(
        available,
        config.data.symbols,
        config.data.intervals,
        excused=trained_results.get("skipped", {}),
    )
    loaded, trained, unreadable = saved.load_models(available, names)
    cfg = trained_run.run_config(config, trained, list(loaded))
    preps, data_skipped = trained_run.prepare(cfg, loaded)
    skipped.update(unreadable, **data_skipped)
    forecasts_dir = os.path.join(workdir, stem) if cfg.eval.save_forecasts else None
    series, records = _score_all(loaded, preps, trained_results, cfg, forecasts_dir)
    if not series:
        raise NothingEvaluated(f"no series could be evaluated; skipped: {skipped}")
    run = facts.run_facts("evaluate", cfg, started, **facts.scored_workdir(cfg, workdir))
    results = {"run": run, "series": series, "skipped": skipped}
    writers.write_json(os.path.join(workdir, f"{stem}.json"), results)
    inputs = report.PlotInputs(forecasts=records)
    report.write_reports(workdir, results, report_spec.make_spec(cfg), inputs, stem)
    return results
