"""Each tuning series' measures in one evaluation (a results.json or eval-*.json): what
the experiments that score one model several ways (fit_days, fit_windows) compare.

Only tuning pairs are read (cpbjax/data/pairs.py), and only series scored on val.
"""

from __future__ import annotations

import json

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
