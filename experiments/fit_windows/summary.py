"""The tables of experiments/fit_windows: per eval.fit_windows cap, each measure's change
against every window (cap 0), series by series, on val and on the tuning pairs' test
spans, and whether the cap passes the rule fixed before the runs (README.md).

  python experiments/fit_windows/summary.py runs/fit_windows [--caps 0,50000,20000,10000,5000]

Reads <runs>/eval-<cap>.json (runs.sh) and <runs>/seconds.tsv. Only tuning pairs are
read (cpbjax/data/pairs.py); the model was trained on them alone. Measures, in points:
  model / band / HAR high and low, ridge close: the column's skill against the better
    naive forecast (the naive forecasts read no fit, so every cap shares them);
  cov err: |coverage - 80%| of the calibrated interval (mean of close, high, low);
  pinball: 100 * (1 - the interval's pinball / every window's), mean of the three.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from experiments.tuning_rows import SPLITS, better_worse, evaluations, write_jsonl  # noqa: E402

COLUMNS = ("close", "high", "low")
SKILLS = {  # measure -> (the block of a split's scores, or None for the model's; column)
    "model high": (None, "high"),
    "model low": (None, "low"),
    "band high": ("vol_band", "high"),
    "band low": ("vol_band", "low"),
    "HAR high": ("har", "high"),
    "HAR low": ("har", "low"),
    "ridge close": ("ridge", "close"),
}
MEASURES = (*SKILLS, "cov err", "pinball")
# The rule (README.md): every measure's median change at least this (cov err: at most
# COV_ERR_MAX), and no measure worse on significantly more series than better.
MEDIAN_MIN, COV_ERR_MAX, SIGN_P = -0.01, 0.1, 0.01


def _measures(scores: dict) -> dict:
    row = {}
    for measure, (block, col) in SKILLS.items():
        cols = scores["columns"] if block is None else scores[block]["columns"]
        row[measure] = 100 * cols[col]["skill"]
    interval = scores["calibrated_interval"]["columns"]
    row["cov err"] = statistics.mean(abs(interval[c]["coverage"] - 0.8) * 100 for c in COLUMNS)
    row["pinball raw"] = statistics.mean(interval[c]["pinball"] for c in COLUMNS)
    return row


def _changes(rows: dict, every: dict, split: str, measure: str) -> list[float]:
    """Each series' change against every window (positive: better, but for cov err)."""
    if measure == "pinball":
        return [
            100 * (1 - rows[s][split]["pinball raw"] / every[s][split]["pinball raw"])
            for s in every
        ]
    return [rows[s][split][measure] - every[s][split][measure] for s in every]


def sign_p(worse: int, better: int) -> float:
    """One-sided sign test: P(at least `worse` of worse + better fair coin flips)."""
    n = worse + better
    return sum(math.comb(n, k) for k in range(worse, n + 1)) / 2**n if n else 1.0


def verdict(diffs: list[float], measure: str) -> tuple[str, bool]:
    """(the cell: median change (better / worse series), whether it passes the rule)."""
    better, worse = better_worse(diffs, lower_is_better=measure == "cov err")
    median = statistics.median(diffs)
    ok = median <= COV_ERR_MAX if measure == "cov err" else median >= MEDIAN_MIN
    ok = ok and sign_p(worse, better) >= SIGN_P
    return f"{median:+.3f} ({better}/{worse}){'' if ok else ' ✗'}", ok


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("--caps", default="0,50000,20000,10000,5000")
    parser.add_argument("--jsonl", help="also write each series' measures here, a line each")
    args = parser.parse_args(argv)
    caps = args.caps.split(",")
    rows, seconds = evaluations(args.runs, caps, _measures)
    every = rows[caps[0]]
    print(
        f"{len(every)} tuning series; `--mode evaluate` seconds: "
        + ", ".join(f"{c}: {seconds.get(c, '?')}" for c in caps)
    )
    for split in SPLITS:
        print(
            f"\n{split}: median change against every window (better / worse series); "
            "✗ fails the rule\n"
        )
        print("| fit_windows | " + " | ".join(MEASURES) + " | passes |")
        print("|---" * (len(MEASURES) + 2) + "|")
        for cap in caps[1:]:
            cells = [verdict(_changes(rows[cap], every, split, m), m) for m in MEASURES]
            passes = all(ok for _, ok in cells)
            print(f"| {cap} | " + " | ".join(c for c, _ in cells) + f" | {passes} |")
    if args.jsonl:
        write_jsonl(args.jsonl, "fit_windows", rows, int)


if __name__ == "__main__":
    main()
