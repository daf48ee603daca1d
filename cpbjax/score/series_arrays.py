"""The arrays of one series that its scoring reads many times, each computed once.

Scoring a series (evaluate.evaluate_model) fits the band refit, the calibrated interval
and the fitted baselines on the windows of the splits before each scored split, and
applies them to that split's windows: each of them reads the same windows' sigma
(band.ewma_range), future log ratios (band.future_log_ratios) and next candles. A
SeriesArrays keeps each array the first time it is asked for, keyed by the window ends it
covers (their values, so any caller's copy of the same ends finds it), and gives it back
after. Each is what the direct call on those ends gives, bit for bit (sigma is a BLAS dot
per window whose rounding depends on the window's row in the batch, so it is kept, not
sliced from the sigma of other windows). One lives for one series' scoring call and is
not shared between threads.

Shapes (docs/design.md): T candles, N windows, H steps, C OHLC columns.
"""

from __future__ import annotations

import numpy as np

from cpbjax import band
from cpbjax.score import metrics


class SeriesArrays:
    """Arrays of the windows of one series (its candles ohlc_TC, float64 [T, C])."""

    def __init__(self, ohlc_TC):
        self.ohlc_TC = ohlc_TC
        self._kept = {}

    def once(self, key, make):
        """make() the first time `key` (hashable) is asked for, the same array after (read
        only: every reader shares it)."""
        if key not in self._kept:
            kept = make()
            kept.flags.writeable = False
            self._kept[key] = kept
        return self._kept[key]

    def per_window(self, name, ends_N, params, make):
        """make(ends_N as int64) the first time `name` is asked for with these window ends
        and (hashable) params, the same array after."""
        ends_N = np.asarray(ends_N, np.int64)
        return self.once((name, params, ends_N.tobytes()), lambda: make(ends_N))

    def sigma(self, ends_N, lookback: int) -> np.ndarray:
        """band.ewma_range of the windows ending at ends_N, float64 [N]."""
        return self.per_window(
            "sigma", ends_N, lookback, lambda e: band.ewma_range(self.ohlc_TC, e, lookback)
        )

    def log_ratios(self, ends_N, horizon: int) -> np.ndarray:
        """band.future_log_ratios of those windows, float64 [N, H, C]."""
        return self.per_window(
            "log_ratios",
            ends_N,
            horizon,
            lambda e: band.future_log_ratios(self.ohlc_TC, e, horizon),
        )

    def next_candles(self, ends_N, horizon: int) -> np.ndarray:
        """The true next H candles of those windows, float64 [N, H, C]."""
        return self.per_window(
            "next_candles",
            ends_N,
            horizon,
            lambda e: metrics.next_candles(self.ohlc_TC, e, horizon),
        )
