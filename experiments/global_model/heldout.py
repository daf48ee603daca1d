"""Two runs' skill on a held-out span of their test forecasts: the second half of a val
fold, or a span of months after it.

A fold's early stopping sees the first half of its val span (data.split_dates=(V0, V1));
this scores the windows whose targets all lie before END (and whose first one opens at
or after START, if given), i.e. [V1 or START, END), from each run's
forecasts/<SERIES>.npz (eval.save_forecasts=True), with the product's own metrics
(metrics.score_prices: skill against the better naive forecast in price units). Prints
one JSON line: per column the median over series of B's skill minus A's, in points.

  python experiments/global_model/heldout.py RUN_A RUN_B --end 2024-05 [--start 2024-04]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cpbjax.score import metrics  # noqa: E402

COLS = ("high", "low", "close")


def held_out_skills(run: str, end_ms: int, start_ms: int = 0) -> dict:
    """series -> column -> skill (%) on the windows whose targets open in [start_ms, end_ms)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run, "forecasts", "*.npz"))):
        f = np.load(path)
        opens = f["target_open_time_ms"]
        keep = (opens.max(axis=1) < end_ms) & (opens.min(axis=1) >= start_ms)
        if keep.sum() < 100:  # too few windows to score (a series that starts later)
            continue
        scored = metrics.score_prices(
            f["last_candle"][keep], f["actual"][keep], f["predicted"][keep]
        )
        out[str(f["series"])] = {c: 100 * scored["columns"][c]["skill"] for c in COLS}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--end", required=True, help="YYYY-MM: the held-out span's end")
    p.add_argument("--start", default="", help="YYYY-MM: its start (default: the test split's)")
    args = p.parse_args()
    end_ms = int(np.datetime64(args.end, "ms").astype(np.int64))
    start_ms = int(np.datetime64(args.start, "ms").astype(np.int64)) if args.start else 0
    a = held_out_skills(args.run_a, end_ms, start_ms)
    b = held_out_skills(args.run_b, end_ms, start_ms)
    both = sorted(set(a) & set(b))
    row = {"a": args.run_a, "b": args.run_b, "start": args.start, "end": args.end}
    row["series"] = len(both)
    for c in COLS:
        row[f"{c} b-a"] = round(float(np.median([b[s][c] - a[s][c] for s in both])), 2)
        row[f"{c} a"] = round(float(np.median([a[s][c] for s in both])), 2)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
