"""Each tuning series' measures in evaluations of one model scored several ways: what the
experiments fit_days and fit_windows read and compare, each from <runs>/eval-<setting>.json
(a results.json) and <runs>/seconds.tsv (setting, wall seconds of its evaluation).

Only tuning pairs are read (cpbjax/data/pairs.py), and only series scored on val.
"""

from __future__ import annotations

import json
import os

from cpbjax.data import pairs

SPLITS = ("val", "test")


def tuning_rows(path: str, measures) -> dict:
    """series -> split -> measures(that split's results.json scores), tuning series only."""
    with open(path) as f:
        results = json.load(f)
    return {
        name: {split: measures(entry[split]) for split in SPLITS}
        for name, entry in results["series"].items()
        if name.split("-")[0] in pairs.TUNING_SYMBOLS and "val" in entry
    }


def evaluations(runs: str, settings: list[str], measures) -> tuple[dict, dict]:
    """(setting -> its `tuning_rows`, setting -> its evaluation's seconds as written)."""
    with open(os.path.join(runs, "seconds.tsv")) as f:
        seconds = dict(line.strip().split("\t") for line in f)
    rows = {s: tuning_rows(os.path.join(runs, f"eval-{s}.json"), measures) for s in settings}
    return rows, seconds


def better_worse(diffs, lower_is_better: bool = False) -> tuple[int, int]:
    """(series a setting made better, series it made worse) from their changes `diffs`."""
    sign = -1 if lower_is_better else 1
    return sum(sign * d > 0 for d in diffs), sum(sign * d < 0 for d in diffs)


def write_jsonl(path: str, field: str, rows: dict, value) -> None:
    """Each series' measures of each setting, a line each: {field: value(setting),
    "series": name, **measures}."""
    with open(path, "w") as out:
        for setting, by_series in rows.items():
            for name, row in by_series.items():
                out.write(json.dumps({field: value(setting), "series": name, **row}) + "\n")
