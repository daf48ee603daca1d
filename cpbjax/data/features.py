"""Vectorised model-input features of one series: OHLCV columns and technical indicators.

Every indicator is causal (row t uses candles <= t only), so a candle can never
leak into the features of an earlier row. Nothing loops over rows: rolling
statistics use strided views and every exponential average is a first-order IIR
filter run by `scipy.signal.lfilter`.

Conventions (the ones TA-Lib uses, so values match common charting tools):
  - Exponential averages are seeded with the simple mean of their first `period`
    valid inputs, then follow y_t = (1 - a) * y_{t-1} + a * x_t. The seed row is
    the first defined row; rows before it are NaN (warm-up). EMA(n) uses
    a = 2 / (n + 1); Wilder's smoothing (RSI, ATR) uses a = 1 / n.
  - Rolling standard deviations are population ones (ddof=0), as John Bollinger
    defines his bands; pandas' `rolling().std()` would use ddof=1.
  - Warm-up rows are NaN, never zero: `compute` reports the first row where every
    requested feature is defined, and the caller drops the rows before it.

Definitions (c = close, h = high, l = low, v = volume):
  log_return   log(c_t / c_{t-1}); first defined at row 1.
  rsi          RSI(14): 100 * G / (G + L) with G, L the Wilder averages of the
               gains max(dc, 0) and losses max(-dc, 0); 50 when both are 0; row 14.
  macd         EMA(12, c) - EMA(26, c); row 25.
  macd_signal  EMA(9) of macd; row 33.
  roc          ROC(10): 100 * (c_t / c_{t-10} - 1); row 10.
  bb_upper     SMA(20, c) + 2 * std(20, c); row 19.  bb_lower: minus 2 std.
  bb_width     100 * (upper - lower) / SMA(20, c), in % of the middle band.
  bb_position  (c - lower) / (upper - lower); 0.5 when the band has zero width.
  volatility   std(20) of log returns; row 20.
  atr          ATR(14): Wilder average of the true range
               max(h - l, |h - c_{t-1}|, |l - c_{t-1}|) from row 1; row 14.
  volume_norm  v / SMA(20, v); 1 when the 20 volumes are all 0; row 19.

Context features (cpbjax/data/context.py: return_1d, return_1w, range_tod_1/_5/_10,
volume_1d, volume_1m, interval) are scale-free and fed to the model unscaled.

Long-history features (non-price; z-scored with train statistics like every non-price
column). Their windows are spans of time, so the candle count n comes from the series
interval (`window_candles`: 1d, 1w, 1m = 1, 7 and 30 days; 15m: 96/672/2880, 1h:
24/168/720), and `compute` needs the interval (and the open times for the calendar):
  parkinson_1d, _1w, _1m      log of the Parkinson volatility over n candles:
               0.5 * log(mean of log(h/l)^2 / (4 log 2)); row n - 1.
  garman_klass_1d, _1w, _1m   the same with the Garman-Klass variance per candle
               0.5 * log(h/l)^2 - (2 log 2 - 1) * log(c/o)^2 (never negative, since
               |log(c/o)| <= log(h/l)); row n - 1.
               Both are logs because volatility is positive, right-skewed and moves
               multiplicatively (regimes differ tenfold): its log is near Gaussian, so a
               z-score with train statistics scales it well, a regime change is an
               additive shift, and 1d minus 1m is the term structure. A volatility of 0
               (a whole window of flat candles) is floored at VOL_FLOOR.
  log_range    log(h/l) of the candle itself; row 0.
  volume_norm_1d  v / mean(v) over 1 day of candles; 1 when they are all 0; row n - 1.
               A day averages over the intraday volume cycle, so the ratio says "busy
               for this coin" rather than "a busy hour" (the 20-candle volume_norm spans
               5 hours at 15m and mixes the two).
  hour_sin, hour_cos  sin/cos of 2 pi * (UTC time of day of the open time) / 24 h; row 0.
  dow_sin, dow_cos    sin/cos of 2 pi * (time since Monday 00:00 UTC) / 7 days; row 0.
`warmup_candles(names, interval)` is the first row where all of `names` are defined: the
candles a series must have before its first usable one (training and forecasts both).
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from cpbjax.data import context
from cpbjax.data.series import INTERVAL_MS

# Feature columns that read the volume: without them a series' volume is never used.
VOLUME_FEATURES = frozenset({"volume", "volume_norm", "volume_norm_1d", *context.VOLUME})
# Feature columns fed to the model as they are, not z-scored (cpbjax/data/context.py).
UNSCALED_FEATURES = context.UNSCALED

RSI_PERIOD = 14
MACD_FAST, MACD_SLOW, MACD_SIGNAL = 12, 26, 9
ROC_PERIOD = 10
BB_PERIOD, BB_NUM_STD = 20, 2.0
VOLATILITY_PERIOD = 20
ATR_PERIOD = 14
VOLUME_PERIOD = 20

DAY_MS = context.DAY_MS
# Long-history spans: the suffix of a volatility feature's name -> its length.
SPANS_MS = {"1d": DAY_MS, "1w": 7 * DAY_MS, "1m": 30 * DAY_MS}
# Per-candle variance estimators of the log-volatility features (name prefixes).
VOL_ESTIMATORS = ("parkinson", "garman_klass")
# Smallest volatility taken into a log: far below one price tick of any traded pair.
VOL_FLOOR = 1e-8
# Monday 00:00 UTC is 4 days after the epoch (a Thursday): the week phase's offset.
WEEK_PHASE_OFFSET_MS = 3 * DAY_MS
# Features read from the candles' open times.
CALENDAR = ("hour_sin", "hour_cos", "dow_sin", "dow_cos")

# Features whose window is a span of time (warm-up: its candles minus 1).
SPAN_FEATURES = (
    *(f"{est}_{span}" for est in VOL_ESTIMATORS for span in SPANS_MS),
    "volume_norm_1d",
)
LONG_HISTORY = (*SPAN_FEATURES, "log_range", *CALENDAR)

NAMES = (
    "open",
    "high",
    "low",
    "close",
    "volume",
    "log_return",
    "rsi",
    "macd",
    "macd_signal",
    "roc",
    "bb_upper",
    "bb_lower",
    "bb_width",
    "bb_position",
    "volatility",
    "atr",
    "volume_norm",
    *LONG_HISTORY,
    *context.NAMES,
)

# First defined row of each fixed-window feature (the long-history ones depend on the
# interval: `warmup_candles`).
_FIXED_WARMUP = {
    "log_return": 1,
    "rsi": RSI_PERIOD,
    "macd": MACD_SLOW - 1,
    "macd_signal": MACD_SLOW + MACD_SIGNAL - 2,
    "roc": ROC_PERIOD,
    "bb_upper": BB_PERIOD - 1,
    "bb_lower": BB_PERIOD - 1,
    "bb_width": BB_PERIOD - 1,
    "bb_position": BB_PERIOD - 1,
    "volatility": VOLATILITY_PERIOD,
    "atr": ATR_PERIOD,
    "volume_norm": VOLUME_PERIOD - 1,
}


def smoothed(x_T: np.ndarray, start: int, period: int, alpha: float) -> np.ndarray:
    """Exponential smoothing of x[start:], seeded by the mean of its first `period` values.

    Args:
      x_T: float64 [T]; values before `start` are ignored (they may be NaN).
      start: first row of x to use.
      period: number of values averaged for the seed.
      alpha: smoothing factor a in y_t = (1 - a) * y_{t-1} + a * x_t.

    Returns:
      float64 [T]: NaN before row start + period - 1, the seed there, then the filter.
    """
    y_T = np.full(len(x_T), np.nan)
    seed_row = start + period - 1
    if seed_row >= len(x_T):
        return y_T
    seed = x_T[start : seed_row + 1].mean()
    y_T[seed_row] = seed
    rest = x_T[seed_row + 1 :]
    if len(rest):
        # Imported here: scipy.signal costs 0.4 s of the start of every run, most of
        # which smooth nothing (the default features are the prices).
        from scipy import signal

        # Direct form II transposed: y_0 = a * x_0 + zi, so zi = (1 - a) * seed.
        y_T[seed_row + 1 :], _ = signal.lfilter(
            [alpha], [1.0, alpha - 1.0], rest, zi=[(1.0 - alpha) * seed]
        )
    return y_T


def rolling(x_T: np.ndarray, period: int, reduce) -> np.ndarray:
    """`reduce(window, axis=-1)` over trailing windows of `period` rows; NaN before."""
    y_T = np.full(len(x_T), np.nan)
    if len(x_T) >= period:
        y_T[period - 1 :] = reduce(sliding_window_view(x_T, period), axis=-1)
    return y_T


def window_candles(interval: str) -> dict[str, int]:
    """Span suffix ("1d", "1w", "1m") -> candles of `interval` it covers (at least 1)."""
    step = INTERVAL_MS[interval]
    return {span: max(1, ms // step) for span, ms in SPANS_MS.items()}


def _span_candles(name: str, interval: str) -> int:
    return window_candles(interval)[name.rpartition("_")[2]]


def warmup_candles(names, interval: str) -> int:
    """Candles before the first row where every feature of `names` is defined.

    A series needs this many candles before its first usable one: training drops
    them before keeping data.max_candles, and a forecast needs data.lookback more.
    """
    return max([0] + [_warmup(n, interval) for n in names])


def _warmup(name: str, interval: str) -> int:
    if name in context.NAMES:
        return context.warmup(name, interval)
    return (
        _span_candles(name, interval) - 1 if name in SPAN_FEATURES else _FIXED_WARMUP.get(name, 0)
    )


def parkinson_var(high_T, low_T) -> np.ndarray:
    """Parkinson's per-candle variance estimate log(h/l)^2 / (4 log 2)."""
    return np.log(high_T / low_T) ** 2 / (4.0 * np.log(2.0))


def garman_klass_var(open_T, high_T, low_T, close_T) -> np.ndarray:
    """Garman-Klass per-candle variance 0.5 log(h/l)^2 - (2 log 2 - 1) log(c/o)^2 (>= 0)."""
    return (
        0.5 * np.log(high_T / low_T) ** 2
        - (2.0 * np.log(2.0) - 1.0) * np.log(close_T / open_T) ** 2
    )


def log_volatility(var_T: np.ndarray, n: int, min_count: int) -> np.ndarray:
    """log of the volatility sqrt(trailing mean of var) over n candles, floored at VOL_FLOOR."""
    return 0.5 * np.log(np.maximum(context.trailing_mean(var_T, n, min_count), VOL_FLOOR**2))


def _relative_volume(volume_T: np.ndarray, mean_T: np.ndarray) -> np.ndarray:
    """volume / its mean; 1 where the mean is 0, NaN where it is undefined."""
    out = np.divide(volume_T, mean_T, out=np.ones_like(mean_T), where=mean_T > 0)
    return np.where(np.isnan(mean_T), np.nan, out)


def _ema(x_T: np.ndarray, start: int, period: int) -> np.ndarray:
    return smoothed(x_T, start, period, 2.0 / (period + 1))


def _wilder(x_T: np.ndarray, start: int, period: int) -> np.ndarray:
    return smoothed(x_T, start, period, 1.0 / period)


class _Indicators:
    """Lazily computed feature columns of one series; each is float64 [T]."""

    def __init__(self, ohlcv_T5: np.ndarray, interval: str | None, open_time_ms):
        self.open, self.high, self.low, self.close, self.volume = ohlcv_T5.T
        self._ohlcv = ohlcv_T5
        self.interval, self.open_time_ms = interval, open_time_ms

    def column(self, name: str) -> np.ndarray:
        """The feature `name` (a cached property, or a log volatility over a span)."""
        if name in context.NAMES:
            return self._context.column(name)
        estimator, _, span = name.rpartition("_")
        if estimator in VOL_ESTIMATORS:
            n = window_candles(self.interval)[span]
            return log_volatility(self._candle_var[estimator], n, n)
        return getattr(self, name)

    @functools.cached_property
    def _context(self) -> context.SeriesContext:
        return context.SeriesContext(self._ohlcv, self.interval, self.open_time_ms)

    @functools.cached_property
    def _candle_var(self):
        """Estimator name -> per-candle variance [T]."""
        return {
            "parkinson": parkinson_var(self.high, self.low),
            "garman_klass": garman_klass_var(self.open, self.high, self.low, self.close),
        }

    @functools.cached_property
    def log_return(self):
        return np.concatenate([[np.nan], np.diff(np.log(self.close))])

    @functools.cached_property
    def rsi(self):
        dc = np.concatenate([[np.nan], np.diff(self.close)])
        gain = _wilder(np.maximum(dc, 0.0), 1, RSI_PERIOD)
        loss = _wilder(np.maximum(-dc, 0.0), 1, RSI_PERIOD)
        total = gain + loss
        out = np.divide(100.0 * gain, total, out=np.full_like(total, 50.0), where=total > 0)
        return np.where(np.isnan(total), np.nan, out)

    @functools.cached_property
    def macd(self):
        return _ema(self.close, 0, MACD_FAST) - _ema(self.close, 0, MACD_SLOW)

    @functools.cached_property
    def macd_signal(self):
        return _ema(self.macd, MACD_SLOW - 1, MACD_SIGNAL)

    @functools.cached_property
    def roc(self):
        out = np.full(len(self.close), np.nan)
        out[ROC_PERIOD:] = 100.0 * (self.close[ROC_PERIOD:] / self.close[:-ROC_PERIOD] - 1.0)
        return out

    @functools.cached_property
    def _band(self):
        """(middle, half width) of the Bollinger bands."""
        mid = rolling(self.close, BB_PERIOD, np.mean)
        return mid, BB_NUM_STD * rolling(self.close, BB_PERIOD, np.std)

    @functools.cached_property
    def bb_upper(self):
        return self._band[0] + self._band[1]

    @functools.cached_property
    def bb_lower(self):
        return self._band[0] - self._band[1]

    @functools.cached_property
    def bb_width(self):
        return 100.0 * 2.0 * self._band[1] / self._band[0]

    @functools.cached_property
    def bb_position(self):
        width = self.bb_upper - self.bb_lower
        out = np.divide(
            self.close - self.bb_lower, width, out=np.full_like(width, 0.5), where=width > 0
        )
        return np.where(np.isnan(width), np.nan, out)

    @functools.cached_property
    def volatility(self):
        return rolling(self.log_return, VOLATILITY_PERIOD, np.std)

    @functools.cached_property
    def atr(self):
        prev_close = np.concatenate([[np.nan], self.close[:-1]])
        true_range = np.fmax(
            self.high - self.low,
            np.maximum(np.abs(self.high - prev_close), np.abs(self.low - prev_close)),
        )
        return _wilder(true_range, 1, ATR_PERIOD)

    @functools.cached_property
    def volume_norm(self):
        return _relative_volume(self.volume, rolling(self.volume, VOLUME_PERIOD, np.mean))

    @functools.cached_property
    def volume_norm_1d(self):
        n = window_candles(self.interval)["1d"]
        return _relative_volume(self.volume, context.trailing_mean(self.volume, n))

    @functools.cached_property
    def log_range(self):
        return np.log(self.high / self.low)

    @functools.cached_property
    def _phases(self):
        """(time of day, time since Monday 00:00) of each open time, in turns [0, 1)."""
        t_T = np.asarray(self.open_time_ms, np.int64)
        week_ms = 7 * DAY_MS
        return (t_T % DAY_MS) / DAY_MS, ((t_T + WEEK_PHASE_OFFSET_MS) % week_ms) / week_ms

    @functools.cached_property
    def hour_sin(self):
        return np.sin(2.0 * np.pi * self._phases[0])

    @functools.cached_property
    def hour_cos(self):
        return np.cos(2.0 * np.pi * self._phases[0])

    @functools.cached_property
    def dow_sin(self):
        return np.sin(2.0 * np.pi * self._phases[1])

    @functools.cached_property
    def dow_cos(self):
        return np.cos(2.0 * np.pi * self._phases[1])


def _check_context(names, interval, open_time_ms, length: int) -> None:
    """Raises ValueError if a long-history feature lacks the interval or open times."""
    if interval is None and any(n in SPAN_FEATURES or n in context.NAMES for n in names):
        raise ValueError(f"features {names} span days of candles: pass the series interval")
    if interval is not None and interval not in INTERVAL_MS:
        raise ValueError(f"interval {interval!r}: expected one of {', '.join(INTERVAL_MS)}")
    if any(n in CALENDAR or n.startswith("range_tod_") for n in names) and (
        open_time_ms is None or np.shape(open_time_ms) != (length,)
    ):
        raise ValueError(f"calendar features in {names} need the [T] open times of the candles")


def compute(
    ohlcv_T5: np.ndarray, names: tuple[str, ...], interval: str | None = None, open_time_ms=None
) -> tuple[np.ndarray, int]:
    """Computes the requested feature columns, in order, without filling warm-up rows.

    Args:
      ohlcv_T5: float64 [T, 5] open, high, low, close, volume of consecutive candles.
      names: feature names (see NAMES); column j of the result is names[j].
      interval: the candles' interval ("15m"); needed by the long-history features.
      open_time_ms: int64 [T] UTC open times; needed by the calendar features.

    Returns:
      (features float64 [T, F] with F = len(names), first_valid): first_valid is the
      first row where every requested feature is finite (T if there is none). Rows
      before it are warm-up and must be dropped by the caller.

    Raises:
      ValueError: on an unknown feature name, an array that is not [T, 5], or a
        long-history feature without its interval or open times.
    """
    ohlcv_T5 = np.asarray(ohlcv_T5, np.float64)
    if ohlcv_T5.ndim != 2 or ohlcv_T5.shape[1] != 5:
        raise ValueError(f"features.compute: ohlcv must be [T, 5], got shape {ohlcv_T5.shape}")
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}: expected names from {', '.join(NAMES)}")
    _check_context(names, interval, open_time_ms, len(ohlcv_T5))
    indicators = _Indicators(ohlcv_T5, interval, open_time_ms)
    feats_TF = np.stack([indicators.column(n) for n in names], axis=1).reshape(
        len(ohlcv_T5), len(names)
    )
    finite_T = np.isfinite(feats_TF).all(axis=1)
    first_valid = int(np.argmax(finite_T)) if finite_T.any() else len(feats_TF)
    return feats_TF, first_valid
