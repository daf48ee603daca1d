"""--mode evaluate and --mode predict: the saved best models on any data, without training.

Both modes load <workdir>/models/<SYMBOL>-<INTERVAL>/ (checkpoint.save_series_model)
and the data of the given config. What defines a model's windows (features,
lookback, horizon, normalization) and the model itself always come from the
model's own saved config; the data location and extent (source, mirror, months,
end, candles) come from the given config, so a model can be scored on other
months or another mirror. Windows are normalised with the statistics the model was
trained with (its meta.json `norm`), so new data is scaled exactly as training data
was; only a model saved without them (by an earlier cpbjax) re-fits them on the
loaded data, with a warning.
"""

from __future__ import annotations

import csv
import datetime
import io
import os
import sys
import time
from typing import Any, NamedTuple

import flax
import jax
import ml_collections
import numpy as np
from absl import logging

import cpbjax
from cpbjax import checkpoint, evaluate, models, report, writers
from cpbjax import platform as platform_lib
from cpbjax.config import INTERVAL_MS
from cpbjax.data import features as features_lib
from cpbjax.data import sources, windows
from cpbjax.data.series import SeriesSkipped

MODELS_DIR = "models"
FORECAST_JSON = "forecast.json"
FORECAST_CSV = "forecast.csv"
# data fields that define a model's windows: always taken from the model's saved config.
MODEL_DATA_FIELDS = ("features", "lookback", "horizon", "normalization")


class ModelNotFound(ValueError):
    """A requested series or interval has no saved model; the message lists those that do."""


class NothingToForecast(RuntimeError):
    """Every requested series was skipped; the message lists each reason."""


def available_models(workdir: str) -> dict[str, str]:
    """Series name -> folder of every saved best model under <workdir>/models/.

    Raises:
      ModelNotFound: if there is no saved model at all.
    """
    folder = os.path.join(workdir, MODELS_DIR)
    found = {}
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if os.path.exists(os.path.join(folder, name, checkpoint.META_FILE)):
                found[name] = os.path.join(folder, name)
    if not found:
        raise ModelNotFound(f"no saved model under {folder}: train with --workdir {workdir} first")
    return found


def _parse(name: str) -> tuple[str, str]:
    symbol, _, interval = name.rpartition("-")
    return symbol, interval


def select_series(available, symbols, intervals, excused=None) -> tuple[list[str], dict]:
    """The series of symbols x intervals to use, each of which must have a model.

    Args:
      available: series names with a saved model.
      symbols, intervals: requested; an empty one means every one with a model.
      excused: series name -> reason for series known to have no model (skipped in
        training); they are returned as skipped instead of raising.

    Returns:
      (names in request order, skipped: name -> reason).

    Raises:
      ModelNotFound: naming each series, symbol or interval without a model and
        listing the series that have one.
    """
    excused = excused or {}
    pairs = {n: _parse(n) for n in available}
    if symbols and intervals:
        wanted = [f"{s}-{i}" for s in symbols for i in intervals]
        missing = [n for n in wanted if n not in pairs and n not in excused]
    else:
        wanted = [
            n
            for n, (s, i) in pairs.items()
            if (not symbols or s in symbols) and (not intervals or i in intervals)
        ]
        missing = [f"symbol {s}" for s in symbols if all(p[0] != s for p in pairs.values())]
        missing += [f"interval {i}" for i in intervals if all(p[1] != i for p in pairs.values())]
    if missing or not wanted:
        raise ModelNotFound(
            f"no saved model for {', '.join(missing) or 'the request'}; "
            f"series with a model: {', '.join(sorted(available))}"
        )
    skipped = {n: f"no model (skipped in training: {excused[n]})" for n in wanted if n not in pairs}
    return [n for n in wanted if n in pairs], skipped


def _as_config(d: dict) -> ml_collections.ConfigDict:
    """A ConfigDict from a JSON config, with lists back as the tuples the schema uses."""

    def fix(v):
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return tuple(v) if isinstance(v, list) else v

    return ml_collections.ConfigDict(fix(d))


class LoadedModel(NamedTuple):
    """One saved best model, as `load_model` returns it."""

    module: Any  # the Flax Linen module
    params: Any  # its params pytree
    trained: ml_collections.ConfigDict  # the config it was trained with
    norm: dict | None  # meta.json's `norm` if it holds the fitted statistics, else None


def load_model(path: str) -> LoadedModel:
    """Loads one saved best model (see LoadedModel)."""
    params, meta = checkpoint.load_series_model(path)
    if "config" not in meta:
        raise ValueError(f"{path}/{checkpoint.META_FILE} has no 'config': cannot rebuild the model")
    trained = _as_config(meta["config"])
    norm = meta.get("norm") if "feature_mean" in meta.get("norm", {}) else None
    return LoadedModel(models.build(models.make_config(trained)), params, trained, norm)


def run_config(config, trained, names) -> ml_collections.ConfigDict:
    """The given config with the model's window fields and model group, restricted to names."""
    c = ml_collections.ConfigDict(config.to_dict())
    for field in MODEL_DATA_FIELDS:
        if c.data[field] != trained.data[field]:
            logging.warning(
                "using the model's data.%s=%r, not the given %r",
                field,
                trained.data[field],
                c.data[field],
            )
            c.data[field] = trained.data[field]
    c.model = ml_collections.ConfigDict(trained.model.to_dict())
    c.data.symbols = tuple(dict.fromkeys(_parse(n)[0] for n in names))
    c.data.intervals = tuple(dict.fromkeys(_parse(n)[1] for n in names))
    return c


def _load_models(available, names):
    """Loads the models of `names`; all must share the window fields (one run)."""
    loaded = {n: load_model(available[n]) for n in names}
    first = loaded[names[0]].trained
    for name, model in loaded.items():
        for field in MODEL_DATA_FIELDS:
            if model.trained.data[field] != first.data[field]:
                raise ValueError(
                    f"model {name} has data.{field}={model.trained.data[field]!r} but "
                    f"{names[0]} has {first.data[field]!r}: evaluate them separately"
                )
    return loaded, first


def prepare(config, loaded: dict) -> tuple[dict, dict]:
    """Loads and prepares the series of `loaded` (name -> LoadedModel) with each model's
    training normalisation; returns (name -> PreparedSeries, skipped)."""
    names = list(loaded)
    norms = {n: m.norm for n, m in loaded.items() if m.norm is not None}
    z_scored = [f for f in config.data.features if f not in features_lib.PRICE_FEATURES]
    if (config.data.normalization == "zscore" or z_scored) and len(norms) < len(names):
        logging.warning(
            "models %s were saved without their normalisation statistics: those are "
            "re-fitted on the train split of the data loaded now",
            sorted(set(names) - set(norms)),
        )
    series, skipped = sources.load_all(config.data)
    preps, unusable = windows.prepare_all(
        [s for s in series if s.name in names], config.data, norms
    )
    skipped.update(unusable)
    return {p.name: p for p in preps}, {n: r for n, r in skipped.items() if n in names}


def run_facts(mode: str, config, workdir: str, started: float) -> dict:
    """Versions, devices, data location and wall time of an evaluate/predict run."""
    d = config.data
    return {
        "mode": mode,
        "workdir": os.path.abspath(workdir),
        "created": evaluate.iso_utc(time.time() * 1000),
        "data": {
            "source": d.source,
            "base_url": d.base_url,
            "local_dir": d.local_dir,
            "months": d.months,
            "end": d.end,
            "max_candles": d.max_candles,
        },
        "versions": {
            "cpbjax": cpbjax.__version__,
            "python": sys.version.split()[0],
            "jax": jax.__version__,
            "flax": flax.__version__,
            "numpy": np.__version__,
        },
        "devices": platform_lib.describe_devices(),
        "wall_seconds": round(time.monotonic() - started, 3),
    }


# ---------------------------------------------------------------------------
# --mode evaluate


def _read_results(workdir: str) -> dict:
    path = os.path.join(workdir, writers.RESULTS_FILE)
    return writers.read_json(path) if os.path.exists(path) else {}


def _evaluate_one(module, params, prep, config, out_dir):
    """val and test metrics of one series; returns (entry, test forecast record or None)."""
    lookback, horizon = config.data.lookback, config.data.horizon
    entry, record = {}, None
    for split in ("val", "test"):
        fc = evaluate.forecast(module, params, prep, split, lookback, horizon)
        entry[split] = evaluate.evaluate_series(module, params, prep, config, split, forecasts=fc)
    if fc[1] is not None:  # fc is the test split's: the one that is plotted and saved
        record = evaluate.forecast_record(prep, fc[0], fc[1], horizon)
        if config.eval.save_forecasts:
            evaluate.save_forecasts(out_dir, prep, fc[0], fc[1], horizon)
    entry["data"] = prep.notes  # the evaluated data, as results.json records it
    return entry, record


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
      ModelNotFound: a requested series has no model (the message lists those that do).
    """
    started = time.monotonic()
    stem = "eval-" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    available = available_models(workdir)
    trained_results = _read_results(workdir)
    names, skipped = select_series(
        available,
        config.data.symbols,
        config.data.intervals,
        excused=trained_results.get("skipped", {}),
    )
    loaded, trained = _load_models(available, names)
    cfg = run_config(config, trained, names)
    preps, data_skipped = prepare(cfg, loaded)
    skipped.update(data_skipped)
    series, records = {}, {}
    for name, prep in preps.items():
        module, params = loaded[name].module, loaded[name].params
        facts = trained_results.get("series", {}).get(name, {})
        entry, record = _evaluate_one(module, params, prep, cfg, os.path.join(workdir, stem))
        series[name] = {**{k: v for k, v in facts.items() if k not in ("val", "test")}, **entry}
        if record is not None:
            records[name] = record
    results = {
        "run": run_facts("evaluate", cfg, workdir, started),
        "series": series,
        "skipped": skipped,
    }
    writers.write_json(os.path.join(workdir, f"{stem}.json"), results)
    report.write_reports(workdir, results, cfg, forecasts=records, stem=stem)
    return results


# ---------------------------------------------------------------------------
# --mode predict


def forecast_next(module, params, prep, lookback: int, horizon: int) -> dict:
    """The next H candles after the newest one of `prep`, in prices.

    Raises:
      SeriesSkipped: the newest L candles span a gap, or the normalisation keeps
        no price level (candle_minmax).
    """
    step = INTERVAL_MS[prep.interval]
    t = len(prep.ohlc) - 1
    if np.any(np.diff(prep.open_time_ms[t - lookback + 1 :]) != step):
        raise SeriesSkipped(f"the newest {lookback} candles span a gap; no window to forecast from")
    if prep.norm["kind"] == "candle_minmax":
        raise SeriesSkipped("data.normalization='candle_minmax' keeps no price level")
    ends = np.array([t])
    pred_HC = windows.to_prices(
        prep, ends, evaluate.predict_windows(module, params, prep, ends, lookback, horizon)
    )[0]
    times = prep.open_time_ms[t] + step * np.arange(1, horizon + 1, dtype=np.int64)
    candles = [
        {
            "step": h + 1,
            "open_time": evaluate.iso_utc(ms),
            "open_time_ms": int(ms),
            **dict(zip(evaluate.COLUMNS, map(float, pred_HC[h]), strict=True)),
        }
        for h, ms in enumerate(times)
    ]
    return {
        "symbol": prep.symbol,
        "interval": prep.interval,
        "last_open_time": evaluate.iso_utc(prep.open_time_ms[t]),
        "last_open_time_ms": int(prep.open_time_ms[t]),
        "last_candle": dict(zip(evaluate.COLUMNS, map(float, prep.ohlc[t]), strict=True)),
        "forecast": candles,
    }


def forecast_csv(series: dict) -> str:
    """forecast.json's series as CSV text, one row per (series, step)."""
    buf = io.StringIO()
    fields = (
        "series",
        "symbol",
        "interval",
        "step",
        "open_time",
        "open_time_ms",
        *evaluate.COLUMNS,
    )
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for name, s in series.items():
        for candle in s["forecast"]:
            writer.writerow(
                {
                    "series": name,
                    "symbol": s["symbol"],
                    "interval": s["interval"],
                    **{k: repr(v) if isinstance(v, float) else v for k, v in candle.items()},
                }
            )
    return buf.getvalue()


def run_predict(config, workdir: str) -> dict:
    """Forecasts the next H candles of config.predict.symbols x intervals from the newest data.

    Writes <workdir>/forecast.json ({"run", "model", "horizon", "series": {name:
    {"symbol", "interval", "last_open_time", "last_open_time_ms", "last_candle",
    "forecast": [{"step", "open_time", "open_time_ms", "open", "high", "low",
    "close"}, ...]}}, "skipped"}) and <workdir>/forecast.csv.

    Returns:
      The forecast.json dict.

    Raises:
      ModelNotFound: a requested series or interval has no model.
      RuntimeError: no requested series could be forecast (the reasons are listed).
    """
    started = time.monotonic()
    available = available_models(workdir)
    names, _ = select_series(available, config.predict.symbols, config.predict.intervals)
    loaded, trained = _load_models(available, names)
    cfg = run_config(config, trained, names)
    preps, skipped = prepare(cfg, loaded)
    series = {}
    for name, prep in preps.items():
        module, params = loaded[name].module, loaded[name].params
        try:
            series[name] = forecast_next(module, params, prep, cfg.data.lookback, cfg.data.horizon)
        except SeriesSkipped as e:
            skipped[name] = str(e)
    if not series:
        raise NothingToForecast(f"no series could be forecast: {skipped}")
    doc = {
        "run": run_facts("predict", cfg, workdir, started),
        "model": cfg.model.name,
        "horizon": cfg.data.horizon,
        "series": series,
        "skipped": skipped,
    }
    writers.write_json(os.path.join(workdir, FORECAST_JSON), doc)
    writers.atomic_write(os.path.join(workdir, FORECAST_CSV), forecast_csv(series))
    for name, reason in skipped.items():
        logging.warning("%s: not forecast: %s", name, reason)
    return doc
