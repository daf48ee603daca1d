"""Context features: what a pooled model needs beyond the window to forecast past the band.

The band scales its high and low by the window's own recent range; what it cannot see is
where the day and week stand, which hours are busy, how busy the coin is, and how long a
candle is. These columns carry that, each scale-free by construction, so that one value
means the same on every series and interval of a pooled model: they are model inputs as
they are (`UNSCALED`), never z-scored per series (a per-series z-score would turn
`interval` into 0 everywhere and give the same hour a different value on each coin).
experiments/global_model chose them on the tuning pairs' validation split.

Definitions (c close, h high, l low, v volume; n the candles of a span of the interval,
features.window_candles; sigma_t the EWMA of log(h/l) over the 30 candles to t with
weights 0.9^age, the band's range at the default lookback):
  return_1d, return_1w   log(c_t / c_{t-n}) / (sigma_t * sqrt(n)): the day's or week's move
                         in units of the move the band's range implies; row max(n, 29).
  range_tod_1, _5, _10   log(mean log range of the candles at the time of day of candle
                         t+h (h = 1, 5, 10) over the last 30 days / mean log range of all
                         candles of those 30 days): the intraday volatility cycle ahead.
                         By open time, not by row, so gaps do not shift the time of day;
                         0 for intervals of a day or more; row 30 days of candles.
  volume_1d              log(v_t / mean volume of the last day), floored at log(1e-3).
  volume_1m              log(mean volume of the last day / of the last 30 days), same floor.
  interval               log2(interval / 1 hour): 15m is -2, 1h is 0, 4h is 2.
Every column at row t reads candles <= t only (tests/context_test.py checks each against
a plain loop).
"""

from __future__ import annotations

import functools

import numpy as np

from cpbjax.band import ewma_range
from cpbjax.data.series import INTERVAL_MS

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
SPAN_DAYS = {"1d": 1, "1w": 7, "1m": 30}
SEASON_DAYS = 30  # days of history behind each time-of-day range factor
SEASON_STEPS = (1, 5, 10)  # the candles ahead (h) whose time of day a factor describes
RANGE_CANDLES = 30  # sigma_t: the EWMA range over data.lookback=30 candles, the band's
RATIO_FLOOR = 1e-3  # smallest volume ratio taken into a log (a candle without trades)

NAMES = (
    "return_1d",
    "return_1w",
    *(f"range_tod_{h}" for h in SEASON_STEPS),
    "volume_1d",
    "volume_1m",
    "interval",
)
UNSCALED = frozenset(NAMES)  # model inputs as they are: see the module docstring
VOLUME = frozenset({"volume_1d", "volume_1m"})  # the ones that read the volume


def candles(days: float, interval: str) -> int:
    """Candles of `interval` in `days` days (at least 1)."""
    return max(1, int(days * DAY_MS // INTERVAL_MS[interval]))


def warmup(name: str, interval: str) -> int:
    """Rows before the first where `name` is defined."""
    if name.startswith("return_"):
        return max(candles(SPAN_DAYS[name[-2:]], interval), RANGE_CANDLES - 1)
    if name.startswith("range_tod_") or name == "volume_1m":
        return candles(SEASON_DAYS, interval) - 1
    if name == "volume_1d":
        return candles(1, interval) - 1
    return 0


def trailing_mean(x_T: np.ndarray, n: int, min_count: int | None = None) -> np.ndarray:
    """Mean of the last min(n, t + 1) values at each row t; NaN where fewer than
    min_count (default n: a strict rolling mean; min_count < n expands over the first
    rows). Differences of one cumulative sum, so row t reads values <= t only (exactly: a
    later value never enters an earlier partial sum); NaNs in x propagate."""
    min_count = n if min_count is None else min_count
    sums_T = np.concatenate([[0.0], np.cumsum(x_T)])
    rows_T = np.arange(len(x_T))
    count_T = np.minimum(rows_T + 1, n)
    mean_T = (sums_T[rows_T + 1] - sums_T[rows_T + 1 - count_T]) / count_T
    return np.where(count_T >= min_count, mean_T, np.nan)


def window_range(ohlcv_T5: np.ndarray) -> np.ndarray:
    """sigma_t of every row [T]: `ewma_range` over the 30 candles to t; NaN before."""
    out_T = np.full(len(ohlcv_T5), np.nan)
    ends_N = np.arange(RANGE_CANDLES - 1, len(ohlcv_T5))
    out_T[RANGE_CANDLES - 1 :] = ewma_range(ohlcv_T5, ends_N, RANGE_CANDLES)
    return out_T


class SeriesContext:
    """The context columns of one series, each float64 [T] with NaN in its warm-up rows.

    What several columns read is computed once per series: sigma_t (both returns), the
    day's mean volume (both volume ratios), and the time-of-day grid with its 30-day mean
    range (the three range_tod). Each column is the same arithmetic on the same arrays as
    when computed alone.
    """

    def __init__(self, ohlcv_T5: np.ndarray, interval: str, open_time_ms):
        self.ohlcv_T5, self.interval, self.open_time_ms = ohlcv_T5, interval, open_time_ms

    def column(self, name: str) -> np.ndarray:
        """The context feature `name` (one of NAMES)."""
        if name.startswith("return_"):
            return self._scaled_return(candles(SPAN_DAYS[name[-2:]], self.interval))
        if name.startswith("range_tod_"):
            return self._time_of_day_range(int(name.rpartition("_")[2]))
        if name in VOLUME:
            return self._volume_ratio(name)
        if name == "interval":
            return np.full(len(self.ohlcv_T5), np.log2(INTERVAL_MS[self.interval] / HOUR_MS))
        raise ValueError(f"unknown context feature {name!r}: expected one of {', '.join(NAMES)}")

    @functools.cached_property
    def _sigma_T(self) -> np.ndarray:
        return window_range(self.ohlcv_T5)

    def _scaled_return(self, n: int) -> np.ndarray:
        log_close_T = np.log(self.ohlcv_T5[:, 3])
        move_T = np.full(len(log_close_T), np.nan)
        move_T[n:] = log_close_T[n:] - log_close_T[:-n]
        # A range of 0 (a whole window of flat candles) leaves the move undefined: NaN
        # would stop the series at its warm-up check, so such rows read 0.
        scale_T = self._sigma_T * np.sqrt(n)
        out_T = np.divide(move_T, scale_T, out=np.zeros_like(move_T), where=scale_T > 0)
        return np.where(np.isnan(move_T) | np.isnan(scale_T), np.nan, out_T)

    @functools.cached_property
    def _grid(self):
        """(slot_T: each candle's place on a grid G of every open time, so that a gap
        leaves holes rather than shifting the candles' time of day; log range_G, 0 in a
        hole; seen_G, 1 where a candle is; the mean range of the 30 days to each slot)."""
        step = INTERVAL_MS[self.interval]
        times_T = np.asarray(self.open_time_ms, np.int64)
        slot_T = (times_T - times_T[0]) // step
        range_G = np.zeros(int(slot_T[-1]) + 1)
        seen_G = np.zeros(len(range_G))
        range_G[slot_T] = np.log(self.ohlcv_T5[:, 1] / self.ohlcv_T5[:, 2])
        seen_G[slot_T] = 1.0
        whole_G = _lagged_mean(range_G, seen_G, np.arange(SEASON_DAYS * (DAY_MS // step)))
        return slot_T, range_G, seen_G, whole_G

    def _time_of_day_range(self, steps_ahead: int) -> np.ndarray:
        """range_tod_<steps_ahead> (module docstring); 0 for intervals of a day or more."""
        step = INTERVAL_MS[self.interval]
        if step >= DAY_MS or DAY_MS % step:
            return np.zeros(len(self.ohlcv_T5))
        per_day = DAY_MS // step
        slot_T, range_G, seen_G, whole = self._grid
        # The same time of day as t+h, k whole days earlier, k >= first so that it is <= t.
        first = -(-steps_ahead // per_day)
        lags_K = np.arange(first, first + SEASON_DAYS) * per_day - steps_ahead  # slots back
        same = _lagged_mean(range_G, seen_G, lags_K)
        # A full 30 days of grid behind the slot, for both means.
        ok_G = np.arange(len(range_G)) >= max(lags_K[-1], SEASON_DAYS * per_day - 1)
        ratio_G = np.where(
            (same > 0) & (whole > 0),
            np.log(np.maximum(same, 1e-300) / np.maximum(whole, 1e-300)),
            0.0,
        )  # a time of day with no candle or no range in 30 days: no cycle to report
        return np.where(ok_G, ratio_G, np.nan)[slot_T]

    @functools.cached_property
    def _day_volume_T(self) -> np.ndarray:
        return trailing_mean(self.ohlcv_T5[:, 4], candles(1, self.interval))

    def _volume_ratio(self, name: str) -> np.ndarray:
        if name == "volume_1d":
            num_T, den_T = self.ohlcv_T5[:, 4], self._day_volume_T
        else:
            month_T = trailing_mean(self.ohlcv_T5[:, 4], candles(SEASON_DAYS, self.interval))
            num_T, den_T = self._day_volume_T, month_T
        ratio_T = np.divide(num_T, den_T, out=np.ones_like(den_T), where=den_T > 0)
        return np.where(np.isnan(den_T), np.nan, np.log(np.maximum(ratio_T, RATIO_FLOOR)))


def _lagged_mean(value_G: np.ndarray, seen_G: np.ndarray, lags: np.ndarray) -> np.ndarray:
    """[G] the mean of value over the seen slots g - lag for lag in `lags` (0 where none
    is seen); lags either few (summed one by one) or 0..n-1 (one cumulative sum)."""
    if len(lags) > 64:  # 0..n-1: trailing sums as differences of a cumulative sum
        n = len(lags)
        total_G = trailing_mean(value_G, n) * n
        count_G = trailing_mean(seen_G, n) * n
    else:
        total_G, count_G = np.zeros(len(value_G)), np.zeros(len(value_G))
        for lag in lags[lags < len(value_G)]:  # a lag past the grid reads nothing
            total_G[lag:] += value_G[: len(value_G) - lag]
            count_G[lag:] += seen_G[: len(value_G) - lag]
    return np.divide(total_G, count_G, out=np.zeros_like(total_G), where=count_G > 0)
