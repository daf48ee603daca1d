"""The results of a run as table rows and text lines: shared by the printed table, report.md
and report.html, so every view says the same thing."""

from __future__ import annotations

import statistics

from cpbjax.plots import NOISE_BAND

HEADERS = (
    "series",
    "model",
    "status",
    "epochs",
    "best val",
    "close MAE",
    "MAPE%",
    "naive MAE",
    "skill%",
    "dir%(up%)",
    "DM p",
    "train s",
)


LEGEND = (
    "close MAE and MAPE%: over all test windows and steps; naive MAE: the better of "
    "persistence and last-candle; skill% = 1 - MAE / naive MAE (> 0 beats naive); "
    "dir%(up%): directional accuracy of close, ties excluded, and the share of up-moves "
    "(what always saying 'up' scores); DM p: one-sided Diebold-Mariano p-value of "
    "'model better than naive' on close absolute errors."
)


STATUS_LEGEND = (
    "status: trained = reached train.epochs while its validation loss had improved within "
    "the last train.patience epochs (more epochs might still help); stopped_early = no "
    "validation improvement for train.patience epochs, so early stopping ended it (possibly "
    "on the last epoch); diverged = a non-finite loss ended it. In every case the saved "
    "model and all scores are those of the best validation epoch."
)


SIGNIFICANCE = 0.05


def _fmt(x, spec=".4g", scale=1.0) -> str:
    if x is None:
        return "-"
    return format(x * scale if scale != 1.0 else x, spec)


def _close(entry: dict, split: str = "test") -> dict:
    return ((entry.get(split) or {}).get("columns") or {}).get("close") or {}


def table_rows(results: dict, model_name: str = "-") -> list[list[str]]:
    """One row of formatted cells (HEADERS) per series in results["series"]."""
    rows = []
    for name, entry in sorted(results.get("series", {}).items()):
        test, close = entry.get("test") or {}, _close(entry)
        direction = test.get("direction") or {}
        acc = _fmt(direction.get("accuracy"), ".1f", 100)
        up = _fmt(direction.get("up_share"), ".1f", 100)
        rows.append(
            [
                name,
                str(entry.get("model", model_name)),
                str(entry.get("status", "-")),
                _fmt(entry.get("epochs_run"), "d"),
                _fmt(entry.get("best_val_loss")),
                _fmt(close.get("mae")),
                _fmt(close.get("mape"), ".3f"),
                _fmt(close.get("naive_mae")),
                _fmt(close.get("skill"), "+.2f", 100),
                f"{acc} ({up})",
                _fmt((test.get("dm") or {}).get("p_value_better"), ".3f"),
                _fmt(entry.get("train_seconds"), ".1f"),
            ]
        )
    return rows


def summary_lines(results: dict) -> list[str]:
    """Plain-language facts across series: median skill, how many beat naive, and noise."""
    skills = {n: _close(e).get("skill") for n, e in results.get("series", {}).items()}
    skills = {n: s for n, s in skills.items() if s is not None}
    if not skills:
        return ["No price-space test metrics (no series evaluated, or candle_minmax)."]
    pvals = [
        (results["series"][n].get("test") or {}).get("dm", {}).get("p_value_better") for n in skills
    ]
    sig = sum(p is not None and p < SIGNIFICANCE for p in pvals)
    noise = sum(abs(s) < NOISE_BAND for s in skills.values())
    return [
        f"Close skill against the better naive forecast: median "
        f"{100 * statistics.median(skills.values()):+.2f}%, positive on "
        f"{sum(s > 0 for s in skills.values())} of {len(skills)} series.",
        f"Diebold-Mariano 'model better than naive' at p < {SIGNIFICANCE}: {sig} of "
        f"{len(skills)} series (expect about {SIGNIFICANCE * len(skills):.1f} by chance).",
        f"{noise} of {len(skills)} series have |skill| < {100 * NOISE_BAND:.0f}%, "
        "which on a single series is noise.",
    ]


def baseline_rows(results: dict) -> list[list[str]]:
    """Test skill (%) of model, ridge, volatility band and HAR, per series."""
    rows = []
    for name, entry in sorted(results.get("series", {}).items()):
        test = entry.get("test") or {}
        cols = test.get("columns") or {}
        ridge = test.get("ridge") or {}
        band = (test.get("vol_band") or {}).get("columns") or {}
        har = (test.get("har") or {}).get("columns") or {}
        pct = lambda block, col: _fmt((block.get(col) or {}).get("skill"), "+.2f", 100)
        rows.append(
            [
                name,
                pct(cols, "close"),
                pct(cols, "high"),
                pct(cols, "low"),
                pct(ridge.get("columns") or {}, "close"),
                _fmt((ridge.get("dm") or {}).get("p_value_better"), ".3f"),
                pct(band, "high"),
                pct(band, "low"),
                pct(har, "high"),
                pct(har, "low"),
            ]
        )
    return rows


BASELINE_HEADERS = (
    "series",
    "model close",
    "model high",
    "model low",
    "ridge close",
    "ridge DM p",
    "band high",
    "band low",
    "HAR high",
    "HAR low",
)


def fact_lines(prefix: str, value, skip=("model",)) -> list[str]:
    """Flattens run facts into `- key: value` lines (seconds rounded to 0.1 s).

    `skip` names top-level keys already printed above (the model line).
    """
    if isinstance(value, dict):
        return [
            line
            for k, v in value.items()
            if f"{prefix}{k}" not in skip
            for line in fact_lines(f"{prefix}{k}.", v, skip)
        ]
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    elif isinstance(value, float):
        value = f"{value:.1f}" if prefix.endswith("seconds.") else format(value, ".6g")
    return [f"- {prefix[:-1]}: {value}"]


def data_description(d, results: dict | None = None) -> str:
    """Where the data came from, in words that fit the source (months are Binance's only)."""
    where = f"{len(d.symbols)} symbols x {', '.join(d.intervals)}"
    spans = [e.get("data") or {} for e in (results or {}).get("series", {}).values()]
    firsts, lasts = (
        [s["first"] for s in spans if "first" in s],
        [s["last"] for s in spans if "last" in s],
    )
    span = f", candles {min(firsts)[:10]} .. {max(lasts)[:10]}" if firsts and lasts else ""
    if d.source == "synthetic":
        return (
            f"synthetic (generated offline, {d.synthetic_candles} candles per series, "
            f"newest {d.max_candles} used), {where}{span}"
        )
    if d.source == "local":
        return f"local files in {d.local_dir} (whole files, newest {d.max_candles} candles), {where}{span}"
    end = d.end or "the last complete month"
    return (
        f"binance {d.base_url}, {d.months} monthly files up to {end}, newest "
        f"{d.max_candles} candles, {where}{span}"
    )
