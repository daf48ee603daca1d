"""--mode backtest's tables (backtest.json): skill per fold over time and pooled over folds."""

from __future__ import annotations

import statistics

from cpbjax.report.tables import SIGNIFICANCE, close_scores, fmt

FOLD_HEADERS = (
    "fold",
    "test from",
    "test to",
    "series",
    "close skill%",
    "high skill%",
    "low skill%",
    "ridge close skill%",
    "DM p<0.05",
)

FOLD_LEGEND = (
    "Per fold (in time order): the test period its series cover, the mean over series of the "
    "test skill against the better naive (ridge: the ridge baseline's, refit on that fold), "
    "and how many series' models beat naive on close at one-sided Diebold-Mariano p < 0.05."
)


def _mean_pct(values) -> str:
    values = [v for v in values if v is not None]
    return fmt(statistics.fmean(values) if values else None, "+.2f", 100)


def _fold_skill(tests: list[dict], column: str) -> str:
    """The mean test skill (%) on `column` of one fold's series."""
    return _mean_pct(((t.get("columns") or {}).get(column) or {}).get("skill") for t in tests)


def fold_rows(backtest: dict) -> list[list[str]]:
    """Skill over time: one row of FOLD_HEADERS per fold index, across series."""
    by_fold: dict = {}
    for entry in backtest.get("series", {}).values():
        for fold in entry.get("folds", []):
            by_fold.setdefault(fold["fold"], []).append(fold.get("test") or {})
    rows = []
    for f, tests in sorted(by_fold.items()):
        scored = [t for t in tests if t]
        ridge = (close_scores({"test": t.get("ridge") or {}}).get("skill") for t in scored)
        p = [(t.get("dm") or {}).get("p_value_better") for t in scored]
        rows.append(
            [
                str(f),
                min((t["first_window_end"] for t in scored), default="-")[:16],
                max((t["last_window_end"] for t in scored), default="-")[:16],
                str(len(tests)),
                *(_fold_skill(scored, c) for c in ("close", "high", "low")),
                _mean_pct(ridge),
                f"{sum(v is not None and v < SIGNIFICANCE for v in p)} of {len(p)}",
            ]
        )
    return rows


POOLED_HEADERS = ("column", "against", "mean skill%", "median skill%", "positive", "panel DM p")

POOLED_LEGEND = (
    "Pooled over every fold's test windows: per series the model's skill against the "
    "reference (the better naive, or a fitted baseline refit per fold), then its mean and "
    "median over series and how many are positive; panel DM p: one-sided Diebold-Mariano "
    "p-value of 'model better', on the cross-series mean of the naive-MAE-scaled loss "
    "differences at each window time (HAC over the concatenated folds), per interval."
)


def pooled_rows(backtest: dict) -> list[list[str]]:
    """One row of POOLED_HEADERS per column (close, high, low) and reference."""
    pooled = (backtest.get("pooled") or {}).get("columns") or {}
    rows = []
    for col, refs in pooled.items():
        for ref, r in refs.items():
            dm = ", ".join(
                f"{iv} {fmt(t.get('p_value_better'), '.3g')}" for iv, t in r["dm"].items()
            )
            rows.append(
                [
                    col,
                    ref,
                    fmt(r["mean_skill"], "+.2f", 100),
                    fmt(r["median_skill"], "+.2f", 100),
                    f"{r['positive']} of {backtest['pooled']['series']}",
                    dm or "-",
                ]
            )
    return rows
