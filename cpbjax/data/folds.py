"""Rolling-origin backtest folds: each fold of a series is a PreparedSeries of its own.

A fold is the series split at another origin: its test block is one of `backtest.folds`
consecutive blocks of `backtest.step` windows at the end of the series (fold 0 the
oldest, the last fold's block the newest); its val block is the data.splits val share of
windows right before the test block; its train windows are those before val (expanding),
or the newest `backtest.window` of them (sliding). Blocks are purged as
`windows.split_ends` purges the splits: a window is kept only if its last target candle
comes before the last input candle of the next block's first window. A fold trains on at
most as many windows as the series' train split has (the newest), so every fold fits the
program a train run compiles (stacking.padded_sizes). With the default step (the size of
the series' test split) the last fold is exactly the train mode's split.

A fold is named "<SERIES>@fold<f>" and keeps the series' symbol and interval, so the
driver, compaction, checkpoints and sharding train folds as coins unchanged, and a fold
coin gets its series' key (group.coin_keys of the series' position in the run).
"""

from __future__ import annotations

import numpy as np
from absl import logging

from cpbjax import config_rules as config_rules
from cpbjax.data import split_dates, windows
from cpbjax.data.series import Series, SeriesSkipped

FOLD_SEPARATOR = "@fold"


def fold_name(series_name: str, fold: int) -> str:
    """ "BTCUSDT-1h", 2 -> "BTCUSDT-1h@fold2"."""
    return f"{series_name}{FOLD_SEPARATOR}{fold}"


def series_of(name: str) -> str:
    """The series a (fold) PreparedSeries name belongs to: "BTCUSDT-1h@fold2" -> "BTCUSDT-1h"."""
    return name.split(FOLD_SEPARATOR)[0]


def fold_of(name: str) -> int:
    """The fold index of a fold name: "BTCUSDT-1h@fold2" -> 2."""
    return int(name.rsplit(FOLD_SEPARATOR, 1)[1])


def _purged(part: np.ndarray, next_first_end: int, horizon: int) -> np.ndarray:
    """The windows of `part` whose targets end before the next block's first window's end."""
    return part[part + horizon < next_first_end]


def _check_train_count(count: int, fold: int, bt_cfg, val_windows: int) -> None:
    """Raises SeriesSkipped when a fold has fewer than backtest.min_train_windows train
    windows (by default as many as its val block has)."""
    need = bt_cfg.min_train_windows or val_windows
    if count < need:
        rule = "backtest.min_train_windows" if bt_cfg.min_train_windows else "its val block"
        raise SeriesSkipped(f"fold {fold} has {count} train windows, fewer than {rule} ({need})")


def fold_ends(ends_N: np.ndarray, fold: int, bt_cfg, splits, horizon: int) -> dict:
    """The purged train/val/test window ends of one fold.

    Args:
      ends_N: int [N] increasing ends of the series' gap-free windows.
      fold: 0 .. backtest.folds - 1, in time order.
      bt_cfg: the `config.backtest` group. splits: data.splits. horizon: H.

    Returns:
      split name -> int64 [N_split] ends.

    Raises:
      SeriesSkipped: the fold does not fit in the series or has too few train windows
        (the reason names the counts).
    """
    ends_N = np.asarray(ends_N, np.int64)
    n = len(ends_N)
    b1, b2 = (int(b) for b in windows.split_boundaries(n, splits))
    step = bt_cfg.step or n - b2  # default: the size of the series' test split
    test_lo = n - (bt_cfg.folds - fold) * step
    val_lo = test_lo - (b2 - b1)
    if val_lo < 0:
        raise SeriesSkipped(
            f"fold {fold} does not fit: {bt_cfg.folds - fold} test blocks of {step} windows "
            f"and a val block of {b2 - b1} need {n - val_lo}, the series has {n}"
        )
    train = _purged(ends_N[:val_lo], ends_N[val_lo], horizon)
    # At most the train split's count, so the fold fits the run's padded program.
    keep = min(bt_cfg.window or b1, b1)
    train = train[max(len(train) - keep, 0) :]
    _check_train_count(len(train), fold, bt_cfg, val_windows=b2 - b1)
    return {
        "train": train,
        "val": _purged(ends_N[val_lo:test_lo], ends_N[test_lo], horizon),
        "test": ends_N[test_lo : test_lo + step],
    }


def prepare_folds(series: Series, data_cfg, bt_cfg) -> tuple[list, dict]:
    """The fold PreparedSeries of one series, each normalised on its own train windows.

    Returns:
      (fold PreparedSeries in time order, fold name -> reason it was skipped).

    Raises:
      SeriesSkipped: the whole series cannot be used (too few candles).
    """
    L, H = data_cfg.lookback, data_cfg.horizon
    rows = windows.kept_rows(series, data_cfg)
    ends_N = windows.window_ends(rows, series.interval, L, H)
    folds, skipped = [], {}
    for f in range(bt_cfg.folds):
        name = fold_name(series.name, f)
        try:
            ends = fold_ends(ends_N, f, bt_cfg, data_cfg.splits, H)
            empty = [split for split in windows.SPLITS if not len(ends[split])]
            if empty:
                raise SeriesSkipped(f"fold {f} has no gap-free {empty[0]} windows")
            folds.append(windows.with_ends(series, rows, ends, data_cfg, name=name))
        except SeriesSkipped as e:
            skipped[name] = str(e)
            logging.warning("%s: skipped: %s", name, e)
    return folds, skipped


def prepare_all(series_list: list[Series], data_cfg, bt_cfg):
    """`prepare_folds` of each series: (every fold PreparedSeries, name -> skip reason).

    A series that cannot be used is skipped under its own name, a fold under its fold name.

    Raises:
      ConfigError: data.split_dates is set (a backtest's folds are its own splits).
    """
    if split_dates.bounds_ms(data_cfg) is not None:
        raise config_rules.ConfigError(
            f"data.split_dates={tuple(data_cfg.split_dates)} applies to --mode train: "
            "--mode backtest splits each series into its own rolling folds (backtest.*); "
            "set data.split_dates=()"
        )
    preps, skipped = [], {}
    for series in series_list:
        try:
            folds, fold_skips = prepare_folds(series, data_cfg, bt_cfg)
        except SeriesSkipped as e:
            skipped[series.name] = str(e)
            logging.warning("%s: skipped: %s", series.name, e)
            continue
        preps.extend(folds)
        skipped.update(fold_skips)
    return preps, skipped
