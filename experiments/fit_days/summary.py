"""The tables of experiments/fit_days: per eval.fit_days setting, medians over the tuning
series of what the band refit and the calibrated interval change, on val and on test,
then each setting against 0 (every window) series by series.

  python experiments/fit_days/summary.py runs/fit_days [--days 0,730,365,180,90]

Reads <runs>/eval-<days>.json (runs.sh) and <runs>/seconds.tsv. Only tuning pairs are
read (cpbjax/data/pairs.py); the model was trained on them alone. In points:
  high / low vs band: 100 * (1 - model MAE / fitted volatility band MAE) of that column;
  cov err: |coverage - 80%| of the calibrated interval (mean of close, high, low);
  pinball: the interval's pinball skill against the band's quantiles (mean of the three).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.tuning_rows import SPLITS, better_worse, evaluations, write_jsonl  # noqa: E402

COLUMNS = ("close", "high", "low")
MEASURES = ("high vs band", "low vs band", "cov err", "pinball")


def _measures(scores: dict) -> dict:
    band = scores["vol_band"]["columns"]
    interval = scores["calibrated_interval"]["columns"]
    row = {
        f"{c} vs band": 100 * (1 - scores["columns"][c]["mae"] / band[c]["mae"])
        for c in ("high", "low")
    }
    row["cov err"] = statistics.mean(abs(interval[c]["coverage"] - 0.8) * 100 for c in COLUMNS)
    row["pinball"] = statistics.mean(interval[c]["skill_vs_band"] * 100 for c in COLUMNS)
    return row


def _paired(rows: dict, every: dict, split: str, measure: str) -> str:
    """The median change against every window and the series it made better / worse."""
    diffs = [rows[s][split][measure] - every[s][split][measure] for s in every]
    better, worse = better_worse(diffs, lower_is_better=measure == "cov err")
    return f"{statistics.median(diffs):+.3f} ({better}/{worse})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("--days", default="0,730,365,180,90")
    parser.add_argument("--jsonl", help="also write each series' measures here, a line each")
    args = parser.parse_args(argv)
    days = args.days.split(",")
    rows, seconds = evaluations(args.runs, days, _measures)
    head = [f"{split} {m}" for split in SPLITS for m in MEASURES]
    print("| fit_days | series | " + " | ".join(head) + " | evaluate s |")
    print("|---" * (len(head) + 3) + "|")
    for d in days:
        cells = [
            f"{statistics.median(r[s][m] for r in rows[d].values()):+.3f}"
            for s in SPLITS
            for m in MEASURES
        ]
        print(f"| {d} | {len(rows[d])} | " + " | ".join(cells) + f" | {seconds.get(d, '?')} |")
    print("\nAgainst fit_days 0, series by series: median change (better / worse series)\n")
    print("| fit_days | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for d in days[1:]:
        cells = [_paired(rows[d], rows[days[0]], s, m) for s in SPLITS for m in MEASURES]
        print(f"| {d} | " + " | ".join(cells) + " |")
    if args.jsonl:
        write_jsonl(args.jsonl, "fit_days", rows, float)


if __name__ == "__main__":
    main()
