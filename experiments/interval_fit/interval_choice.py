"""How to fit the calibrated interval (cpbjax/score/intervals.py), chosen on validation only.

For every saved model of a finished run, each candidate fit is scored on val windows it
did not see, against the volatility band's quantiles fitted on every window before the
scored ones (as results.json's band is):
  val_half:   fitted on the first half of val, scored on the second half;
  train:      fitted on the train split, scored on all of val;
  train, newest 1024: fitted on the newest 1,024 train windows, scored on all of val.
each with weighting "none" (split conformal) and "sigma" (pinball-optimal). The table
gives, per column, the median over series of the central interval's coverage and of its
pinball skill against the band. Then, reported only, the test scores of the fit the
product uses (on all of val, or on train+val), as `--mode evaluate` writes them.

  python experiments/interval_fit/interval_choice.py --workdir runs/abl40/band_mae --config configs/gru.py \
      --base-url $MIRROR
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.modes import trained_run  # noqa: E402
from cpbjax.score import (  # noqa: E402
    evaluate,
    forecast,
    intervals,
    metrics,
    saved,  # noqa: E402
)

LEVELS = (0.1, 0.9)
COLS = ("high", "low", "close")
# candidate -> (fit windows, scored windows) of a series' split ends.
FITS = {
    "val_half": lambda e: (e["val"][: len(e["val"]) // 2], e["val"][len(e["val"]) // 2 :]),
    "train": lambda e: (e["train"], e["val"]),
    "train, newest 1024": lambda e: (e["train"][-1024:], e["val"]),
    "val (test)": lambda e: (e["val"], e["test"]),
    "train+val (test)": lambda e: (np.concatenate([e["train"], e["val"]]), e["test"]),
    "train newest 1024 + val (test)": lambda e: (
        np.concatenate([e["train"][-1024:], e["val"]]),
        e["test"],
    ),
}


def _scores(model, prep, lookback, horizon) -> dict:
    """(fit, weighting) -> column -> (coverage, pinball skill vs band) of one series."""
    ends = prep.ends
    point = {
        split: forecast.forecast_ends(
            model.module, model.params, prep, ends[split], lookback, horizon
        ).prices_NHC
        for split in ("train", "val", "test")
    }
    by_end = {int(t): p for s in point for t, p in zip(ends[s], point[s], strict=True)}
    prices = lambda e: np.stack([by_end[int(t)] for t in e])  # noqa: E731  [N, H, C]
    out = {}
    for fit, pick in FITS.items():
        fit_ends, scored = pick(ends)
        for weighting in ("none", "sigma"):
            cal = intervals.fit_calibration(
                prep,
                fit_ends,
                prices(fit_ends),
                evaluate.EvalSpec(lookback, horizon, LEVELS),
                weighting,
            )
            bounds = intervals.calibrated_bounds(cal, prep.ohlc, scored, prices(scored), lookback)
            before = np.concatenate([e for e in ends.values() if e[-1] < scored[0]] + [fit_ends])
            block = _score_against_band(prep, np.unique(before), scored, bounds, lookback, horizon)
            out[(fit, weighting)] = block
    return out


def _score_against_band(prep, band_ends, scored, bounds, lookback, horizon) -> dict:
    """Coverage and pinball skill against the band's quantiles fitted on band_ends (every
    window before the scored ones, as results.json's band is)."""
    actual = metrics.next_candles(prep.ohlc, scored, horizon)
    k = intervals.fit_band_quantiles(prep.ohlc, band_ends, lookback, horizon, LEVELS)
    band = intervals.band_quantiles(k, prep.ohlc, scored, lookback)
    out = {}
    for c, col in enumerate(intervals.COLUMNS):
        a, b, q = actual[..., c], bounds[..., c, :], band[..., c, :]
        inside = (a >= b[..., 0]) & (a <= b[..., 1])
        loss = intervals.pinball(a, b, LEVELS).mean()
        band_loss = intervals.pinball(a, q, LEVELS).mean()
        band_inside = (a >= q[..., 0]) & (a <= q[..., 1])
        out[col] = (inside.mean(), 1 - loss / band_loss, band_inside.mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a finished run's folder")
    parser.add_argument("--config", required=True, help="the run's --config")
    parser.add_argument("--base-url", default="", help="data.base_url of the data to score")
    common.add_records_dir_flag(
        parser, os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
    )
    args = parser.parse_args()
    config = config_lib.load(args.config)
    config.data.base_url = args.base_url or config.data.base_url
    available = saved.available_models(args.workdir)
    names, _ = saved.select_series(available, config.data.symbols, config.data.intervals)
    loaded, trained, _ = saved.load_models(available, names)
    cfg = trained_run.run_config(config, trained, list(loaded))
    preps, _ = trained_run.prepare(cfg, loaded)
    L, H = cfg.data.lookback, cfg.data.horizon
    per_series = [_scores(loaded[n], p, L, H) for n, p in preps.items()]
    rows = []
    for key in per_series[0]:
        row = {"fit on": key[0], "weighting": key[1], "series": len(per_series)}
        for col in COLS:
            cov = np.median([s[key][col][0] for s in per_series])
            skill = np.median([s[key][col][1] for s in per_series])
            band = np.median([s[key][col][2] for s in per_series])
            row[f"{col} coverage"] = f"{100 * cov:.1f}% (band {100 * band:.1f}%)"
            row[f"{col} pinball skill vs band"] = f"{100 * skill:+.2f}%"
        rows.append(row)
    table = common.markdown_table(rows, list(rows[0]))
    title = "Calibrated interval: fit windows and weighting, on val (test reported)"
    common.print_and_record(args.records_dir, "interval_choice", title, table)


if __name__ == "__main__":
    main()
