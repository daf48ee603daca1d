"""Scoring models: `evaluate_model`, what training and --mode evaluate both call.

A model is scored on the val and test splits of a series, in price units, against the
naive forecasts (cpbjax/score/metrics.py) and the fitted baselines (cpbjax/score/baselines.py) on
the same windows. The test split is scored here and nowhere else.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from absl import logging

from cpbjax import process_pool, progress, sharding
from cpbjax import workdir as workdir_lib
from cpbjax.data import parsing, split_dates
from cpbjax.models import heads
from cpbjax.score import (
    band_refit,
    baseline_cache,
    baselines,
    batch_forecast,
    column_fallback,
    forecast,
    intervals,
    metrics,
)
from cpbjax.score.series_arrays import SeriesArrays
from cpbjax.training import checkpoint


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What scoring reads of a run's config, fixed once per run (as step.EpochSpec is for
    training) and handed down the scoring path in place of loose arguments."""

    lookback: int  # L, candles a window sees
    horizon: int  # H, candles it forecasts
    # config.eval.interval_levels: the calibrated interval of each split, fitted on the
    # splits before it as the fitted baselines are; () fits none.
    interval_levels: tuple = ()
    # config.eval.refit_band: each split is scored by the model with its band refit on
    # the splits before it (cpbjax/score/band_refit.py).
    refit_band: bool = False
    # (days, weight) of the interval scale's long-run blend: intervals.VOL_BLEND in a run,
    # intervals.NO_BLEND for the band's own fit.
    interval_vol: tuple = intervals.NO_BLEND
    # config.eval.column_fallback under a model.baseline: before scoring, each column
    # keeps the network's correction unless its val error, in train.loss, is significantly
    # above the baseline's (cpbjax/score/column_fallback.py).
    column_fallback: bool = False
    loss: str = "mae"
    # config.train.share == "pooled": every series' forecasts take the batched path of
    # batch_forecast (mixed with the series sharing its params, large batches even alone).
    pooled: bool = False
    # config.eval.baseline_cache resolved: the folder of the scores read from the candles
    # alone (cpbjax/score/baseline_cache.py); "" caches nothing.
    baseline_cache: str = ""

    def at_levels(self, levels) -> EvalSpec:
        """This spec for an interval at other levels (a saved calibration's): what
        intervals.py fits or scores at spec.interval_levels."""
        return dataclasses.replace(self, interval_levels=levels)


def make_spec(config) -> EvalSpec:
    """The EvalSpec of a run config (or of a saved model's config)."""
    return EvalSpec(
        lookback=config.data.lookback,
        horizon=config.data.horizon,
        interval_levels=tuple(config.eval.interval_levels),
        refit_band=config.eval.refit_band,
        interval_vol=intervals.VOL_BLEND,
        column_fallback=config.eval.column_fallback and config.model.baseline != "none",
        loss=config.train.loss,
        pooled=config.train.get("share") == "pooled",
        baseline_cache=workdir_lib.cache_setting(
            config.eval.get("baseline_cache", "auto"), baseline_cache.FOLDER
        )
        or "",
    )


class Scored(NamedTuple):
    """What `evaluate_model` gives for one series."""

    entry: dict  # {"val": metrics, "test": metrics}: results.json's series[name] splits
    record: dict  # the test `forecast.forecast_record`
    calibration: dict | None  # `intervals.fit_before` test's, on train+val; None without one
    params: dict  # the params test scored: with eval.refit_band, refit on train+val
    # split -> float64 [N, C]: the scored forecasts' per-window MAE (metrics.window_mae)
    window_mae: dict


def _window_scores(prep, fc: forecast.SplitForecast, horizon: int) -> dict:
    """A split's windows and normalised losses."""
    ends = fc.ends_N
    return {
        "windows": int(len(ends)),
        "horizon": int(horizon),
        "first_window_end": parsing.iso(prep.open_time_ms[ends[0]]),
        "last_window_end": parsing.iso(prep.open_time_ms[ends[-1]]),
        "normalized_mse": metrics.normalized_mse(prep, ends, fc.norm_NHC, horizon),
        # The same for an all-zero output: persistence under last_close. A model far
        # above it learned something worse than not training at all.
        "zero_forecast_mse": metrics.normalized_mse(
            prep, ends, np.zeros_like(fc.norm_NHC), horizon
        ),
        "price_space": True,  # results.json's field: every forecast maps back to prices
    }


def evaluate_split(
    prep, fc: forecast.SplitForecast, split, spec: EvalSpec, calibration=None, arrays=None
) -> dict:
    """All metrics of one series on one split: the results.json series[name][split].

    Args:
      prep: windows.PreparedSeries. fc: `forecast.split_forecast` of that split.
      split: "val" or "test". spec: the run's EvalSpec (its window sizes).
      calibration: an interval calibration fitted on the splits before, or None.
      arrays: the series' SeriesArrays, shared by its splits' scores (a fresh one by
        default).

    Returns:
      The JSON-ready metrics dict (schema: README, "results.json"): windows,
      normalized_mse, columns, direction, dm, ridge and vol_band; a calibration adds
      calibrated_interval.
    """
    arrays = arrays or SeriesArrays(prep.ohlc)
    ends, out = fc.ends_N, _window_scores(prep, fc, spec.horizon)
    actual = arrays.next_candles(ends, spec.horizon)
    out.update(metrics.score_prices(prep.ohlc[ends], actual, fc.prices_NHC))
    out.update(_fitted_baselines(prep, split, ends, spec, out["columns"], arrays))
    if calibration is not None:
        out["calibrated_interval"] = intervals.score_calibrated(
            prep, split, ends, spec, fc.prices_NHC, calibration, arrays
        )
    return out


def _fitted_baselines(prep, split, ends_N, spec, columns, arrays) -> dict:
    """baselines.fitted_baselines of the split, through the baseline cache: handed only the
    naive forecasts' errors of `columns` (the model's are not part of its key)."""
    naive_columns = {c: {k: v[k] for k in ("naive", "best_naive")} for c, v in columns.items()}
    return baseline_cache.cached(
        spec.baseline_cache,
        "fitted_baselines",
        {"lookback": spec.lookback, "horizon": spec.horizon},
        prep,
        arrays,
        {"fit": baselines.fit_ends(prep, split), "scored": ends_N},
        lambda: baselines.fitted_baselines(prep, split, ends_N, spec, naive_columns, arrays),
    )


# Series scored side by side (process_pool.numpy_threads): their scoring is mostly numpy,
# and their forecasts share the compiled programs. The results are the same in any order
# (each series' scoring is independent of the others').
SCORING_THREADS = process_pool.threads()


def map_series(score, jobs: list, label: str = "evaluate", counted=None) -> list:
    """[score(job) for job in jobs], SCORING_THREADS at a time; the first error raises.
    Logs the count done and the ETA under `label` (cpbjax/progress.py), or advances
    `counted` (a progress.Counted its caller finishes) when given."""
    own = counted is None
    counted = progress.Counted(label, len(jobs)) if own else counted

    def score_counted(job):
        result = score(job)
        counted.advance()
        return result

    scored = process_pool.numpy_threads(score_counted, jobs, SCORING_THREADS)
    if own:
        counted.finish()
    return scored


def evaluate_model(module, params, prep, spec: EvalSpec, forecasts_dir=None) -> Scored:
    """Scores one model on the val and test splits of one series: `evaluate_models` of one."""
    return evaluate_models(module, [params], [prep], spec, forecasts_dir, label=None)[0]


# Windows forecast per wave of series (all their forecast splits): the host holds one
# wave's forecasts (about 2 KB a window, with what scoring derives from them).
WAVE_WINDOWS = 1 << 18


def evaluate_models(
    module, params_list, preps, spec: EvalSpec, forecasts_dir=None, label="evaluate"
) -> list[Scored]:
    """Scores each series' model (params_list[i] on preps[i]) on its val and test splits.

    The series are taken in waves of about WAVE_WINDOWS windows. A wave's forward passes
    come first, series that share params (a pooled model) forecast together in large
    batches (batch_forecast.forecast_jobs); then its series are scored side by side
    (`map_series`), each from its own forecasts.

    Args:
      module: the model, applied with train=False. params_list: each series' params.
      preps: windows.PreparedSeries. spec: the run's EvalSpec: with interval_levels, the
        one interval fitted for test (on train+val) is the model's; with refit_band, a
        model without model.baseline=vol_band has no band and is scored as it is.
      forecasts_dir: if set, the test forecasts are also saved to
        <forecasts_dir>/forecasts/<SERIES>.npz (eval.save_forecasts).
      label: the progress log's stage name; None logs nothing.

    With spec.column_fallback the columns are first decided on val
    (`column_fallback.apply_all`), and everything after scores the masked params; the
    entry's `baseline_columns` lists the columns whose forecast is the baseline's (from the
    params' saved mask where no decision is made, e.g. --mode evaluate).

    Returns:
      Each series' Scored, in the order of `preps`.
    """
    counted = progress.Counted(label or "evaluate", len(preps) if label else 0)
    splits = forecast_splits(module, spec)
    scored, cached_before = [], baseline_cache.counts(spec.baseline_cache)
    for wave in _waves(preps, splits):
        wave_params, wave_preps = [params_list[i] for i in wave], [preps[i] for i in wave]
        scored += _evaluate_wave(module, wave_params, wave_preps, spec, forecasts_dir, counted)
    counted.finish()
    if label:
        _log_cache_use(label, spec.baseline_cache, cached_before)
    return scored


def _log_cache_use(label: str, root: str, before: tuple[int, int]) -> None:
    """Logs the baseline score blocks read from the cache under `root` and those computed
    since baseline_cache.counts gave `before`."""
    now = baseline_cache.counts(root)
    read, computed = now[0] - before[0], now[1] - before[1]
    if read + computed:
        logging.info(
            "%s: %d baseline score blocks read from %s, %d computed", label, read, root, computed
        )


def _evaluate_wave(module, params_list, preps, spec, forecasts_dir, counted) -> list[Scored]:
    """`evaluate_models` of one wave: its forward passes, then its series scored."""
    splits = forecast_splits(module, spec)
    entries, params_list = _decide_columns(module, params_list, preps, spec)
    jobs = [
        batch_forecast.Job(params, prep, prep.ends[s])
        for params, prep in zip(params_list, preps, strict=True)
        for s in splits
    ]
    norms = batch_forecast.forecast_jobs(module, jobs, spec.lookback, spec.horizon, spec.pooled)

    def score(j):
        prep, first = preps[j], j * len(splits)
        trained = {
            s: forecast.priced(prep, prep.ends[s], norms[first + k]) for k, s in enumerate(splits)
        }
        return _score_series(module, params_list[j], prep, spec, trained, entries[j], forecasts_dir)

    return map_series(score, list(range(len(preps))), counted=counted)


def forecast_splits(module, spec: EvalSpec) -> tuple:
    """The splits scoring forecasts: train too only when a band refit or an interval is
    fitted on it (one forward pass per split serves every refit:
    band_refit.shifted_forecast)."""
    refit = spec.refit_band and band_refit.applies(module)
    return ("train", "val", "test") if refit or spec.interval_levels else ("val", "test")


def _waves(preps, splits) -> list[list[int]]:
    """Runs of consecutive series indices of at most WAVE_WINDOWS windows (a larger
    series alone)."""
    waves, windows = [], 0
    for i, prep in enumerate(preps):
        n = sum(len(prep.ends[s]) for s in splits)
        if not waves or windows + n > WAVE_WINDOWS:
            waves.append([])
            windows = 0
        waves[-1].append(i)
        windows += n
    return waves


def _score_series(module, params, prep, spec, trained, entry, forecasts_dir) -> Scored:
    """Scores one series from its forecasts `trained` (split -> SplitForecast of `params`)."""
    calibration, arrays = None, SeriesArrays(prep.ohlc)  # what the splits' scores share
    refit = spec.refit_band and band_refit.applies(module)
    scored_params, window_mae = params, {}
    for split in ("val", "test"):
        fcs = trained
        if refit:
            fcs, shift_H2 = band_refit.refit_for(split, prep, trained, spec, arrays)
            scored_params = band_refit.shifted(params, shift_H2)
        if spec.interval_levels:
            point = {s: fcs[s].prices_NHC for s in (*baselines.SPLITS_BEFORE[split], split)}
            calibration = intervals.fit_before(prep, split, point, spec, arrays)
        entry[split] = evaluate_split(prep, fcs[split], split, spec, calibration, arrays)
        actual = arrays.next_candles(fcs[split].ends_N, spec.horizon)
        window_mae[split] = metrics.window_mae(actual, fcs[split].prices_NHC)
        if refit:
            entry[split]["band_refit"] = band_refit.shift_json(shift_H2)
    record = forecast.forecast_record(prep, fcs["test"], spec, calibration)
    if forecasts_dir is not None:
        forecast.save_forecasts(forecasts_dir, record)
    return Scored(entry, record, calibration, scored_params, window_mae)


def _decide_columns(module, params_list, preps, spec: EvalSpec) -> tuple[list, list]:
    """(each series' entry, the params scored): with spec.column_fallback, masked as
    decided on val, the entry's `baseline_columns` from that decision; without, from the
    params' saved mask."""
    entries = [{} for _ in preps]
    if spec.column_fallback:
        decided = column_fallback.apply_all(module, params_list, preps, spec)
        params_list = [params for params, _ in decided]
        for entry, (_, names) in zip(entries, decided, strict=True):
            entry["baseline_columns"] = names
    else:
        for entry, params in zip(entries, params_list, strict=True):
            if (keep_C := heads.keep_columns(params)) is not None:
                entry["baseline_columns"] = column_fallback.baseline_columns(keep_C)
    return entries, params_list


# A val loss this many times the zero forecast's marks a model worse than no training.
WORSE_THAN_UNTRAINED = 10.0


def flag_worse_than_untrained(module, spec: EvalSpec, prep, entry: dict, last_params) -> None:
    """Adds a `warning` to a scored entry whose training went far above the zero forecast.

    Without a baseline that is the kept model's val loss. With one (model.baseline) an
    epoch is kept only if it beats the untrained model, so a run that went wrong keeps
    the baseline (best_epoch None); the warning then looks at `last_params`, the last
    epoch's params (None without model.baseline).
    """
    val = entry.get("val") or {}
    loss, zero = val.get("normalized_mse"), val.get("zero_forecast_mse")
    if loss is None or not zero:
        return
    kept = "the kept model"
    if last_params is not None and entry["best_epoch"] is None:
        fc = forecast.split_forecast(module, last_params, prep, "val", spec)
        loss = metrics.normalized_mse(prep, fc.ends_N, fc.norm_NHC, spec.horizon)
        start = "starting model" if entry.get("started_from") else "untrained baseline"
        kept = f"the last epoch (the {start} is kept)"
    if loss <= WORSE_THAN_UNTRAINED * zero:
        return
    entry["warning"] = (
        f"val loss {loss:.3g} of {kept} is {loss / zero:.3g}x the zero forecast's {zero:.3g}: "
        "the model learned something worse than not training (check train.learning_rate)"
    )
    logging.warning("%s: %s", prep.name, entry["warning"])


def reload_forecasts(
    spec: EvalSpec, workdir: str, module, preps: list, *, plots: bool, save: bool
) -> dict:
    """Test forecast records of the kept models of a group finished by an earlier process:
    for the plots (`plots`), and saved to forecasts/ (`save`: eval.save_forecasts) where
    the files are missing (process 0; {} when neither asks for them)."""
    if not ((plots or save) and sharding.is_primary()):
        return {}
    records = {}
    for prep in (p for p in preps if not split_dates.is_train_only(p)):
        try:
            params, meta = checkpoint.load_series_model(
                workdir_lib.series_model(workdir, prep.name)
            )
        except (OSError, ValueError) as e:  # its results stand; only its forecasts are lost
            logging.warning(
                "%s: no test forecasts: its saved model is unreadable (%s)", prep.name, e
            )
            continue
        fc = forecast.split_forecast(module, params, prep, "test", spec)
        calibration = meta.get("interval_calibration")
        records[prep.name] = forecast.forecast_record(prep, fc, spec, calibration)
        if save:
            forecast.save_forecasts(workdir, records[prep.name])
    return records
