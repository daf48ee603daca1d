"""--mode predict: the next H candles of every saved model, from the newest data.

The models and their data are loaded as cpbjax/score/saved.py says (each model's own window
fields and training normalisation; the given config's data location).
"""

from __future__ import annotations

import os
import re
import time

from absl import logging

from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.data import klines_api
from cpbjax.data.series import INTERVAL_MS, SeriesSkipped
from cpbjax.modes import trained_run
from cpbjax.modes.facts import run_facts, scored_workdir
from cpbjax.score import forecast, zero_shot


class NothingToForecast(RuntimeError):
    """Every requested series was skipped; the message sums the reasons up in one line
    (`nothing_forecast`), each series' own reason is warned."""


def _forecast_all(loaded, preps, cfg, scored: dict, skipped: dict) -> dict:
    """forecast.json's series of every prepared series, its prices rounded and with its
    test skill (`scored`: results.json's series); the others, and a forecast of NaN or inf
    prices (forecast.NonFiniteForecast), go to `skipped`. A series a
    pooled run never trained on first gets its own fits (zero_shot.fit_series) and its
    entry's `zero_shot`: {"fitted_on_windows": N}."""
    series = {}
    for name, prep in preps.items():
        model, fits = loaded[name], None
        try:
            if model.zero_shot:
                model, fitted_on = zero_shot.fit_series(model, prep)
                fits = {"fitted_on_windows": fitted_on}
            entry = forecast.next_candles(
                model.module,
                model.params,
                prep,
                cfg.data.lookback,
                cfg.data.horizon,
                model.calibration,
            )
        except (SeriesSkipped, forecast.NonFiniteForecast) as e:
            skipped[name] = str(e)
            continue
        series[name] = described(entry, scored.get(name), model.trained.model.baseline)
        if fits is not None:
            series[name]["zero_shot"] = fits
    return series


def described(entry: dict, scored: dict | None, baseline: str) -> dict:
    """forecast.json's entry of a next_candles entry (predict's and serve's): its prices
    rounded, with the test skill of `scored` (the series' results.json entry)."""
    return {**forecast.rounded_prices(entry), **forecast.skill_on_test(scored, baseline)}


def scored_series(workdir: str) -> dict:
    """results.json's series of the run that trained the models; {} without a readable
    one (warned: the forecasts do not need it, only their test skill does)."""
    path = workdir_lib.results_json(workdir)
    if not os.path.exists(path):
        return {}
    try:
        return writers.read_json(path)["series"]
    except (ValueError, KeyError, TypeError) as e:
        logging.warning("%s: no test skill in the forecasts: %s", path, e)
        return {}


# Why a forecast's newest candle can be old, and what would make it newer, per data.source
# (after trained_run.forecast_config: binance with predict.fresh reads binance_rest).
_STALE_HINTS = {
    "synthetic": "the data is generated (data.source='synthetic') and ends there; there is "
    "nothing fresher to load",
    "local": "data.local_dir's files end there; append the newer candles to them",
    "binance": "the history is the monthly files of data.base_url alone; "
    "--config.predict.fresh=True tops it up to now from data.api_url",
    "binance_rest": "the exchange (data.api_url) gave no newer closed candles; the top-up's "
    "warning above says where they stop",
}


def stale_hint(source: str) -> str:
    """Why a forecast from data.source `source` can start from an old candle, and the remedy."""
    return _STALE_HINTS.get(source, f"data.source={source!r} holds no newer candles")


def freshness(entry: dict, now_ms: int, source: str, warn: bool = True) -> int:
    """Sets entry["age_intervals"] (a next_candles entry) and returns it, warning when stale
    (unless not `warn`: predict warns once for all its series, `warn_stale`).

    1 means the forecast starts from the newest closed candle; more means newer closed
    candles exist that the data did not hold, so early forecast steps are already past.
    The warning's hint fits `source`, the data.source the candles came from.
    """
    step = INTERVAL_MS[entry["interval"]]
    age = klines_api.newest_closed_age([entry["last_open_time_ms"]], step, now_ms)
    entry["age_intervals"] = age
    if age > 1 and warn:
        logging.warning(
            "%s-%s: STALE: the newest candle (%s) is %d intervals old, so %d forecast steps "
            "are already past: %s",
            entry["symbol"],
            entry["interval"],
            entry["last_open_time"],
            age,
            min(age - 1, len(entry["forecast"])),
            stale_hint(source),
        )
    return age


def warn_stale(series: dict, source: str, now_ms: int) -> None:
    """Sets every entry's age (`freshness`) and warns of the stale ones in one line: their
    count, the first few names and how old; one warning per series buried the log."""
    ages = {name: freshness(e, now_ms, source, warn=False) for name, e in series.items()}
    stale = [name for name, age in ages.items() if age > 1]
    if len(stale) <= 1:
        for name in stale:
            freshness(series[name], now_ms, source)  # the one series' own line
        return
    low, high = min(ages[n] for n in stale), max(ages[n] for n in stale)
    oldest = min((series[n] for n in stale), key=lambda e: e["last_open_time_ms"])
    logging.warning(
        "STALE: %d of %d series (%s%s): the newest candle is %s intervals old (the oldest "
        "%s), so their first forecast steps are already past: %s",
        len(stale),
        len(series),
        ", ".join(stale[:3]),
        f" and {len(stale) - 3} more" if len(stale) > 3 else "",
        str(low) if low == high else f"{low} to {high}",
        oldest["last_open_time"],
        stale_hint(source),
    )


def _summary(name: str, s: dict) -> str:
    """One printed line: the newest closed candle and the forecast span."""
    first, last = s["forecast"][0]["open_time"], s["forecast"][-1]["open_time"]
    age = "up to date" if s["age_intervals"] <= 1 else f"{s['age_intervals']} intervals old"
    return f"{name}: newest closed candle {s['last_open_time']} ({age}); forecast {first} .. {last}"


# How klines_api.top_up words a series it skipped: every reason starts with FRESH, and the
# series after the API was found down get FRESH + "not requested: <api_url> <why> for <name>".
FRESH = "fresh candles: "
_DOWN = re.compile(r"not requested: (\S+ .+) for \S+$")


def _clipped(name: str, reason: str, api_url: str | None, keep: int = 75) -> str:
    """`name: reason` (`reason` alone where it names the series), with `api_url` called
    data.api_url and without URL queries (a kline request's are long), and if still long,
    its first and last `keep` characters: what failed comes first, the count or wait last."""
    reason = re.sub(r"(https?://[^\s?]+)\?[^\s:]*", r"\1", reason)
    reason = reason.replace(api_url.rstrip("/"), "data.api_url") if api_url else reason
    reason = reason if reason.startswith(name) else f"{name}: {reason}"
    return reason if len(reason) <= 2 * keep + 5 else f"{reason[:keep]} ... {reason[-keep:]}"


def nothing_forecast(skipped: dict, data_cfg) -> str:
    """NothingToForecast's one short line (each series' reason is warned): the
    fresh candles' failure and the way around it, or the first series' reason and a count."""
    name, first = next(iter(skipped.items()))
    reasons, api_url = list(skipped.values()), data_cfg.get("api_url")
    if data_cfg.source == "binance_rest" and all(r.startswith(FRESH) for r in reasons):
        down = [m.group(1) for m in map(_DOWN.search, reasons) if m]
        why = f"data.api_url {down[0]}" if down else _clipped(name, first[len(FRESH) :], api_url)
        return (
            f"no series could be forecast: no fresh candles for {len(reasons)} series ({why}); "
            "--config.predict.fresh=False forecasts from the files alone"
        )
    more = f" (and {len(reasons) - 1} more series)" if len(reasons) > 1 else ""
    return f"no series could be forecast: {_clipped(name, first, api_url)}{more}"


def run_predict(config, workdir: str) -> dict:
    """Forecasts the next H candles of the requested series (trained_run.requested_series:
    predict.symbols x intervals, or a changed data.symbols / data.intervals) from the
    newest data. A pooled run also forecasts series it never trained on (zero_shot.py).

    Writes <workdir>/forecast.json: {"run", "model", "horizon", "skipped", "series": {name:
    {"symbol", "interval", "last_open_time(_ms)", "last_candle", "forecast": [{"step",
    "open_time(_ms)", "open", "high", "low", "close"}, ...], "age_intervals", "test_skill",
    "kept_baseline", "zero_shot" (an unseen series)}}} (prices at forecast.PRICE_DIGITS
    digits); forecast.csv; and every forecast under predictions/. Prints the newest closed
    candle and the forecast span of each series.

    Returns:
      The forecast.json dict.

    Raises:
      saved.ModelNotFound: a requested series or interval has no model (per-series run).
      NothingToForecast: no requested series could be forecast (the reasons are listed).
    """
    started = time.time()
    loaded, cfg, unreadable = trained_run.load_for_forecast(config, workdir, zero_shot.FIT_DAYS)
    preps, skipped = trained_run.prepare(cfg, loaded, latest=True)
    skipped.update(unreadable)
    series = _forecast_all(loaded, preps, cfg, scored_series(workdir), skipped)
    if not series:
        for name, reason in skipped.items():
            if not reason.startswith(FRESH):  # the top-up's failures were warned as it ran
                logging.warning("%s: not forecast: %s", name, reason)
        raise NothingToForecast(nothing_forecast(skipped, cfg.data))
    doc = {
        "run": run_facts("predict", cfg, started, **scored_workdir(cfg, workdir)),
        "model": cfg.model.name,
        "horizon": cfg.data.horizon,
        "series": series,
        "skipped": skipped,
    }
    warn_stale(series, cfg.data.source, klines_api.clock_ms())
    _publish(workdir, doc)
    return doc


def _publish(workdir: str, doc: dict) -> None:
    """Writes the forecast files, names each skipped series and prints each forecast."""
    paths = forecast.write_forecast_files(workdir, doc)
    for name, reason in doc["skipped"].items():
        logging.warning("%s: not forecast: %s", name, reason)
    lines = [_summary(name, entry) for name, entry in doc["series"].items()]
    print("\n".join([*lines, f"wrote {', '.join(paths)}"]))
