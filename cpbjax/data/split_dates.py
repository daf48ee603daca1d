"""Calendar splits (data.split_dates): which windows fall in train, val and test by date.

With data.split_dates = (VAL_START, TEST_START) every series is split at the same two
instants (00:00 UTC of each date). A window belongs to the split in which its whole
target span lies, and a train window's inputs and targets all close by VAL_START, so no
train window of any series overlaps any series' val or test span; windows straddling a
date belong to no split (a purge by time). A series whose windows all end before
VAL_START is training data only (`TrainOnly`): a pooled model may learn from it, and it
is never scored. `windows` applies these splits; data.split_dates=() keeps its
per-series fractions (data.splits).
"""

from __future__ import annotations

import numpy as np

from cpbjax import config_rules as config_rules
from cpbjax.data.series import SeriesSkipped, split_date_ms

SPLITS = ("train", "val", "test")
TRAIN_ONLY = "train_only"  # the notes key of a training-data-only series: why it is not scored


class NoWindows(SeriesSkipped):
    """A series with no window in some split; `ends`: split name -> int64 [N] its ends."""

    def __init__(self, reason: str, ends: dict):
        super().__init__(reason)
        self.ends = ends


class TrainOnly(NoWindows):
    """A series whose windows all end before data.split_dates[0]: training data only."""


def is_train_only(prep) -> bool:
    """Whether a prepared series is training data only (no val or test windows)."""
    return TRAIN_ONLY in prep.notes


def bounds_ms(data_cfg) -> tuple[int, int] | None:
    """data.split_dates as (val_start, test_start) epoch ms; None for fractional splits
    (also for a config saved before the field existed)."""
    dates = tuple(getattr(data_cfg, "split_dates", ()))  # the group or a DataSpec
    return tuple(split_date_ms(d) for d in dates) if dates else None


def split_ends(ends, open_time_ms, step_ms: int, horizon: int, bounds) -> dict:
    """Calendar train/val/test split of window ends, each window wholly inside its split.

    Args:
      ends: int [N] window end indices (gap-free windows) into open_time_ms.
      open_time_ms: int64 [T] candle open times. step_ms: the interval's length.
      horizon: H, the number of target candles after each end.
      bounds: (val_start, test_start), epoch ms (`bounds_ms`).

    Returns:
      split name -> int64 [N_split] ends: train windows whose last target closes by
      val_start (their inputs come earlier still); val windows whose targets open at or
      after val_start and close by test_start; test windows whose targets open at or after
      test_start. Windows straddling a date belong to no split.
    """
    ends = np.asarray(ends, np.int64)
    if not len(ends):
        return {split: ends for split in SPLITS}
    first_open_N = open_time_ms[ends + 1]
    last_close_N = open_time_ms[ends + horizon] + step_ms
    val_start, test_start = bounds
    return {
        "train": ends[last_close_N <= val_start],
        "val": ends[(first_open_N >= val_start) & (last_close_N <= test_start)],
        "test": ends[first_open_N >= test_start],
    }


def check_windows(series_windows, data_cfg) -> None:
    """Raises ConfigError naming data.split_dates when a split has no window of any series.

    Args:
      series_windows: per series, split name -> its window ends (a skipped series: those
        it had, or {}).
      data_cfg: the `config.data` group.
    """
    counts = {split: sum(len(w.get(split, ())) for w in series_windows) for split in SPLITS}
    empty = [split for split in SPLITS if not counts[split]]
    if empty:
        raise config_rules.ConfigError(
            f"data.split_dates={tuple(data_cfg.split_dates)}: no series has a {empty[0]} "
            f"window of {data_cfg.lookback}+{data_cfg.horizon} candles wholly inside the "
            f"{empty[0]} span (windows per split: {counts}); choose dates inside the data"
        )
