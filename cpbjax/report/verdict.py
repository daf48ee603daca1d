"""The verdict of a run in one plain line: per scored column, how far the model's median test
skill stands from the forecast it has to beat, in points (percentage points of skill).

High and low are judged against the fitted volatility band (`vs_band`, the table's "vs band%"), close against the better naive forecast (its "close" skill%). A column every
series leaves to its baseline (model.corrected_columns, eval.column_fallback: the entry's
`baseline_columns`) names that baseline instead of a number, since its skill is 0 by
construction.
"""

from __future__ import annotations

import statistics

from cpbjax.score import metrics

# A median within this many points of 0 reads "level with it": the same 1% that on a single
# series is noise (plots.NOISE_BAND), kept in points here because the verdict speaks in points.
LEVEL_POINTS = 1.0
# The order the verdict reads in: the band's columns first, since they are what a model
# most often adds; then close.
VERDICT_COLUMNS = ("high", "low", "close")
# What each column is judged against, and what a series left to its baseline forecasts.
AGAINST = {"high": "the volatility band", "low": "the volatility band", "close": "naive"}
BASELINE = {"high": "the volatility band", "low": "the volatility band", "close": "the last close"}


def vs_band(test: dict, column: str) -> float | None:
    """The model's skill on `column` (high or low) against the volatility band's MAE."""
    model = ((test.get("columns") or {}).get(column) or {}).get("mae")
    band = (((test.get("vol_band") or {}).get("columns") or {}).get(column) or {}).get("mae")
    return metrics.skill(model, band)


def _skill_against(entry: dict, column: str) -> float | None:
    """One series' test skill on `column` against what the verdict compares it with."""
    test = entry.get("test") or {}
    if column == "close":
        return ((test.get("columns") or {}).get("close") or {}).get("skill")
    return vs_band(test, column)


def points_phrase(points: float, against: str) -> str:
    """'+0.4 points above the volatility band' or '0.2 points below naive (level with it)'."""
    if points == 0:
        return f"level with {against}"
    side = "above" if points > 0 else "below"
    level = " (level with it)" if abs(points) < LEVEL_POINTS else ""
    return f"{abs(points):.1f} points {side} {against}{level}"


def column_phrase(series: dict, column: str) -> str | None:
    """The verdict on one column over `series` (name -> results entry); None when no series
    has a score for it (a run without the band has no high/low verdict)."""
    left = sum(column in (e.get("baseline_columns") or ()) for e in series.values())
    if series and left == len(series):
        return f"{column}: {BASELINE[column]} (the model does not correct it)"
    scores = [s for e in series.values() if (s := _skill_against(e, column)) is not None]
    if not scores:
        return None
    phrase = f"{column}: {points_phrase(100 * statistics.median(scores), AGAINST[column])}"
    if left:  # those series score 0 against their baseline, and pull the median toward it
        phrase += f" ({left} of {len(series)} series forecast it by {BASELINE[column]})"
    return phrase


def verdict_lines(results: dict) -> list[str]:
    """The verdict line, median test skill over series per column in points; [] when no
    column has a score."""
    series = {  # a diverged or unscored series has no test skill: it counts in none
        n: e
        for n, e in (results.get("series") or {}).items()
        if any(_skill_against(e, c) is not None for c in VERDICT_COLUMNS)
    }
    phrases = [p for c in VERDICT_COLUMNS if (p := column_phrase(series, c))]
    if not phrases:
        return []
    head = f"Verdict (median test skill over {len(series)} series, in points): "
    return [head + "; ".join(phrases) + "." + _band_sentence(series)]


def _band_sentence(series: dict) -> str:
    """A plain warning when the model beats the band on neither high nor low (both medians
    <= 0): then its high and low are worth no more than the band's, which is free."""
    medians = []
    for column in ("high", "low"):
        scores = [s for e in series.values() if (s := _skill_against(e, column)) is not None]
        medians.append(statistics.median(scores) if scores else None)
    if None in medians or max(medians) > 0:
        return ""
    return " The model does not beat the band here: its high and low are worth no more."
