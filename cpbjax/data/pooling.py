"""The windows a pooled model (train.share=pooled) may learn from: purged across series.

One series' splits are chronological and purged (`windows`), so a per-series model never
sees its own val or test period. A pooled model learns from every series' train
windows, and series need not cover the same time: in the shared mirror the 15m and 1h
series of one symbol, and symbols listed in other months, end months apart. Series j's
train windows can then hold the very days on which series i is scored (BTCUSDT-1h
trains on the week that is BTCUSDT-15m's test split), and the pooled model would be
scored on a period it has learned.

So a pooled model trains on a window only if its candles (inputs and targets) share no
time with any other series' evaluated period, the targets of its val and test windows;
and its early stopping (the pooled val loss) counts a val window only if it shares no
time with any other series' test targets. Windows after another series' period are kept:
it is the overlap that would let a model learn the scored candles themselves.

Evaluation is unchanged: every series is still scored on all its own val and test
windows. A series left with no train or no val windows is skipped, its reason named. A
training-data-only series (data.split_dates, `split_dates.is_train_only`) has no scored
period and contributes train windows alone.

Shape letters (docs/design.md): N windows of a split, L lookback, H horizon.
"""

from __future__ import annotations

import numpy as np
from absl import logging

from cpbjax.data.series import INTERVAL_MS
from cpbjax.data.split_dates import is_train_only
from cpbjax.data.windows import PreparedSeries


def window_spans(prep: PreparedSeries, ends_N, lookback: int, horizon: int):
    """The time each window reads, [open of its first input, close of its last target):
    (start_N, stop_N) int64 epoch milliseconds."""
    ends_N = np.asarray(ends_N, np.int64)
    times_T = prep.open_time_ms
    return times_T[ends_N - lookback + 1], times_T[ends_N + horizon] + INTERVAL_MS[prep.interval]


def scored_period(prep: PreparedSeries, first_split: str, horizon: int) -> tuple[int, int]:
    """[open of the first target, close of the last target) of the windows from
    `first_split` ("val" or "test") to the end of the test split, epoch ms."""
    first, last = int(prep.ends[first_split][0]), int(prep.ends["test"][-1])
    step = INTERVAL_MS[prep.interval]
    return int(prep.open_time_ms[first + 1]), int(prep.open_time_ms[last + horizon]) + step


def _merged(periods) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint [start, stop) periods covering `periods`: (starts, stops) int64."""
    starts, stops = [], []
    for lo, hi in sorted(periods):
        if stops and lo <= stops[-1]:
            stops[-1] = max(stops[-1], hi)
        else:
            starts.append(lo)
            stops.append(hi)
    return np.asarray(starts, np.int64), np.asarray(stops, np.int64)


def _clear_of(start_N, stop_N, merged) -> np.ndarray:
    """bool [N]: windows whose span overlaps none of the `merged` periods. Only the first
    period ending after a window starts can overlap it: one binary search per window."""
    starts, stops = merged
    if not len(starts):
        return np.ones(len(start_N), bool)
    i_N = np.searchsorted(stops, start_N, side="right")
    later_N = starts[np.minimum(i_N, len(starts) - 1)] >= stop_N
    return (i_N == len(starts)) | later_N


def pooled_series(preps: list[PreparedSeries], data_cfg) -> tuple[list, dict, dict]:
    """`pool_ends` with config.data's window sizes: (the series that keep train and val
    windows, their purged train and val ends, name -> why a series keeps none)."""
    ends, emptied = pool_ends(preps, data_cfg.lookback, data_cfg.horizon)
    return [p for p in preps if p.name in ends], ends, emptied


def pool_ends(preps: list[PreparedSeries], lookback: int, horizon: int):
    """The train and val windows each series contributes to the pooled model.

    The periods to avoid are merged over ALL series, the window's own included: its own
    splits are purged already (`windows.split_ends`), so its own period never overlaps
    its train or val windows, and one merged list serves every series (S series cost
    O(S log S) to merge and a binary search per window, not S x S passes).

    Returns:
      (name -> {"train": int64 [N], "val": int64 [N]} for the series that keep windows in
       both (a training-data-only series: in train), name -> why a series keeps none).
    """
    scored = [p for p in preps if not is_train_only(p)]
    avoid = {
        "train": _merged(scored_period(p, "val", horizon) for p in scored),
        "val": _merged(scored_period(p, "test", horizon) for p in scored),
    }
    kept, emptied = {}, {}
    for p in preps:
        ends = {}
        for split in ("train", "val"):
            spans = window_spans(p, p.ends[split], lookback, horizon)
            ends[split] = p.ends[split][_clear_of(*spans, avoid[split])]
        needed = ("train",) if is_train_only(p) else ("train", "val")
        missing = [s for s in needed if not len(ends[s])]
        if missing:
            emptied[p.name] = (
                f"train.share='pooled': every {missing[0]} window overlaps another series' "
                f"{'val or test' if missing[0] == 'train' else 'test'} period, which a pooled "
                "model must not learn from"
            )
            logging.warning("%s: skipped: %s", p.name, emptied[p.name])
        else:
            kept[p.name] = ends
    return kept, emptied
