"""The accuracy levers of issue #13, each on and off, chosen on validation, test only reported.

  python experiments/ablation.py RUNS_DIR --config configs/gru.py \
      --lever base= --lever mae="--config.train.loss=mae --config.train.loss_scale=persistence" \
      -- --config.data.base_url=$MIRROR --config.eval.plots=False

Each `--lever NAME=FLAGS` is one launch.py run in RUNS_DIR/NAME (resumed if it is there
already), with the flags after `--` shared by all. Then one markdown row per lever:
  - choice (validation split): the median val skill of close, high and low against the
    better naive forecast, and their mean, the number the default is chosen by;
  - reported (test split, never used to choose): the median test skill per column, how
    many series are significantly worse than naive on close (Diebold-Mariano, one-sided
    p < 0.05), and the fitted baselines' median test skill on high and low on the same
    windows (volatility band, and HAR where the run reports it).
A record of the table goes to experiments/records/ablation-<UTC time>.md (-2, -3, ... when
one of that minute exists: two ablations finishing in one minute keep both records).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

# New records go to experiments/records/; file each under the experiment it answers.
RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
COLUMNS = ("close", "high", "low")


def _median_pct(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(100 * statistics.median(values), 2) if values else None


def _skills(entries, split, block=None):
    """column -> median skill (%) of the model (block None) or a fitted baseline."""
    out = {}
    for col in COLUMNS:
        vals = []
        for e in entries:
            cols = (e[split].get(block) or {}).get("columns", {}) if block else e[split]["columns"]
            vals.append((cols.get(col) or {}).get("skill"))
        out[col] = _median_pct(vals)
    return out


def summarise(name: str, workdir: str) -> dict:
    """One row of the table from <workdir>/results.json."""
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    return summarise_entries(name, results["series"])


def summarise_entries(name: str, series: dict) -> dict:
    """One row of the table from results.json-shaped series entries (name -> entry)."""
    scored = [e for e in series.values() if e.get("test") and e.get("val")]
    val, test = _skills(scored, "val"), _skills(scored, "test")
    worse = sum((e["test"]["dm"].get("p_value_better") or 0) > 0.95 for e in scored)
    return {
        "lever": name,
        "series": len(scored),
        "val": val,
        "val_mean": round(statistics.mean(v for v in val.values() if v is not None), 2),
        "test": test,
        "close_dm_worse": worse,
        "band": _skills(scored, "test", "vol_band"),
        "har": _skills(scored, "test", "har"),
    }


def table(rows: list[dict]) -> str:
    head = (
        "| lever | series | val close | val high | val low | **val mean** | test close | "
        "test high | test low | close DM worse | band high | band low | HAR high | HAR low |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        cells = [r["lever"], r["series"], *r["val"].values(), f"**{r['val_mean']}**"]
        cells += [*r["test"].values(), r["close_dm_worse"], r["band"]["high"], r["band"]["low"]]
        cells += [r["har"]["high"], r["har"]["low"]]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("--config", required=True)
    parser.add_argument("--lever", action="append", required=True, help="NAME=FLAGS")
    args, shared = parser.parse_known_args()
    shared = [a for a in shared if a != "--"]
    rows = []
    for lever in args.lever:
        name, _, flags = lever.partition("=")
        workdir = os.path.join(args.runs, name)
        cmd = [sys.executable, "launch.py", "--config", args.config, "--workdir", workdir]
        subprocess.run(cmd + shlex.split(flags) + shared, check=True)
        rows.append(summarise(name, workdir))
    common.print_and_record(RECORDS, "ablation", "Accuracy levers", table(rows))


if __name__ == "__main__":
    main()
