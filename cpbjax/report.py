"""The run report: a printed rich table, <workdir>/report.md, report.html and PNG plots.

The figures are drawn by cpbjax/plots.py; report.html (cpbjax/report_html.py) holds
the same content as report.md with every figure inlined, in one file.
"""

from __future__ import annotations

import os
import statistics

from absl import logging
from rich.console import Console
from rich.table import Table

from cpbjax import forecast, writers
from cpbjax import workdir as workdir_lib
from cpbjax.plots import (  # noqa: F401  (loss_curves and plot_* are re-exported)
    NOISE_BAND,
    loss_curves,
    plot_forecasts,
    plot_loss,
    plot_name,
    plot_skill,
)

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
MIN_WIDTH = 160  # Console columns when not on a terminal (CI logs): keep rows on one line.
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
    """Test skill (%) of model, ridge and volatility band, per series."""
    rows = []
    for name, entry in sorted(results.get("series", {}).items()):
        test = entry.get("test") or {}
        cols = test.get("columns") or {}
        ridge = test.get("ridge") or {}
        band = (test.get("vol_band") or {}).get("columns") or {}
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
)


def print_table(results: dict, model_name: str = "-", console: Console | None = None) -> None:
    """Prints the per-series table, the summary and the skipped series."""
    table = Table(title="cpbjax results (test split, prices)")
    for header in HEADERS:
        table.add_column(
            header, justify="left" if header in ("series", "model", "status") else "right"
        )
    for row in table_rows(results, model_name):
        table.add_row(*row)
    if console is None:
        console = Console()
        if not console.is_terminal:
            console.width = max(console.width, MIN_WIDTH)
    console.print(table)
    for line in summary_lines(results):
        console.print(line)
    for name, reason in sorted(results.get("skipped", {}).items()):
        console.print(f"skipped {name}: {reason}")


# ---------------------------------------------------------------------------
# report.md


def _md_table(headers, rows) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


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


def render_markdown(results: dict, config, plots: list[str], title: str = "cpbjax report") -> str:
    """The report.md text: run facts, summary, results table, baselines, skipped series, plots."""
    model = config.model.name
    d = config.data
    lines = [f"# {title}", "", "The .html file beside this one shows all of it on one page.", ""]
    lines += ["## Run", ""]
    lines += [
        f"- model: {model} ({config.model.decoding}), lookback {d.lookback} -> "
        f"horizon {d.horizon}, normalization {d.normalization}",
        f"- data: {data_description(d, results)}",
    ]
    lines += fact_lines("", results.get("run") or {})
    lines += ["", "## Summary", "", *[f"- {s}" for s in summary_lines(results)], ""]
    lines += ["## Results (test split, price units)", ""]
    lines += _md_table(HEADERS, table_rows(results, model))
    lines += ["", LEGEND, "", STATUS_LEGEND, ""]
    lines += ["## Baselines: test skill % against the better naive forecast", ""]
    lines += _md_table(BASELINE_HEADERS, baseline_rows(results))
    lines += ["", "Ridge and band are fitted on train+val only (see cpbjax/baselines.py).", ""]
    skipped = results.get("skipped") or {}
    if skipped:
        lines += ["## Skipped series", ""]
        lines += [f"- {name}: {reason}" for name, reason in sorted(skipped.items())] + [""]
    return "\n".join(lines + _md_plots(plots))


def _md_plots(plots: list[str]) -> list[str]:
    """The plots, the skill chart first, then one sub-heading per series."""
    if not plots:
        return []
    lines, current = ["## Plots", ""], None
    for p in plots:
        stem = os.path.basename(p)[:-4]
        series = stem.partition("-")[2] if stem.startswith(("loss-", "forecast-")) else None
        if series and series != current:
            lines += ["", f"### {series}", ""]
            current = series
        lines.append(f"![{os.path.basename(p)}]({p})")
    return lines + [""]


# ---------------------------------------------------------------------------
# Plots (drawn by cpbjax/plots.py) and the report files.


def _read_forecasts(workdir: str, name: str) -> dict | None:
    path = workdir_lib.forecasts_file(workdir, name)
    return forecast.load_forecasts(path) if os.path.exists(path) else None


def write_plots(folder, results, config, history, forecasts) -> list[str]:
    """Writes skill.png, then loss-<series>.png and forecast-<series>.png of each series;
    returns their paths in that order."""
    os.makedirs(folder, exist_ok=True)
    series = results.get("series", {})
    skill = plot_skill(os.path.join(folder, plot_name("skill")), results)
    paths = [skill] if skill else []
    curves = loss_curves(history)
    for name, entry in sorted(series.items()):
        if name in curves:
            path = os.path.join(folder, plot_name("loss", name))
            best, status = entry.get("best_epoch"), entry.get("status")
            paths.append(plot_loss(path, name, *curves[name], best_epoch=best, status=status))
        if not config.eval.plot_windows:
            continue
        record = forecasts.get(name)
        if record is None:
            logging.info("no test forecasts of %s to plot", name)
            continue
        path = os.path.join(folder, plot_name("forecast", name))
        paths.append(plot_forecasts(path, record, config.eval.plot_windows, config.data.lookback))
    return paths


def write_reports(
    workdir, results, config, history=None, forecasts=None, stem="report", console=None
) -> str:
    """Prints the results table and writes <workdir>/<stem>.md, <stem>.html and the plots.

    Args:
      workdir: the run folder.
      results: the results.json dict ({"run", "series", "skipped"}).
      config: the run config (model name, data facts, eval.plots, eval.plot_windows).
      history: metrics.jsonl records; None reads <workdir>/metrics.jsonl.
      forecasts: series name -> `forecast.forecast_record(...)` of its test windows;
        series missing here are read from <workdir>/forecasts/<name>.npz if saved.
      stem: report name; plots go to <workdir>/plots/ for "report", otherwise to
        <workdir>/plots/<stem>/ (so an evaluation never overwrites the run's plots).
      console: the rich Console to print to (default: stdout).

    Returns:
      The path of the markdown report (the HTML one is workdir.report_html(workdir, stem)).
    """
    print_table(results, config.model.name, console)
    plots = []
    if config.eval.plots:
        folder = workdir_lib.plots_dir(workdir, stem)
        if history is None:
            history = writers.MetricsLog(workdir).records()
        forecasts = dict(forecasts or {})
        for name in results.get("series", {}):
            if name not in forecasts:
                forecasts[name] = _read_forecasts(workdir, name)
        plots = write_plots(folder, results, config, history, forecasts)
    path = workdir_lib.report_md(workdir, stem)
    rel = [os.path.relpath(p, workdir) for p in plots]
    writers.atomic_write(path, render_markdown(results, config, rel, title=f"cpbjax {stem}"))
    from cpbjax import report_html  # noqa: PLC0415 (it builds on this module's tables)

    page = report_html.render_html(results, config, plots, title=f"cpbjax {stem}")
    writers.atomic_write(workdir_lib.report_html(workdir, stem), page)
    return path
