"""The `Series` record every data source returns, and the skip exception."""

from __future__ import annotations

import dataclasses

import numpy as np


class SeriesSkipped(Exception):
    """A whole series cannot be used; the message is the reason recorded in results."""


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
    """

    symbol: str
    interval: str
    open_time_ms: np.ndarray
    ohlcv: np.ndarray
    notes: dict = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.symbol}-{self.interval}"
