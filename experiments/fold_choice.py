"""Chooses between runs on earlier backtest folds, never on the test split.

A train run's val scores come from the very windows its early stopping read, which
flatters them, and flatters 40 per-series models (40 choices of epoch) more than one
pooled model (one choice); one val split is also one period, whose medians are noisy. A backtest's earlier folds are scored out of sample: fold f's model
never saw its test block, which lies before the last fold's, and with the default step
the last fold is the train run's split. So, for `--mode backtest` workdirs of the same
series and folds (one per candidate):

  python experiments/fold_choice.py series=runs/bt/series pooled=runs/bt/pooled

prints per candidate
  - choice: per earlier fold, the median over the series every candidate scored in that
    fold of the test skill (%) of close, high and low against the better naive
    forecast; and their mean over columns and folds, the number to choose by;
  - reported only (the last fold, the train run's test split): the median skill per
    column, the series significantly worse / better than persistence on close
    (Diebold-Mariano, one-sided p < 0.05), and the band's and HAR's median skill on
    high and low on the same windows.
A record of the table goes to experiments/records/fold_choice-<UTC time>.md (-2, -3, ... when one of that minute exists).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

COLUMNS = ("close", "high", "low")
BASELINES = ("vol_band", "har")  # fitted baselines refit per fold (results.json blocks)
RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")


def fold_entries(workdir: str) -> dict[int, dict]:
    """fold -> series name -> its scored fold entry, from <workdir>/backtest.json."""
    with open(os.path.join(workdir, "backtest.json")) as f:
        series = json.load(f)["series"]
    out: dict[int, dict] = {}
    for name, entry in series.items():
        for fold in entry["folds"]:
            if fold.get("test"):
                out.setdefault(fold["fold"], {})[name] = fold
    return out


def median_pct(values) -> float:
    return round(100 * statistics.median(values), 2)


def skills(entries: list, block: str | None = None, cols=COLUMNS) -> dict:
    """column -> median test skill (%) of the model (block None) or a fitted baseline."""
    pick = (lambda e: e["test"][block]["columns"]) if block else (lambda e: e["test"]["columns"])
    return {c: median_pct([pick(e)[c]["skill"] for e in entries]) for c in cols}


def rows(runs: dict[str, str]) -> list[dict]:
    """One row per candidate: its earlier folds' medians (the choice) and the last fold."""
    folds = {name: fold_entries(wd) for name, wd in runs.items()}
    all_folds = sorted(set.intersection(*(set(f) for f in folds.values())))
    earlier, last = all_folds[:-1], all_folds[-1]
    common = {f: sorted(set.intersection(*(set(folds[n][f]) for n in runs))) for f in all_folds}
    out = []
    for name in runs:
        chosen = {f: skills([folds[name][f][s] for s in common[f]]) for f in earlier}
        fitted = {
            f: {
                b: skills([folds[name][f][s] for s in common[f]], b, ("high", "low"))
                for b in BASELINES
            }
            for f in earlier
        }
        final = [folds[name][last][s] for s in common[last]]
        p_better = [e["test"]["dm"]["p_value_better"] for e in final]
        out.append(
            {
                "candidate": name,
                "series": {f: len(common[f]) for f in all_folds},
                "folds": chosen,
                "fitted": fitted,
                "choice": round(statistics.mean(v for d in chosen.values() for v in d.values()), 2),
                "last": skills(final),
                "worse": sum(p > 0.95 for p in p_better),
                "better": sum(p < 0.05 for p in p_better),
                "band": skills(final, "vol_band", ("high", "low")),
                "har": skills(final, "har", ("high", "low")),
            }
        )
    return out


def markdown(table: list[dict]) -> str:
    earlier = list(table[0]["folds"])
    head = ["candidate", "series per fold"]
    head += [f"fold {f} {c}" for f in earlier for c in COLUMNS] + ["**choice**"]
    head += [f"last fold {c}" for c in COLUMNS]
    head += ["close DM worse", "close DM better", "band high", "band low", "HAR high", "HAR low"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["candidate"], "/".join(str(n) for n in r["series"].values())]
        cells += [f"{r['folds'][f][c]:+.2f}" for f in earlier for c in COLUMNS]
        cells += [f"**{r['choice']:.2f}**"] + [f"{r['last'][c]:+.2f}" for c in COLUMNS]
        cells += [str(r["worse"]), str(r["better"])]
        cells += [f"{r[b][c]:+.2f}" for b in ("band", "har") for c in ("high", "low")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def baselines_markdown(row: dict) -> str:
    """The fitted baselines' medians on the earlier folds (the same for every candidate
    where the series scored are the same): what the choice columns are worth."""
    lines = ["| fold | band high | band low | HAR high | HAR low |", "|---|---|---|---|---|"]
    for f, fitted in row["fitted"].items():
        cells = [f"{fitted[b][c]:+.2f}" for b in BASELINES for c in ("high", "low")]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=BACKTEST_WORKDIR, one per candidate")
    args = parser.parse_args()
    bad = [
        r
        for r in args.runs
        if "=" not in r or not os.path.isfile(os.path.join(r.split("=", 1)[1], "backtest.json"))
    ]
    if bad:
        parser.error(f"not NAME=WORKDIR of a finished backtest (no backtest.json): {bad[0]!r}")
    runs = dict(r.split("=", 1) for r in args.runs)
    table = rows(runs)
    table = (
        markdown(table)
        + "\n\nFitted baselines on the earlier folds:\n\n"
        + baselines_markdown(table[0])
    )
    # write_record names it by the UTC minute and never overwrites: a second choice in
    # the same minute gets -2.
    common.print_and_record(RECORDS, "fold_choice", "Choice on earlier backtest folds", table)


if __name__ == "__main__":
    main()
