"""The data-source registry (binance, local, synthetic) and `load_all`.

A source is one function `(data_cfg, pairs) -> (name -> Series, name -> reason)`
registered with `@register("name")`, here or from user code; `data.source` picks it,
and `cpbjax.config.schema.validate` allows every name registered when it runs. Every source passes
its candles through `parsing.build_series`, so validation is the same for all.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable

import numpy as np
from absl import logging

from cpbjax import config_rules as rules
from cpbjax.data import binance, klines_api, local_files, market, parsing, skip_groups, synthetic
from cpbjax.data.series import Series, SeriesSkipped

Pairs = list[tuple[str, str]]
Loader = Callable[..., tuple[dict[str, Series], dict[str, str]]]
SOURCES: dict[str, Loader] = {}
# The `synthetic` source's data seed: fixed, so every run sees the same series.
SYNTHETIC_SEED = synthetic.DEFAULT_SEED


def register(name: str) -> Callable[[Loader], Loader]:
    """Decorator that registers a loader `(data_cfg, pairs) -> (loaded, skipped)`."""

    def wrap(loader: Loader) -> Loader:
        if name in SOURCES:
            raise ValueError(f"data source {name!r} is registered twice")
        SOURCES[name] = loader
        return loader

    return wrap


def _each(pairs: Pairs, load_one) -> tuple[dict[str, Series], dict[str, str]]:
    """Calls load_one(symbol, interval) per pair; a skip or bad file never stops the rest."""
    loaded, skipped = {}, {}
    for symbol, interval in pairs:
        name = f"{symbol}-{interval}"
        try:
            loaded[name] = load_one(symbol, interval)
        except (SeriesSkipped, parsing.KlineError) as e:
            skipped[name] = str(e)
    return loaded, skipped


@register("binance")
def load_binance(data_cfg, pairs: Pairs):
    """Binance Vision over HTTP(S), or a directory / file:// mirror of it."""
    return binance.load(data_cfg, pairs)


@register("binance_rest")
def load_binance_rest(data_cfg, pairs: Pairs):
    """The binance source topped up to now with closed candles from data.api_url's REST API."""
    loaded, skipped = binance.load(data_cfg, pairs)
    return klines_api.top_up(loaded, skipped, data_cfg)


@register("local")
def load_local(data_cfg, pairs: Pairs):
    """One <SYMBOL>-<INTERVAL>.csv or .parquet per series in data.local_dir.

    File names and column names are matched case-insensitively; see
    `local_files.read_local_file` for the columns and time formats. The whole file
    is used: data.months and data.end apply to the binance source only. The
    data.covariates columns are read too; one a file lacks is a CovariateError (exit 2).
    """
    folder = os.path.expanduser(data_cfg.local_dir)
    files = {name.lower(): name for name in os.listdir(folder)}

    def load_one(symbol: str, interval: str) -> Series:
        stem = f"{symbol}-{interval}".lower()
        found = [files[stem + ext] for ext in (".parquet", ".csv") if stem + ext in files]
        if not found:
            raise SeriesSkipped(f"no {symbol}-{interval}.csv or .parquet in {folder}")
        path = os.path.join(folder, found[0])
        parts = [local_files.read_local_file(path, data_cfg.covariates, f"{symbol}-{interval}")]
        notes = {"source": "local", "file": path}
        return parsing.build_series(symbol, interval, parts, data_cfg, notes)

    return _each(pairs, load_one)


@register("synthetic")
def load_synthetic(data_cfg, pairs: Pairs):
    """data.synthetic_candles GARCH candles per series, ending at synthetic.END_MS; with
    data.synthetic_covariates, candles with synthetic.COVARIATES, of which the
    data.covariates columns are kept."""

    def load_one(symbol: str, interval: str) -> Series:
        s = synthetic.generate(
            symbol,
            interval,
            data_cfg.synthetic_candles,
            SYNTHETIC_SEED,
            covariates=data_cfg.synthetic_covariates,
        )
        values = np.concatenate([s.ohlcv, synthetic.covariate_columns(s, data_cfg.covariates)], 1)
        parts = [(s.open_time_ms, values)]
        return parsing.build_series(symbol, interval, parts, data_cfg, s.notes)

    return _each(pairs, load_one)


def _period_index(period: str) -> int:
    if len(period) == 7:
        return int(period[:4]) * 12 + int(period[5:7])
    return datetime.date.fromisoformat(period).toordinal()


def format_failed(failed: dict[str, str]) -> str:
    """failed_months as text, consecutive periods with one reason merged: "2023-01..2023-05 ..."."""
    runs = []  # [first, last, reason]
    for period, reason in sorted(failed.items()):
        last = runs[-1] if runs else None
        if (
            last
            and last[2] == reason
            and len(last[1]) == len(period)
            and _period_index(last[1]) + 1 == _period_index(period)
        ):
            last[1] = period
        else:
            runs.append([period, period, reason])
    return "; ".join(f"{a}..{b} {r}" if a != b else f"{a} {r}" for a, b, r in runs)


def summary_lines(series: list[Series], skipped: dict[str, str]) -> list[str]:
    """One line per series that was skipped or only partly loaded, saying why."""
    lines = [f"{name}: skipped: {reason}" for name, reason in skipped.items()]
    for s in series:
        failed = s.notes.get("failed_months", {})
        parts = [format_failed(failed)] if failed else []
        if s.notes.get("dropped_rows"):
            parts.append(f"{s.notes['dropped_rows']} invalid candles dropped")
        if parts:
            lines.append(f"{s.name}: partly loaded: " + "; ".join(parts))
    return lines


def grouped_lines(series: list[Series], skipped: dict[str, str]) -> list[str]:
    """`summary_lines` summed up, one line per reason (skip_groups): a run over hundreds
    of series warns in a few lines; a series partly loaded for two reasons is in both."""
    partly = [
        (s.name, f"some months {reason}")
        for s in series
        for reason in sorted(set(s.notes.get("failed_months", {}).values()))
    ]
    partly += [(s.name, "invalid candles dropped") for s in series if s.notes.get("dropped_rows")]
    return skip_groups.lines("skipped", skipped.items()) + skip_groups.lines(
        "partly loaded", partly
    )


def load_all(data_cfg) -> tuple[list[Series], dict[str, str]]:
    """Loads every (symbol, interval) of data.symbols x data.intervals from data.source,
    with data.market_series' covariate columns (cpbjax/data/market.py).

    Args:
      data_cfg: the `data` config group (validated).
    Returns:
      (the loaded series in config order, series name -> skip reason).
    Raises:
      ConfigError: data.source is not registered, or the source's location is unusable;
        a market series that cannot be loaded (CovariateError).
    """
    rules.one_of("data.source", data_cfg.source, SOURCES)
    pairs = [(s, i) for s in data_cfg.symbols for i in data_cfg.intervals]
    loaded, skipped = SOURCES[data_cfg.source](data_cfg, pairs)
    names = [f"{s}-{i}" for s, i in pairs]
    series = [loaded[n] for n in names if n in loaded]
    skipped = {n: skipped.get(n, "the source returned nothing") for n in names if n not in loaded}
    for line in grouped_lines(series, skipped):
        logging.warning("%s", line)
    for line in summary_lines(series, skipped):  # each series' reason: --verbosity=1
        logging.debug("%s", line)
    logging.info("Loaded %d of %d series from %s.", len(series), len(names), data_cfg.source)
    load = SOURCES[data_cfg.source]
    return market.with_market_columns(series, skipped, data_cfg, load), skipped
