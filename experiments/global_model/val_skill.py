"""The tuning pairs' validation scores of launch.py workdirs, the only figures issue #42's
choices are made on: per workdir, the median over series of the val skill against the
better naive forecast (close, high, low) and the median per-series difference of high
and low from the volatility band and HAR on the same windows, in points. Test is not read.

  python experiments/global_model/val_skill.py runs/gm/<name> [...]
"""

from __future__ import annotations

import json
import os
import statistics
import sys

COLUMNS = ("close", "high", "low")


def skill(entry: dict, block: str | None, col: str):
    val = entry["val"]
    cols = (val.get(block) or {}).get("columns", {}) if block else val["columns"]
    return (cols.get(col) or {}).get("skill")


def row(workdir: str) -> dict:
    with open(os.path.join(workdir, "results.json")) as f:
        series = [e for e in json.load(f)["series"].values() if e.get("val")]
    out = {"run": os.path.basename(workdir.rstrip("/")), "series": len(series)}
    for col in COLUMNS:
        out[col] = round(100 * statistics.median(skill(e, None, col) for e in series), 2)
    for col in ("high", "low"):
        for block, short in (("vol_band", "band"), ("har", "har")):
            diffs = [skill(e, None, col) - skill(e, block, col) for e in series]
            out[f"{col}-{short}"] = round(100 * statistics.median(diffs), 2)
    kept = [e.get("best_epoch") for e in series]
    out["kept_epoch"] = max((k for k in kept if k is not None), default=None)
    return out


if __name__ == "__main__":
    for workdir in sys.argv[1:]:
        print(json.dumps(row(workdir)))
