"""The run report: a printed rich table, <workdir>/report.md, report.html and PNG plots.

The figures are drawn by cpbjax/report/plots.py; report.html (cpbjax/report/html_page.py) holds
the same content as report.md with every figure inlined, in one file.
"""

from __future__ import annotations

import os
import shutil
from typing import NamedTuple

from absl import logging
from rich import box
from rich.console import Console
from rich.table import Table

from cpbjax import progress, writers
from cpbjax import workdir as workdir_lib
from cpbjax.data import skip_groups
from cpbjax.report import ablate_section, backtest_tables, tables
from cpbjax.report import html_page as report_html
from cpbjax.report import sweep_section as report_sweep
from cpbjax.report.plots import (
    loss_curves,
    plot_fold_skill,
    plot_forecasts,
    plot_loss,
    plot_name,
    plot_skill,
)
from cpbjax.report.spec import ReportSpec
from cpbjax.score import forecast

FALLBACK_WIDTH = 80  # Console columns when the width is unknown (not a terminal, no $COLUMNS).


def terminal_console() -> Console:
    """A Console as wide as the terminal (shutil.get_terminal_size: $COLUMNS, then the
    terminal; FALLBACK_WIDTH when piped or in a CI log)."""
    return Console(width=shutil.get_terminal_size((FALLBACK_WIDTH, 24)).columns)


def print_table(results: dict, console: Console | None = None) -> None:
    """Prints the per-series table (the columns that fit a terminal: `tables.console_rows`),
    its legend, the summary and the skipped series."""
    table = Table(
        title="cpbjax results (test split)", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
    )
    for header in tables.CONSOLE_HEADERS:
        table.add_column(header, justify="left" if header == "series" else "right")
    for row in tables.console_rows(results):
        table.add_row(*row)
    console = console or terminal_console()
    console.print(table)
    for line in (tables.CONSOLE_LEGEND, *tables.summary_lines(results)):
        console.print(line)
    for line in report_sweep.choice_lines(results):
        console.print(line)
    for line in skipped_lines(results.get("skipped") or {}):
        console.print(line)


def skipped_lines(skipped: dict, file: str = "results.json") -> list[str]:
    """The skipped series summed up, one line per reason (skip_groups), then where each
    series' own reason is (`file`'s "skipped"): a long list here would scroll the verdict away."""
    if not skipped:
        return []
    return [
        *skip_groups.lines("skipped", sorted(skipped.items())),
        f'every series and its reason: {file} "skipped"; the data: '
        "python launch.py --mode data --config <this run's config>",
    ]


# The references a backtest's printed table keeps (ridge is in backtest.md).
PRINTED_REFERENCES = ("naive", "vol_band", "har")


def print_backtest(backtest: dict, paths: list[str], console: Console | None = None) -> None:
    """Prints a finished backtest's pooled skill of each column against the better naive,
    the band and HAR with its panel DM p (`backtest_tables.pooled_rows`), its skipped
    series and folds, and the paths it wrote."""
    table = Table(title="cpbjax backtest, pooled over folds", box=box.SIMPLE_HEAD, show_edge=False)
    for header in backtest_tables.POOLED_HEADERS:
        table.add_column(header, justify="left" if header in ("column", "against") else "right")
    for row in backtest_tables.pooled_rows(backtest):
        if row[1] in PRINTED_REFERENCES:
            table.add_row(*row)
    console = console or terminal_console()
    console.print(table)
    console.print(
        "skill% = 1 - MAE / MAE of the reference; panel DM p: one-sided Diebold-Mariano "
        "p-value of 'model better', per interval (backtest.md explains it)."
    )
    for line in skipped_lines(backtest.get("skipped") or {}, "backtest.json"):
        console.print(line)
    console.print("wrote " + ", ".join(paths), soft_wrap=True)


# ---------------------------------------------------------------------------
# report.md


def _md_table(headers, rows) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def render_markdown(
    results: dict, spec: ReportSpec, plots: list[str], title: str = "cpbjax report"
) -> str:
    """The report.md text: run facts, summary, results table, baselines, skipped series, plots."""
    model = spec.model
    d = spec.data
    lines = [f"# {title}", "", "The .html file beside this one shows all of it on one page.", ""]
    lines += ["## Run", ""]
    lines += [
        f"- model: {model} ({spec.decoding}), lookback {d.lookback} -> "
        f"horizon {d.horizon}, normalization {d.normalization}",
        f"- data: {tables.data_description(d, results)}",
    ]
    lines += tables.fact_lines("", results.get("run") or {})
    lines += ["", "## Summary", "", *[f"- {s}" for s in tables.summary_lines(results)], ""]
    lines += ["## Results (test split, price units)", ""]
    lines += _md_table(tables.HEADERS, tables.table_rows(results, model))
    lines += ["", tables.LEGEND, "", tables.STATUS_LEGEND, ""]
    lines += ["## Baselines: test skill % against the better naive forecast", ""]
    lines += _md_table(tables.BASELINE_HEADERS, tables.baseline_rows(results))
    lines += [
        "",
        "Ridge, band and HAR are fitted on train+val only (see cpbjax/score/baselines.py).",
        "",
    ]
    lines += _md_sweep(results) + _md_ablate(results)
    skipped = results.get("skipped") or {}
    if skipped:
        lines += ["## Skipped series", ""]
        lines += [f"- {name}: {reason}" for name, reason in sorted(skipped.items())] + [""]
    return "\n".join(lines + _md_plots(plots))


def _md_sweep(results: dict) -> list[str]:
    """A sweep run's section: its choice and ties, and per setting its val loss and how
    many series chose it; [] for any other run."""
    rows = report_sweep.setting_rows(results)
    if not rows:
        return []
    lines = ["## Sweep", "", *[f"- {s}" for s in report_sweep.choice_lines(results)], ""]
    return lines + _md_table(report_sweep.HEADERS, rows) + ["", report_sweep.LEGEND, ""]


def _md_ablate(results: dict) -> list[str]:
    """An ablate run's section: its sentences, per setting its skills and per compared
    setting the gain of all covariates; [] for any other run."""
    if not results.get("ablate"):
        return []
    lines = ["## Ablation", "", *[f"- {s}" for s in results["ablate"]["sentences"]], ""]
    lines += _md_table(ablate_section.SETTING_HEADERS, ablate_section.setting_rows(results))
    lines += [""] + _md_table(ablate_section.GAIN_HEADERS, ablate_section.gain_rows(results))
    return lines + ["", ablate_section.LEGEND, ""]


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
# Plots (drawn by cpbjax/report/plots.py) and the report files.


def _read_forecasts(workdir: str, name: str) -> dict | None:
    path = workdir_lib.forecasts_file(workdir, name)
    return forecast.load_forecasts(path) if os.path.exists(path) else None


class SeriesPlotSpec(NamedTuple):
    """Where and how the loss and forecast plots of each series of a run are drawn (plain
    data, so a plot worker process can take it)."""

    folder: str  # the plots folder
    plot_windows: int  # eval.plot_windows; 0 draws no forecast plot
    lookback: int  # data.lookback: the input closes shown before each forecast
    loss_label: str  # the loss plots' y label (`plots.loss_label` of train.loss)
    val_label: str  # a kept baseline's val loss, "val" or "pooled val" (sharing.Sharing)


def series_plot_spec(folder: str, spec: ReportSpec) -> SeriesPlotSpec:
    """The SeriesPlotSpec of a run's ReportSpec, drawing into `folder`."""
    return SeriesPlotSpec(
        folder, spec.plot_windows, spec.data.lookback, spec.loss_label, spec.val_label
    )


class PlotInputs(NamedTuple):
    """What a report's per-series plots are drawn from; each None is read or drawn here."""

    history: list | None = None  # metrics.jsonl records; None reads <workdir>/metrics.jsonl
    # series name -> `forecast.forecast_record(...)` of its test windows; series missing
    # here are read from <workdir>/forecasts/<name>.npz if saved.
    forecasts: dict | None = None
    # series name -> paths of its plots already drawn under the plots folder
    # (`plot_workers.PlotWorkers.finish`); those are listed, not drawn again.
    drawn: dict | None = None


def series_plots(spec: SeriesPlotSpec, name, entry, curve, record) -> list[str]:
    """Writes loss-<name>.png and forecast-<name>.png of one series; returns their paths.

    Module-level and given only plain data, so a worker process can run it
    (cpbjax/report/plot_workers.py).

    Args:
      spec: the run's plots folder, eval.plot_windows and data.lookback.
      name: the series. entry: its results.json entry (best_epoch, best_val_loss, status).
      curve: (epochs, train, val) from `loss_curves`, or None.
      record: its test `forecast.forecast_record`, or None.
    """
    paths = []
    if curve is not None:
        path = os.path.join(spec.folder, plot_name("loss", name))
        paths.append(plot_loss(path, name, curve, entry, spec.loss_label, spec.val_label))
    if not spec.plot_windows:
        return paths
    if record is None:
        logging.info("no test forecasts of %s to plot", name)
        return paths
    path = os.path.join(spec.folder, plot_name("forecast", name))
    return [*paths, plot_forecasts(path, record, spec.plot_windows, spec.lookback)]


def write_plots(folder, results, spec: ReportSpec, history, forecasts, drawn=None) -> list[str]:
    """Writes skill.png, then loss-<series>.png and forecast-<series>.png of each series;
    returns their paths in that order.

    Args:
      drawn: series name -> the paths of its plots, for series whose plots are already
        drawn (by cpbjax/report/plot_workers.py); they are listed, not drawn again.
    """
    os.makedirs(folder, exist_ok=True)
    drawn = drawn or {}
    skill = plot_skill(os.path.join(folder, plot_name("skill")), results)
    paths = [skill] if skill else []
    curves = loss_curves(history)
    series_spec = series_plot_spec(folder, spec)
    counted = progress.Counted("plots", len(set(results.get("series", {})) - set(drawn)))
    for name, entry in sorted(results.get("series", {}).items()):
        if name in drawn:
            paths += drawn[name]
            continue
        paths += series_plots(series_spec, name, entry, curves.get(name), forecasts.get(name))
        counted.advance()
    counted.finish()
    return paths


def _report_plots(workdir: str, results: dict, spec: ReportSpec, inputs: PlotInputs, stem: str):
    """Draws the report's plots (eval.plots) into `workdir.plots_dir`; returns their paths."""
    if not spec.plots:
        return []
    history = inputs.history
    if history is None:
        history = writers.MetricsLog(workdir).records()
    forecasts, drawn = dict(inputs.forecasts or {}), inputs.drawn or {}
    for name in results.get("series", {}):
        if name not in forecasts and name not in drawn:
            forecasts[name] = _read_forecasts(workdir, name)
    folder = workdir_lib.plots_dir(workdir, stem)
    return write_plots(folder, results, spec, history, forecasts, drawn)


def write_reports(
    workdir,
    results,
    spec: ReportSpec,
    inputs: PlotInputs | None = None,
    stem="report",
    console=None,
) -> str:
    """Prints the results table (eval.print_table) and writes <workdir>/<stem>.md, <stem>.html and the plots.

    Args:
      workdir: the run folder.
      results: the results.json dict ({"run", "series", "skipped"}).
      spec: the run's ReportSpec (model name, data facts, eval.plots, eval.plot_windows).
      inputs: the metrics history, test forecasts and already drawn plots to draw the
        per-series plots from (see PlotInputs; None: all read or drawn here).
      stem: report name; plots go to <workdir>/plots/ for "report", otherwise to
        <workdir>/plots/<stem>/ (so an evaluation never overwrites the run's plots).
      console: the rich Console to print to (default: stdout).

    Returns:
      The path of the markdown report (the HTML one is workdir.report_html(workdir, stem)).
    """
    if spec.print_table:
        print_table(results, console)
    plots = _report_plots(workdir, results, spec, inputs or PlotInputs(), stem)
    path = workdir_lib.report_md(workdir, stem)
    rel = [os.path.relpath(p, workdir) for p in plots]
    writers.atomic_write(path, render_markdown(results, spec, rel, title=f"cpbjax {stem}"))

    page = report_html.render_html(results, spec, plots, title=f"cpbjax {stem}")
    writers.atomic_write(workdir_lib.report_html(workdir, stem), page)
    return path


# ---------------------------------------------------------------------------
# --mode backtest


def render_backtest_markdown(backtest: dict, spec: ReportSpec) -> str:
    """The backtest.md text: settings, skill per fold over time, pooled skill, skipped."""
    d, b = spec.data, backtest.get("backtest") or {}
    lines = ["# cpbjax backtest", "", "## Run", ""]
    lines += [
        f"- model: {spec.model} ({spec.decoding}), lookback {d.lookback} -> "
        f"horizon {d.horizon}, normalization {d.normalization}",
        f"- data: {tables.data_description(d)}",
    ]
    lines += tables.fact_lines("backtest.", b, skip=())
    lines += tables.fact_lines("", backtest.get("run") or {})
    lines += ["", "## Skill per fold over time (test blocks, price units)", ""]
    lines += _md_table(backtest_tables.FOLD_HEADERS, backtest_tables.fold_rows(backtest))
    lines += ["", backtest_tables.FOLD_LEGEND, "", "## Pooled over folds", ""]
    lines += _md_table(backtest_tables.POOLED_HEADERS, backtest_tables.pooled_rows(backtest))
    lines += ["", backtest_tables.POOLED_LEGEND, ""]
    skipped = backtest.get("skipped") or {}
    if skipped:
        lines += ["## Skipped series and folds", ""]
        lines += [f"- {name}: {reason}" for name, reason in sorted(skipped.items())] + [""]
    return "\n".join(lines)


def write_backtest_report(workdir: str, backtest: dict, spec: ReportSpec) -> str:
    """Writes <workdir>/backtest.md, backtest.html and (eval.plots) plots/backtest/fold_skill.png;
    returns the markdown's path."""
    stem = workdir_lib.BACKTEST_STEM
    path = workdir_lib.report_md(workdir, stem)
    writers.atomic_write(path, render_backtest_markdown(backtest, spec))
    chart = None
    if spec.plots:
        folder = workdir_lib.plots_dir(workdir, stem)
        os.makedirs(folder, exist_ok=True)
        chart = plot_fold_skill(os.path.join(folder, plot_name("fold_skill")), backtest)
    page = report_html.render_backtest_html(backtest, spec, chart)
    writers.atomic_write(workdir_lib.report_html(workdir, stem), page)
    return path
