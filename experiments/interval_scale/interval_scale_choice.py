"""The calibrated interval's volatility scale (eval.interval_vol_days / _weight), chosen
before the test split.

The scale is sigma^(1 - w) * m^w: sigma the window's EWMA log range (the band's scale), m
the mean log range of the last D days (cpbjax/score/intervals.py interval_scale). Which (D, w)
does not depend on a model, so it is chosen on the data alone, with rolling origins over
the windows before test: train+val is cut into 6 consecutive blocks, and each block from
the second on is scored by intervals fitted on the blocks before it (its first H windows
dropped, so no scored target was a fitted one). The interval is the product's calibrated
interval around the last close (intervals.scaled_band); with w = 0 it IS
the volatility band's quantiles, so every candidate's pinball skill is against the band.
The choice is the highest median (over series) of the mean skill over the blocks,
averaged over high, low and close. Test (fitted on train+val) is reported only.

  python experiments/interval_scale/interval_scale_choice.py --config configs/gru.py \
      --base-url $MIRROR
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.modes import plan  # noqa: E402
from cpbjax.score import evaluate, intervals, metrics  # noqa: E402

LEVELS = (0.1, 0.9)
BLOCKS = 6
COLS = {"high": 1, "low": 2, "close": 3}
CANDIDATES = [(1.0, 0.0)] + list(itertools.product((1.0, 7.0, 30.0), (0.125, 0.25, 0.375, 0.5)))


def _pinball_by_column(prep, fit_ends, scored, lookback, horizon, vol) -> np.ndarray:
    """[C] pinball loss (mean of both levels) on `scored` of the interval around the last
    close, fitted on fit_ends with the scale (days, weight) = vol; and its coverage [C]."""
    scale = intervals.scale_settings(prep.interval, *vol)
    bounds = intervals.scaled_band(
        prep, fit_ends, scored, evaluate.EvalSpec(lookback, horizon, LEVELS), scale
    )
    actual = metrics.next_candles(prep.ohlc, scored, horizon)
    inside = (actual >= bounds[..., 0]) & (actual <= bounds[..., 1])
    return intervals.pinball(actual, bounds, LEVELS).mean((0, 1, 3)), inside.mean((0, 1))


def _skills(prep, folds, lookback, horizon) -> dict:
    """candidate -> (skill [C] vs the band, coverage [C]), averaged over the folds."""
    scores = {
        vol: [_pinball_by_column(prep, f, s, lookback, horizon, vol) for f, s in folds]
        for vol in CANDIDATES
    }
    band = [loss for loss, _ in scores[(1.0, 0.0)]]  # weight 0: the band's own quantiles
    return {
        vol: (
            np.mean([1 - loss / b for (loss, _), b in zip(per_fold, band, strict=True)], 0),
            np.mean([cover for _, cover in per_fold], 0),
        )
        for vol, per_fold in scores.items()
    }


def _rolling_folds(prep, horizon) -> list:
    """(fit ends, scored ends) of each rolling origin over train+val."""
    blocks = np.array_split(np.concatenate([prep.ends["train"], prep.ends["val"]]), BLOCKS)
    return [(np.concatenate(blocks[:b]), blocks[b][horizon:]) for b in range(1, BLOCKS)]


def _row(vol, per_series: list, label: str) -> dict:
    skill = np.median([s[vol][0] for s in per_series], 0)
    cover = np.median([s[vol][1] for s in per_series], 0)
    row = {}
    for col, c in COLS.items():
        row[f"{label} {col} skill"] = f"{100 * skill[c]:+.2f}%"
    row[f"{label} mean skill"] = f"{100 * np.mean([skill[c] for c in COLS.values()]):+.2f}%"
    ahead = sum(np.mean([s[vol][0][c] for c in COLS.values()]) > 0 for s in per_series)
    row[f"{label} series ahead"] = f"{ahead}/{len(per_series)}"
    row[f"{label} coverage h/l/c"] = "/".join(f"{100 * cover[c]:.1f}" for c in COLS.values())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "gru.py"))
    parser.add_argument("--base-url", default="", help="data.base_url (a local mirror)")
    common.add_records_dir_flag(
        parser, os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
    )
    args = parser.parse_args()
    config = config_lib.load(args.config)
    config.data.base_url = args.base_url or config.data.base_url
    preps, _ = plan.prepare_all(config_lib.validate(config))
    L, H = config.data.lookback, config.data.horizon
    rolling = [_skills(p, _rolling_folds(p, H), L, H) for p in preps]
    test_fold = lambda p: [(np.concatenate([p.ends["train"], p.ends["val"]]), p.ends["test"])]  # noqa: E731
    test = [_skills(p, test_fold(p), L, H) for p in preps]
    rows = [
        {
            "days": vol[0] if vol[1] else "-",
            "weight": vol[1],
            **_row(vol, rolling, "before test"),
            **_row(vol, test, "test (reported)"),
        }
        for vol in CANDIDATES
    ]
    table = common.markdown_table(rows, list(rows[0]))
    title = f"Calibrated interval scale: {len(preps)} series, chosen before test"
    common.print_and_record(args.records_dir, "interval_scale_choice", title, table)


if __name__ == "__main__":
    main()
