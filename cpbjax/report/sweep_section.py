"""The sweep section of a sweep run's report (results.json's "sweep", cpbjax/modes/sweep.py): the
choice and its ties in words, and one table row per setting; shared by the printed
summary, report.md and report.html."""

from __future__ import annotations

import math

from cpbjax.report.tables import fmt

TIE_RTOL = 1e-6  # Val losses this close are a tie: float32 rounding of the same model.
HEADERS = ("setting", "median val loss", "relative val loss", "chosen by", "lowest on")

LEGEND = (
    "Per setting of the sweep grid: the median over series of its best val loss (train.loss "
    "on the val windows, the only thing the choice reads), its mean val loss relative to each "
    "series' lowest (1 = lowest on every series; sweep.select=pooled takes the lowest), how "
    "many series chose it, and on how many series its val loss is the lowest, ties included."
)


def setting_rows(results: dict) -> list[list[str]]:
    """One row of HEADERS per setting, in grid order; [] for a run that is no sweep."""
    by_setting = (results.get("sweep") or {}).get("by_setting") or {}
    return [
        [
            name,
            fmt(s["median_val_loss"]),
            fmt(s["relative_val_loss"], ".4f"),
            str(s["chosen_by"]),
            str(s["lowest_on"]),
        ]
        for name, s in by_setting.items()
    ]


def choice_lines(results: dict) -> list[str]:
    """The sweep's choice and its ties in words; [] for a run that is no sweep."""
    sweep = results.get("sweep") or {}
    by_setting = sweep.get("by_setting")
    if not by_setting:
        return []
    chosen = ", ".join(f"{n} by {s['chosen_by']}" for n, s in by_setting.items() if s["chosen_by"])
    if sweep.get("select") == "pooled":
        scores = {n: s["relative_val_loss"] for n, s in by_setting.items()}
        scores = {n: v for n, v in scores.items() if v is not None}
        low = min(scores.values(), default=None)
        tied = [n for n, v in scores.items() if math.isclose(v, low, rel_tol=TIE_RTOL)]
        ties = (
            f"; tied at the lowest relative val loss: {', '.join(tied)} (the first in grid "
            "order was taken)"
            if len(tied) > 1
            else ""
        )
        return [f"Sweep choice (sweep.select=pooled, one setting for all): {chosen} series{ties}."]
    tied = sweep.get("tied_series") or []
    lines = [f"Sweep choice (sweep.select=series, by each series' val loss): {chosen} series."]
    if tied:
        lines.append(
            f"{len(tied)} of {sum(s['chosen_by'] for s in by_setting.values())} series had "
            "several settings at their lowest val loss (a tie, equal to 6 digits), so the "
            "first in grid order was taken; a series that kept its untrained baseline ties at "
            f"every setting. Tied: {_some(tied)}."
        )
    return lines


def _some(names: list[str], most: int = 8) -> str:
    """The first `most` names, and how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more
