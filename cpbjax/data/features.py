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
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import signal

# Feature columns whose values are prices; windows normalise them like OHLC.
PRICE_FEATURES = frozenset({"open", "high", "low", "close", "bb_upper", "bb_lower"})

RSI_PERIOD = 14
MACD_FAST, MACD_SLOW, MACD_SIGNAL = 12, 26, 9
ROC_PERIOD = 10
BB_PERIOD, BB_NUM_STD = 20, 2.0
VOLATILITY_PERIOD = 20
ATR_PERIOD = 14
VOLUME_PERIOD = 20

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
)


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


def _ema(x_T: np.ndarray, start: int, period: int) -> np.ndarray:
    return smoothed(x_T, start, period, 2.0 / (period + 1))


def _wilder(x_T: np.ndarray, start: int, period: int) -> np.ndarray:
    return smoothed(x_T, start, period, 1.0 / period)


class _Indicators:
    """Lazily computed feature columns of one series; each is float64 [T]."""

    def __init__(self, ohlcv_T5: np.ndarray):
        self.open, self.high, self.low, self.close, self.volume = ohlcv_T5.T

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
        mean = rolling(self.volume, VOLUME_PERIOD, np.mean)
        out = np.divide(self.volume, mean, out=np.ones_like(mean), where=mean > 0)
        return np.where(np.isnan(mean), np.nan, out)


def compute(ohlcv_T5: np.ndarray, names: tuple[str, ...]) -> tuple[np.ndarray, int]:
    """Computes the requested feature columns, in order, without filling warm-up rows.

    Args:
      ohlcv_T5: float64 [T, 5] open, high, low, close, volume of consecutive candles.
      names: feature names (see NAMES); column j of the result is names[j].

    Returns:
      (features float64 [T, F] with F = len(names), first_valid): first_valid is the
      first row where every requested feature is finite (T if there is none). Rows
      before it are warm-up and must be dropped by the caller.

    Raises:
      ValueError: on an unknown feature name or an array that is not [T, 5].
    """
    ohlcv_T5 = np.asarray(ohlcv_T5, np.float64)
    if ohlcv_T5.ndim != 2 or ohlcv_T5.shape[1] != 5:
        raise ValueError(f"features.compute: ohlcv must be [T, 5], got shape {ohlcv_T5.shape}")
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}: expected names from {', '.join(NAMES)}")
    indicators = _Indicators(ohlcv_T5)
    feats_TF = np.stack([getattr(indicators, n) for n in names], axis=1).reshape(
        len(ohlcv_T5), len(names)
    )
    finite_T = np.isfinite(feats_TF).all(axis=1)
    first_valid = int(np.argmax(finite_T)) if finite_T.any() else len(feats_TF)
    return feats_TF, first_valid
