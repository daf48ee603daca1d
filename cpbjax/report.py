"""The run report: a printed rich table, <workdir>/report.md and PNG plots.

Plots are drawn on matplotlib Figures with the Agg canvas directly, never via
pyplot, so reporting changes no global backend and leaks no open figures.
"""

from __future__ import annotations

import io
import os
import statistics

import numpy as np
from absl import logging
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from cpbjax import forecast, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import INTERVAL_MS
from cpbjax.data import parsing

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
MIN_WIDTH = 160  # Console columns when not on a terminal (CI logs): keep rows on one line.
NOISE_BAND = 0.01  # |skill| below this on one series is noise (see the README).
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


def _facts(prefix: str, value) -> list[str]:
    """Flattens run facts into `- key: value` lines."""
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _facts(f"{prefix}{k}.", v)]
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    return [f"- {prefix[:-1]}: {value}"]


def _data_location(d) -> str:
    return {"binance": d.base_url, "local": d.local_dir}.get(d.source, "(offline)")


def render_markdown(results: dict, config, plots: list[str], title: str = "cpbjax report") -> str:
    """The report.md text: run facts, the results table, baselines, skipped series, plots."""
    model = config.model.name
    lines = [f"# {title}", "", "## Run", ""]
    lines += [
        f"- model: {model} ({config.model.decoding}), lookback {config.data.lookback} -> "
        f"horizon {config.data.horizon}, normalization {config.data.normalization}",
        f"- data: source {config.data.source} {_data_location(config.data)}, "
        f"{len(config.data.symbols)} symbols x {', '.join(config.data.intervals)}, "
        f"{config.data.months} months, last {config.data.max_candles} candles",
    ]
    lines += _facts("", results.get("run") or {})
    lines += ["", "## Results (test split, price units)", ""]
    lines += _md_table(HEADERS, table_rows(results, model))
    lines += ["", LEGEND, "", *[f"- {s}" for s in summary_lines(results)], ""]
    lines += ["## Baselines: test skill % against the better naive forecast", ""]
    lines += _md_table(BASELINE_HEADERS, baseline_rows(results))
    lines += ["", "Ridge and band are fitted on train+val only (see cpbjax/baselines.py).", ""]
    skipped = results.get("skipped") or {}
    if skipped:
        lines += ["## Skipped series", ""]
        lines += [f"- {name}: {reason}" for name, reason in sorted(skipped.items())] + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{os.path.basename(p)}]({p})" for p in plots] + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Plots.


def _figure(width=5.0, height=3.0) -> Figure:
    fig = Figure(figsize=(width, height), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    writers.atomic_write(path, buf.getvalue())
    return path


def loss_curves(history: list[dict]) -> dict:
    """Series name -> (epochs, train losses, val losses) from metrics.jsonl records."""
    curves: dict = {}
    for rec in history:
        for i, name in enumerate(rec.get("series", [])):
            epochs, train, val = curves.setdefault(name, ([], [], []))
            epochs.append(rec["epoch"])
            train.append(np.nan if rec["train_loss"][i] is None else rec["train_loss"][i])
            val.append(np.nan if rec["val_loss"][i] is None else rec["val_loss"][i])
    return curves


def plot_loss(path: str, name: str, epochs, train, val) -> str:
    """Train and validation loss of one series against the epoch."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(epochs, train, label="train")
    ax.plot(epochs, val, label="val")
    ax.set(title=f"{name} loss", xlabel="epoch", ylabel="loss (normalised MSE)")
    ax.legend()
    return _save(fig, path)


def plot_forecasts(path: str, record: dict, num_windows: int, context: int) -> str:
    """Forecast against actual close for `num_windows` test windows of one series.

    Each panel shows the closes of the `context` candles up to the window's last
    one (taken from the preceding windows' last candles), the actual next H
    closes, the predicted closes and the predicted high-low band.
    """
    n, horizon = record["actual"].shape[:2]
    # Evenly spaced windows, skipping the first ones so that each has its context.
    first = min(context - 1, n - 1)
    picks = np.unique(np.linspace(first, n - 1, num_windows).round().astype(int))
    step = INTERVAL_MS[str(record["interval"])]
    times, last = record["last_open_time_ms"], record["last_candle"]
    fig = _figure(3.5 * len(picks), 3.0)
    for k, i in enumerate(picks):
        ax = fig.add_subplot(1, len(picks), k + 1)
        prev = np.arange(max(0, i - context + 1), i + 1)
        prev = prev[(times[i] - times[prev]) < context * step]  # same run of candles only
        ax.plot((times[prev] - times[i]) / step, last[prev, 3], "k-", lw=1)
        steps = np.arange(horizon + 1)  # 0 is the last input candle
        pred = record["predicted"][i]
        ax.plot(steps, np.r_[last[i, 3], record["actual"][i, :, 3]], "k.-", lw=1, label="actual")
        ax.plot(steps, np.r_[last[i, 3], pred[:, 3]], "C0.--", lw=1, label="predicted")
        ax.fill_between(
            steps[1:], pred[:, 2], pred[:, 1], color="C0", alpha=0.2, label="pred. low-high"
        )
        ax.set_title(parsing.iso(times[i])[:16], fontsize=9)
        ax.set_xlabel("candles after the last input", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.axes[0].legend(fontsize=7)
    fig.suptitle(str(record["series"]))
    return _save(fig, path)


def plot_skill(path: str, results: dict) -> str | None:
    """Test skill of close, high and low of every series; None if nothing to draw."""
    names = sorted(
        n for n, e in results.get("series", {}).items() if _close(e).get("skill") is not None
    )
    if not names:
        return None
    fig = _figure(6.0, 1.0 + 0.3 * len(names))
    ax = fig.add_subplot()
    y = np.arange(len(names))
    for j, col in enumerate(("close", "high", "low")):
        vals = [
            ((results["series"][n]["test"]["columns"][col]).get("skill") or 0.0) * 100
            for n in names
        ]
        ax.barh(y + (j - 1) * 0.27, vals, height=0.27, label=col)
    ax.axvspan(-100 * NOISE_BAND, 100 * NOISE_BAND, color="0.85", zorder=0, label="noise band")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, names, fontsize=7)
    ax.set(xlabel="test skill vs better naive (%)", title="skill = 1 - MAE / MAE naive")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def _read_forecasts(workdir: str, name: str) -> dict | None:
    path = workdir_lib.forecasts_file(workdir, name)
    return forecast.load_forecasts(path) if os.path.exists(path) else None


def write_plots(folder, results, config, history, forecasts) -> list[str]:
    """Writes skill.png, loss-<series>.png and forecast-<series>.png; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    series = results.get("series", {})
    skill = plot_skill(os.path.join(folder, "skill.png"), results)
    paths = [skill] if skill else []
    for name, (epochs, train, val) in sorted(loss_curves(history).items()):
        if name in series:
            paths.append(
                plot_loss(os.path.join(folder, f"loss-{name}.png"), name, epochs, train, val)
            )
    for name in sorted(series) if config.eval.plot_windows else ():
        record = forecasts.get(name)
        if record is None:
            logging.info("no test forecasts of %s to plot", name)
            continue
        path = os.path.join(folder, f"forecast-{name}.png")
        paths.append(plot_forecasts(path, record, config.eval.plot_windows, config.data.lookback))
    return paths


def write_reports(
    workdir, results, config, history=None, forecasts=None, stem="report", console=None
) -> str:
    """Prints the results table and writes <workdir>/<stem>.md and its plots.

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
      The path of the markdown report.
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
    return path
