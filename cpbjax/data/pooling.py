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
windows. A series left with no train or no val windows is skipped, its reason named.

Shape letters (docs/design.md): N windows of a split, L lookback, H horizon.
"""

from __future__ import annotations

import numpy as np

from cpbjax.data.series import INTERVAL_MS
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


def _clear_of(start_N, stop_N, periods: list[tuple[int, int]]) -> np.ndarray:
    """bool [N]: windows whose span overlaps none of `periods` ([start, stop) each)."""
    keep_N = np.ones(len(start_N), bool)
    for lo, hi in periods:
        keep_N &= ~((start_N < hi) & (lo < stop_N))
    return keep_N


def pool_ends(preps: list[PreparedSeries], lookback: int, horizon: int):
    """The train and val windows each series contributes to the pooled model.

    Returns:
      (name -> {"train": int64 [N], "val": int64 [N]} for the series that keep windows in
       both, name -> why a series keeps none).
    """
    own = {p.name: {s: scored_period(p, s, horizon) for s in ("val", "test")} for p in preps}
    kept, emptied = {}, {}
    for p in preps:
        others = [periods for name, periods in own.items() if name != p.name]
        ends = {}
        for split, avoid in (("train", "val"), ("val", "test")):
            spans = window_spans(p, p.ends[split], lookback, horizon)
            ends[split] = p.ends[split][_clear_of(*spans, [o[avoid] for o in others])]
        missing = [s for s, e in ends.items() if not len(e)]
        if missing:
            emptied[p.name] = (
                f"train.share='pooled': every {missing[0]} window overlaps another series' "
                f"{'val or test' if missing[0] == 'train' else 'test'} period, which a pooled "
                "model must not learn from"
            )
        else:
            kept[p.name] = ends
    return kept, emptied
