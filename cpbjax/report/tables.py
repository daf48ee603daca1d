"""The results of a run as table rows and text lines: shared by the printed table, report.md
and report.html, so every view says the same thing."""

from __future__ import annotations

import math
import statistics

from cpbjax import columns
from cpbjax.report import verdict
from cpbjax.report.plots import NOISE_BAND
from cpbjax.score import intervals

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
    "model and all scores are those of the best validation epoch. With model.baseline the "
    "untrained model is that baseline and counts as epoch 0: no best epoch (-) means no "
    "epoch beat it on validation, so the baseline itself is saved and scored."
)


SIGNIFICANCE = 0.05
SCORED_COLUMNS = ("close", "high", "low")  # the columns a model is judged on


def fmt(x, spec=".4g", scale=1.0) -> str:
    if x is None:
        return "-"
    return format(x * scale if scale != 1.0 else x, spec)


def close_scores(entry: dict, split: str = "test") -> dict:
    """A series entry's scores on close for `split` ({} when it has none)."""
    return ((entry.get(split) or {}).get("columns") or {}).get("close") or {}


def table_rows(results: dict, model_name: str = "-") -> list[list[str]]:
    """One row of formatted cells (HEADERS) per series in results["series"]."""
    rows = []
    for name, entry in sorted(results.get("series", {}).items()):
        test, close = entry.get("test") or {}, close_scores(entry)
        direction = test.get("direction") or {}
        acc = fmt(direction.get("accuracy"), ".1f", 100)
        up = fmt(direction.get("up_share"), ".1f", 100)
        rows.append(
            [
                name,
                str(entry.get("model", model_name)),
                str(entry.get("status", "-")),
                fmt(entry.get("epochs_run"), "d"),
                fmt(entry.get("best_val_loss")),
                fmt(close.get("mae")),
                fmt(close.get("mape"), ".3f"),
                fmt(close.get("naive_mae")),
                fmt(close.get("skill"), "+.2f", 100),
                f"{acc} ({up})",
                fmt((test.get("dm") or {}).get("p_value_better"), ".3f"),
                fmt(entry.get("train_seconds"), ".1f"),
            ]
        )
    return rows


# The printed table: the columns that fit an 80-column terminal (report.md and report.html
# hold every column). The line breaks keep each header as narrow as its numbers.
CONSOLE_HEADERS = (
    "series",
    "kept\nepoch",
    "close\nskill%",
    "high\nskill%",
    "low\nskill%",
    "high vs\nband%",
    "low vs\nband%",
    "close\ncov%",
)

CONSOLE_LEGEND = (
    "skill%: against the better naive forecast (test); vs band%: the model's high/low "
    "against the volatility band's; cov%: test closes inside the calibrated interval; "
    "kept epoch 0: the untrained baseline. Every column: report.md and report.html."
)


def kept_epoch(entry: dict) -> str:
    """The epoch whose model a series kept: its best epoch; "0" when no epoch beat the
    untrained model (the baseline, whose val loss is then best_val_loss); "-" when
    neither (no baseline and no epoch kept, or an entry with no best_epoch at all)."""
    if "best_epoch" not in entry:
        return "-"
    best = entry["best_epoch"]
    if best is not None:
        return str(best)
    untrained = entry.get("best_val_loss")
    return "0" if untrained is not None and math.isfinite(untrained) else "-"


def console_rows(results: dict) -> list[list[str]]:
    """One row of CONSOLE_HEADERS cells per series in results["series"]."""
    rows = []
    for name, entry in sorted(results.get("series", {}).items()):
        test = entry.get("test") or {}
        cols = test.get("columns") or {}
        interval = ((test.get("calibrated_interval") or {}).get("columns") or {}).get("close")
        rows.append(
            [
                name,
                kept_epoch(entry),
                *(fmt((cols.get(c) or {}).get("skill"), "+.2f", 100) for c in SCORED_COLUMNS),
                fmt(verdict.vs_band(test, "high"), "+.2f", 100),
                fmt(verdict.vs_band(test, "low"), "+.2f", 100),
                fmt((interval or {}).get("coverage"), ".1f", 100),
            ]
        )
    return rows


def summary_lines(results: dict) -> list[str]:
    """Plain-language facts across series: median skill, how many beat naive, and noise."""
    skills = {n: close_scores(e).get("skill") for n, e in results.get("series", {}).items()}
    skills = {n: s for n, s in skills.items() if s is not None}
    if not skills:
        return ["No price-space test metrics (no series evaluated)."]
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
        *band_lines(results),
        *fallback_lines(results),
        *interval_lines(results),
        *verdict.verdict_lines(results),  # last: the line a reader looks for after a run
    ]


# What a series that kept its untrained band gives, and what usually changes that.
KEPT_BAND_MEANS = (
    "for those you get the band's forecast (the volatility band for high and low, the last "
    "close for close), and more data or one pooled model over many series "
    "(train.share=pooled) is what usually changes that"
)


def band_lines(results: dict) -> list[str]:
    """How many models kept their untrained band (model.baseline=vol_band, no epoch beat
    it on validation), and what that gives; for a run whose band was refit after training
    (eval.refit_band, cpbjax/score/band_refit.py) counted among the refit ones; for a
    fine-tuned run (train.init_from), how many kept their starting model instead. [] when
    none kept."""
    series = list(results.get("series", {}).values())
    started = [e for e in series if e.get("started_from")]
    if started:  # train.init_from: the bar was the starting model, not the untrained band
        kept = sum(e.get("best_epoch") is None for e in started)
        return [
            f"{len(started)} series started from {started[0]['started_from']} "
            f"(train.init_from); {kept} of them kept that starting model (no epoch beat it "
            "on validation by train.min_delta)."
        ]
    refit = [e for e in series if (e.get("test") or {}).get("band_refit")]
    if refit:
        kept = sum(e.get("best_epoch") is None for e in refit)
        head = (
            f"The volatility band was refit on train+val after training for {len(refit)} "
            f"series; {kept} of them kept the untrained band"
        )
    else:
        kept = sum(kept_epoch(e) == "0" for e in series)
        head = f"{kept} of {len(series)} series kept the untrained band"
    if not kept:
        return [head + "."] if refit else []
    return [f"{head} (no epoch beat it on validation by train.min_delta): {KEPT_BAND_MEANS}."]


def fallback_lines(results: dict) -> list[str]:
    """How many series forecast a column by its baseline (eval.column_fallback: the
    correction was significantly worse on validation, or model.corrected_columns leaves
    the column out), per column; [] when no series decided."""
    decided = [
        e["baseline_columns"] for e in results.get("series", {}).values() if "baseline_columns" in e
    ]
    if not decided:
        return []
    counts = [f"{col} {sum(col in cols for cols in decided)}" for col in columns.COLUMNS]
    return [
        f"Columns forecast by their baseline (persistence for open and close, the band for "
        f"high and low; the correction was significantly worse on validation), "
        f"of {len(decided)} series: {', '.join(counts)}."
    ]


def interval_lines(results: dict) -> list[str]:
    """The calibrated interval on test, median over series: coverage and pinball skill
    against the band's quantiles (cpbjax/score/intervals.py); [] when no series has one."""
    blocks = [
        (e.get("test") or {}).get("calibrated_interval") for e in results.get("series", {}).values()
    ]
    blocks = [b for b in blocks if b]
    if not blocks:
        return []
    lo, hi = blocks[0]["central"]
    each = lambda key, fmt: ", ".join(  # noqa: E731
        f"{col} {_median_pct(blocks, col, key, fmt)}" for col in ("close", "high", "low")
    )
    line = (
        f"Calibrated {100 * (hi - lo):.0f}% interval (q{100 * lo:.0f}-q{100 * hi:.0f}, fitted "
        f"on train+val), median over {len(blocks)} series: test coverage "
        f"{each('coverage', '.1f')}; pinball skill against the band's quantiles "
        f"{each('skill_vs_band', '+.2f')}"
    )
    if all("skill_vs_scaled_band" in b["columns"]["close"] for b in blocks):
        own = each("skill_vs_scaled_band", "+.2f")
        line += f", and against the band with the interval's own scale {own}"
    return [line + "." + _scale_sentence([b.get("scale", intervals.WINDOW_ONLY) for b in blocks])]


def _median_pct(blocks, col: str, key: str, fmt: str) -> str:
    """The median in % of a figure over the series that have it; a flat test span has no
    range, so its skill against the band is 0/0: None, left out ("n/a" if all are)."""
    values = [b["columns"][col][key] for b in blocks if b["columns"][col].get(key) is not None]
    return f"{100 * statistics.median(values):{fmt}}%" if values else "n/a"


def _scale_sentence(scales: list) -> str:
    """How the intervals' volatility scale was blended (intervals.interval_scale)."""
    weights = sorted({s["long_weight"] for s in scales})
    if weights == [0]:
        return " Its scale is the window's EWMA range, as the band's."
    spans = sorted({s["long_candles"] for s in scales if s["long_weight"] > 0})
    span = f"{spans[0]}" if len(spans) == 1 else f"{spans[0]}-{spans[-1]}"
    return (
        f" Its scale blends the window's EWMA range with the mean range of the last {span} "
        f"candles, at weight {'/'.join(f'{w:g}' for w in weights)}."
    )


def baseline_rows(results: dict) -> list[list[str]]:
    """Test skill (%) of model, ridge, volatility band and HAR, per series."""
    rows = []
    for name, entry in sorted(results.get("series", {}).items()):
        test = entry.get("test") or {}
        cols = test.get("columns") or {}
        ridge = test.get("ridge") or {}
        band = (test.get("vol_band") or {}).get("columns") or {}
        har = (test.get("har") or {}).get("columns") or {}
        pct = lambda block, col: fmt((block.get(col) or {}).get("skill"), "+.2f", 100)
        rows.append(
            [
                name,
                pct(cols, "close"),
                pct(cols, "high"),
                pct(cols, "low"),
                pct(ridge.get("columns") or {}, "close"),
                fmt((ridge.get("dm") or {}).get("p_value_better"), ".3f"),
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
    newest = f"newest {d.max_candles}" if d.max_candles else "all"  # 0 = no cap
    if d.source == "synthetic":
        return (
            f"synthetic (generated offline, {d.synthetic_candles} candles per series, "
            f"{newest} used), {where}{span}"
        )
    if d.source == "local":
        return f"local files in {d.local_dir} (whole files, {newest} candles), {where}{span}"
    end = d.end or "the last complete month"
    months = f"{d.months} monthly files" if d.months else "every monthly file"
    return f"binance {d.base_url}, {months} up to {end}, {newest} candles, {where}{span}"
