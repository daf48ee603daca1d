"""Would choosing the starting forecast per series on val help: the band or HAR, or the
model, whichever has the best val skill, scored on the test split.

Reads one run's results.json (the tuning pairs' pseudo-test runs of long_val_runs.sh
and decay_runs.sh: test is months after val, and nothing from the confirmation pairs or
2025 is read). Prints one JSON line: per column (high, low), the median over series of
test skill minus the band's, in points, for the model, HAR, the best of the three on val
("pick3") and the better of band and HAR on val ("pick_band_har"), and the share of
series whose val picks HAR of the three.

  python experiments/global_model/baseline_pick.py RUN [RUN...]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

FORECASTS = ("model", "band", "HAR")  # column j of the [S, 3] skill arrays


def skills(entry: dict, split: str, col: str) -> list[float]:
    """[model, band, HAR] skill of one series' split and column (fractions)."""
    e = entry[split]
    return [
        e["columns"][col]["skill"],
        *(e[b]["columns"][col]["skill"] for b in ("vol_band", "har")),
    ]


def picks(results: dict, col: str) -> dict:
    """The medians described in the module docstring for one column."""
    scored = [s for s in results["series"].values() if "val" in s and "test" in s]
    val_S3 = np.array([skills(s, "val", col) for s in scored])
    test_S3 = np.array([skills(s, "test", col) for s in scored])
    rows = np.arange(len(scored))
    best3_S, band_or_har_S = val_S3.argmax(1), 1 + val_S3[:, 1:].argmax(1)

    def vs_band(test_S):
        return round(100 * float(np.median(test_S - test_S3[:, 1])), 2)

    return {
        "series": len(scored),
        "model": vs_band(test_S3[:, 0]),
        "HAR": vs_band(test_S3[:, 2]),
        "pick3": vs_band(test_S3[rows, best3_S]),
        "pick_band_har": vs_band(test_S3[rows, band_or_har_S]),
        "share_HAR": round(float(np.mean(best3_S == 2)), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    for run in p.parse_args().runs:
        with open(os.path.join(run, "results.json")) as f:
            results = json.load(f)
        print(json.dumps({"run": run, **{c: picks(results, c) for c in ("high", "low")}}))


if __name__ == "__main__":
    main()
