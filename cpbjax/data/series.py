"""The `Series` record every data source returns, the skip exception, the interval lengths
and the calendar dates of data.split_dates."""

from __future__ import annotations

import calendar
import dataclasses
import datetime
import re

import numpy as np

from cpbjax.config_rules import ConfigError

# Interval name -> length in milliseconds (the Binance Vision names); config.data.intervals
# and config.predict.intervals must be keys of it.
INTERVAL_MS = {
    "1m": 60_000,
    "3m": 180_000,
    "5m": 300_000,
    "15m": 900_000,
    "30m": 1_800_000,
    "1h": 3_600_000,
    "2h": 7_200_000,
    "4h": 14_400_000,
    "6h": 21_600_000,
    "8h": 28_800_000,
    "12h": 43_200_000,
    "1d": 86_400_000,
}


class SeriesSkipped(Exception):
    """A whole series cannot be used; the message is the reason recorded in results."""


class CovariateError(ConfigError):
    """A data.covariates column a series cannot give (absent, not numeric, constant on
    train: one line naming the series and the column), or a covariate model forecast from
    a source without covariates (binance); exit 2 (a ConfigError, so cpbjax.fit raises it
    as ValueError)."""


@dataclasses.dataclass
class Series:
    """One symbol at one interval, validated, sorted and on the interval grid.

    Attributes:
      symbol: e.g. "BTCUSDT".
      interval: e.g. "1h".
      open_time_ms: int64 [T], UTC open times in milliseconds, strictly increasing,
        every one on the interval grid (gaps allowed, never filled).
      ohlcv: float64 [T, 5], open/high/low/close/volume; prices finite and > 0,
        low <= min(open, close) <= max(open, close) <= high.
      notes: facts for the data table and results.json: "candles", "gaps",
        "longest_gap", "dropped_rows", "months", "failed_months" (month -> reason),
        "first", "last" (ISO times).
      covariates: float64 [T, K], the data.covariates columns row for row with
        open_time_ms (NaN where missing); [T, 0] without covariates.
      covariate_names: the K column names, in data.covariates order.
    """

    symbol: str
    interval: str
    open_time_ms: np.ndarray
    ohlcv: np.ndarray
    notes: dict = dataclasses.field(default_factory=dict)
    covariates: np.ndarray | None = None
    covariate_names: tuple = ()

    def __post_init__(self):
        if self.covariates is None:
            self.covariates = np.zeros((len(self.open_time_ms), 0))

    @property
    def name(self) -> str:
        return f"{self.symbol}-{self.interval}"


def split_date_ms(text) -> int:
    """A data.split_dates entry, "YYYY-MM" (its first day) or "YYYY-MM-DD", as the epoch
    milliseconds of 00:00 UTC that day.

    Raises:
      ValueError: anything else (a wrong form or no such date).
    """
    if not isinstance(text, str) or not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", text):
        raise ValueError(f"{text!r} is not a date as YYYY-MM or YYYY-MM-DD")
    day = datetime.date.fromisoformat(text if len(text) == 10 else text + "-01")
    return calendar.timegm(day.timetuple()) * 1000
