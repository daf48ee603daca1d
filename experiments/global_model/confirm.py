"""Issue #42's table: the confirmation pairs' test split, reported once per candidate and never
used to choose. Each `--row NAME=WORKDIR[,WORKDIR...]` (one workdir per seed) gives, over
the confirmation series it scored, the median test skill against the better naive
forecast (close, high, low), the median per-series difference of high and low from the
band and HAR on the same windows (points), the series significantly worse than persistence on close
(Diebold-Mariano, one-sided p < 0.05), the calibrated 80% interval's median coverage of
close, and the run's wall seconds (and each stage's, timings.json, median over seeds); the band and HAR rows come from the first workdir's
fitted baselines on the same windows. `--anchor FILE` adds anchor.py's JSON row.

  python experiments/global_model/confirm.py --row "global=runs/c/global-0,runs/c/global-1" ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cpbjax.data import pairs  # noqa: E402

COLUMNS = ("close", "high", "low")


def confirmation_entries(workdir: str) -> dict:
    """series name -> results.json entry, for the confirmation pairs' scored series."""
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    return {
        name: e
        for name, e in results["series"].items()
        if name.split("-")[0] in pairs.CONFIRMATION_SYMBOLS and e.get("test")
    }


def median_skill(entries: dict, col: str, block: str | None = None) -> float:
    values = []
    for e in entries.values():
        test = e["test"]
        cols = test[block]["columns"] if block else test["columns"]
        values.append(cols[col]["skill"])
    return round(100 * statistics.median(values), 2)


def median_gain(entries: dict, col: str, block: str) -> float:
    """Median over series of the model's skill less the fitted baseline's, in points."""
    gains = [
        e["test"]["columns"][col]["skill"] - e["test"][block]["columns"][col]["skill"]
        for e in entries.values()
    ]
    return round(100 * statistics.median(gains), 2)


def seed_row(workdir: str) -> dict:
    entries = confirmation_entries(workdir)
    with open(os.path.join(workdir, "results.json")) as f:
        wall = json.load(f)["run"].get("wall_seconds")
    coverage = [
        e["test"]["calibrated_interval"]["columns"]["close"]["coverage"]
        for e in entries.values()
        if e["test"].get("calibrated_interval")
    ]
    return {
        "series": len(entries),
        **{col: median_skill(entries, col) for col in COLUMNS},
        **{
            f"{col}-{short}": median_gain(entries, col, block)
            for col in ("high", "low")
            for block, short in (("vol_band", "band"), ("har", "HAR"))
        },
        "worse": sum((e["test"]["dm"].get("p_value_better") or 0) > 0.95 for e in entries.values()),
        "coverage": round(100 * statistics.median(coverage), 1) if coverage else None,
        "wall_s": round(wall) if wall else None,
    }


def baseline_rows(workdir: str) -> list[dict]:
    entries = confirmation_entries(workdir)
    return [
        {
            "row": name,
            "series": len(entries),
            "close": 0.0,
            **{c: median_skill(entries, c, block) for c in ("high", "low")},
        }
        for name, block in (("band", "vol_band"), ("HAR", "har"))
    ]


def stages(workdirs: list[str]) -> dict:
    """Median over the workdirs of each stage's seconds in timings.json, and the wall."""
    runs = []
    for w in workdirs:
        with open(os.path.join(w, "timings.json")) as f:
            runs.append(json.load(f))
    out = {k: round(statistics.median(r["stages"][k] for r in runs), 1) for k in runs[0]["stages"]}
    out["driver"] = round(statistics.median(r["driver_seconds"] for r in runs), 1)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", action="append", required=True, help="NAME=WORKDIR[,WORKDIR...]")
    p.add_argument("--anchor", help="anchor.py's JSON output on the confirmation test split")
    args = p.parse_args()
    rows = []
    for i, spec in enumerate(args.row):
        name, _, dirs = spec.partition("=")
        workdirs = dirs.split(",")
        if i == 0:
            rows += baseline_rows(workdirs[0])
        rows += [{"row": name, "seed": s, **seed_row(w)} for s, w in enumerate(workdirs)]
        rows.append({"row": name, "stage_seconds_median": stages(workdirs)})
    if args.anchor:
        with open(args.anchor) as f:
            anchor = json.load(f)
        rows.append({"row": "LightGBM anchor", **anchor["lightgbm"], "series": anchor["series"]})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
