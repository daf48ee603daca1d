"""Which fitted baseline should the network correct: the volatility band, HAR, or both?

model.baseline=vol_band makes an untrained model the volatility band; HAR (a band scaled
by day/week/month volatility and the hour of day) is the other fitted baseline every
report scores. This script scores, on the series of a config loaded and split as a train
run loads them, the band, HAR and their geometric mean (the mean of their log forecasts)
as high/low forecasts. Each split is scored with the baselines fitted on the splits
before it (val: train; test: train+val), as results.json's are. It prints the median
over series of the skill (%) against the better naive forecast; choose on val, test is
reported only.

  python experiments/baseline_choice/band_har_mix.py --config configs/gru.py \
      --base-url $MIRROR --symbols BTCUSDT,ETHUSDT
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402
from cpbjax import band  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.modes import plan  # noqa: E402
from cpbjax.score import baselines, metrics  # noqa: E402

METHODS = ("band", "HAR", "geometric mean")


def _forecasts(prep, split, lookback, horizon) -> dict:
    """method -> (high, low) prices [N, H] of `split`'s windows, fitted on the splits before."""
    fit_on, ends = baselines.fit_ends(prep, split), prep.ends[split]
    band_fit = band.fit_vol_band(prep.ohlc, fit_on, lookback, horizon)
    vol_band = band.vol_band_predict(band_fit, prep.ohlc, ends, lookback)
    times, interval = prep.open_time_ms, prep.interval
    har_fit = baselines.fit_har(prep.ohlc, times, interval, fit_on, horizon)
    har = baselines.har_predict(har_fit, prep.ohlc, times, interval, ends, horizon)
    mix = tuple(np.sqrt(b * h) for b, h in zip(vol_band, har, strict=True))
    return dict(zip(METHODS, (vol_band, har, mix), strict=True))


def _skills(prep, split, lookback, horizon) -> dict:
    """method -> (high skill, low skill) against the better naive forecast of each column."""
    ends = prep.ends[split]
    actual_NHC = metrics.next_candles(prep.ohlc, ends, horizon)
    naive = metrics.naive_forecasts(prep.ohlc[ends], horizon)
    out = {}
    for method, pred in _forecasts(prep, split, lookback, horizon).items():
        skills = []
        for c, pred_NH in zip((1, 2), pred, strict=True):
            naive_mae = min(np.abs(n[..., c] - actual_NHC[..., c]).mean() for n in naive.values())
            skills.append(1 - np.abs(pred_NH - actual_NHC[..., c]).mean() / naive_mae)
        out[method] = skills
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "gru.py"))
    parser.add_argument("--base-url", default="", help="data.base_url (a local mirror)")
    parser.add_argument("--symbols", default="", help="comma-separated; default the config's")
    common.add_records_dir_flag(
        parser, os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
    )
    args = parser.parse_args()
    config = config_lib.load(args.config)
    config.data.base_url = args.base_url or config.data.base_url
    if args.symbols:
        config.data.symbols = tuple(args.symbols.split(","))
    preps, _ = plan.prepare_all(config_lib.validate(config))
    L, H = config.data.lookback, config.data.horizon
    per_split = {s: [_skills(p, s, L, H) for p in preps] for s in ("val", "test")}
    rows = []
    for method in METHODS:
        row = {"baseline": method, "series": len(preps)}
        for split, per_series in per_split.items():
            high, low = (np.median([s[method][j] for s in per_series]) for j in (0, 1))
            label = "" if split == "val" else " (reported)"
            row[f"{split} high{label}"] = f"{100 * high:+.2f}"
            row[f"{split} low{label}"] = f"{100 * low:+.2f}"
            row[f"{split} mean{label}"] = f"{50 * (high + low):+.2f}"
        rows.append(row)
    table = common.markdown_table(rows, list(rows[0]))
    title = "Fitted baselines for high/low: band, HAR, their geometric mean"
    common.print_and_record(args.records_dir, "band_har_mix", title, table)


if __name__ == "__main__":
    main()
