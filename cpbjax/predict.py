"""--mode predict: the next H candles of every saved model, from the newest data.

The models and their data are loaded as cpbjax/saved.py says (each model's own window
fields and training normalisation; the given config's data location).
"""

from __future__ import annotations

import time

from absl import logging

from cpbjax import forecast, saved
from cpbjax.data.series import SeriesSkipped
from cpbjax.evaluate import run_facts


class NothingToForecast(RuntimeError):
    """Every requested series was skipped; the message lists each reason."""


def _forecast_all(loaded, preps, cfg, skipped: dict) -> dict:
    """forecast.json's series of every prepared series; the others go to `skipped`."""
    series = {}
    for name, prep in preps.items():
        model = loaded[name]
        try:
            series[name] = forecast.next_candles(
                model.module, model.params, prep, cfg.data.lookback, cfg.data.horizon
            )
        except SeriesSkipped as e:
            skipped[name] = str(e)
    return series


def run_predict(config, workdir: str) -> dict:
    """Forecasts the next H candles of config.predict.symbols x intervals from the newest data.

    Writes <workdir>/forecast.json ({"run", "model", "horizon", "series": {name:
    {"symbol", "interval", "last_open_time", "last_open_time_ms", "last_candle",
    "forecast": [{"step", "open_time", "open_time_ms", "open", "high", "low",
    "close"}, ...]}}, "skipped"}) and <workdir>/forecast.csv.

    Returns:
      The forecast.json dict.

    Raises:
      saved.ModelNotFound: a requested series or interval has no model.
      NothingToForecast: no requested series could be forecast (the reasons are listed).
    """
    started = time.monotonic()
    available = saved.available_models(workdir)
    names, _ = saved.select_series(available, config.predict.symbols, config.predict.intervals)
    loaded, trained, unreadable = saved.load_models(available, names)
    cfg = saved.run_config(config, trained, list(loaded))
    preps, skipped = saved.prepare(cfg, loaded)
    skipped.update(unreadable)
    series = _forecast_all(loaded, preps, cfg, skipped)
    if not series:
        raise NothingToForecast(f"no series could be forecast: {skipped}")
    doc = {
        "run": run_facts("predict", cfg, workdir, started),
        "model": cfg.model.name,
        "horizon": cfg.data.horizon,
        "series": series,
        "skipped": skipped,
    }
    forecast.write_forecast_files(workdir, doc)
    for name, reason in skipped.items():
        logging.warning("%s: not forecast: %s", name, reason)
    return doc
