"""The ablation section of an ablate run's report (results.json's "ablate",
cpbjax/modes/ablate.py): its plain sentences, one table row per setting and one per
covariate gain; shared by the printed summary, report.md and report.html."""

from __future__ import annotations

from cpbjax.report.tables import fmt
from cpbjax.score import ablation

SETTING_HEADERS = (
    "setting",
    "split",
    *(f"{c} vs {ref}%" for c in ablation.JUDGED for ref in ("naive", "band")),
)
GAIN_HEADERS = (
    "gain of all over",
    "split",
    *(f"{c} points (signif./worse of n)" for c in ablation.JUDGED),
)
LEGEND = (
    "Each setting is the same model trained with some covariates set to 0 (all, none, or "
    "without one). Settings: median over series of the skill % against the better naive "
    "forecast and against the volatility band (close has no band). Gains: median over series "
    "of the skill difference in points, and on how many series a one-sided Diebold-Mariano "
    "test of the per-window MAE (lag H-1) finds 'all' better (signif.) or worse (worse) at "
    "p < 0.05. The ranking reads val only; test is reported once."
)


def _points(v) -> str:
    """'+0.8'; a value that rounds to 0 reads '+0.0', never '-0.0'."""
    return "n/a" if v is None else f"{round(v, 1) or 0.0:+.1f}"


def _column_phrase(cell: dict, column: str) -> str:
    """'high +0.8 points, significant on 14 of 20 series (worse on 1)'."""
    worse = f" (significantly worse on {cell['worse_on']})" if cell["worse_on"] else ""
    return (
        f"{column} {_points(cell['median_points'])} points, significant on "
        f"{cell['significant_on']} of {cell['series']} series{worse}"
    )


def _gain_sentence(subject: str, against: str, split_gain: dict, split: str) -> str:
    phrases = "; ".join(_column_phrase(split_gain[c], c) for c in ablation.JUDGED)
    return f"{subject} ({split}): {phrases}, over {against}."


def sentences(ablate: dict) -> list[str]:
    """The verdict in words: the val ranking, then per split (val, then test) each
    covariate's gain over the model without it and all covariates' over none."""
    ranked = ablate["ranked_on_val"]
    lines = [
        "Ablation: covariates ranked on val by their median gain on high and low: "
        f"{', '.join(ranked)}. Test is reported once and chose nothing."
    ]
    for split in ablation.SPLITS:
        for name in ranked:
            gain = ablate["all_over_without"][name][split]
            lines.append(_gain_sentence(name, "the model without it", gain, split))
        gain = ablate["all_over_none"][split]
        lines.append(_gain_sentence("all covariates", "the model with none", gain, split))
    return lines


def setting_rows(results: dict) -> list[list[str]]:
    """One row of SETTING_HEADERS per (setting, split); [] for a run that is no ablation."""
    by_setting = (results.get("ablate") or {}).get("by_setting") or {}
    rows = []
    for name, splits in by_setting.items():
        for split in ablation.SPLITS:
            cells = splits[split]
            values = [cells[c][ref] for c in ablation.JUDGED for ref in ("vs_naive", "vs_band")]
            rows.append(
                [name, split, *(fmt(None if v is None else 100 * v, ".2f") for v in values)]
            )
    return rows


def gain_rows(results: dict) -> list[list[str]]:
    """One row of GAIN_HEADERS per (compared setting, split), in the val ranking."""
    ablate = results.get("ablate") or {}
    if not ablate:
        return []
    compared = {f"without {n}": ablate["all_over_without"][n] for n in ablate["ranked_on_val"]}
    compared["none"] = ablate["all_over_none"]
    rows = []
    for name, gain in compared.items():
        for split in ablation.SPLITS:
            cells = [gain[split][c] for c in ablation.JUDGED]
            rows.append(
                [name, split]
                + [
                    f"{_points(g['median_points'])} ({g['significant_on']}/{g['worse_on']} "
                    f"of {g['series']})"
                    for g in cells
                ]
            )
    return rows
