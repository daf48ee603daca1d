"""The report's figures: loss curves, test forecasts against actual and naive, the skill chart.

Plots are drawn on matplotlib Figures with the Agg canvas directly, never via pyplot,
so plotting changes no global backend and leaks no open figures. They are PNGs at
DPI dots per inch, sized to be read at their natural size on a laptop screen.

matplotlib is imported when the first figure is drawn, not with this module: it adds
about 0.3 s to a process's start, and most processes draw nothing (eval.plots=False,
predict, serve, --mode data, the plot workers' parent).
"""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

import numpy as np

from cpbjax import writers
from cpbjax.data import parsing
from cpbjax.data.series import INTERVAL_MS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 110
NOISE_BAND = 0.01  # |skill| below this on one series is noise (see the README).
# Quote assets, longest first, to name the price unit of a symbol (BTCUSDT -> USDT).
QUOTES = ("FDUSD", "USDT", "USDC", "BUSD", "TUSD", "EUR", "TRY", "BTC", "ETH", "BNB")


def _figure(width=5.0, height=3.0) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # (see the module docstring)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _ticker():
    """matplotlib.ticker, imported with the first figure (see the module docstring)."""
    from matplotlib import ticker

    return ticker


def _save(fig: Figure, path: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    writers.atomic_write(path, buf.getvalue())
    return path


def plot_name(kind: str, series: str | None = None) -> str:
    """A plot's file name: skill.png, loss-<SERIES>.png, forecast-<SERIES>.png."""
    return f"{kind}.png" if series is None else f"{kind}-{series}.png"


def quote_asset(symbol: str) -> str:
    """The price unit of a Binance symbol ("BTCUSDT" -> "USDT"); "price" if unknown."""
    return next((q for q in QUOTES if symbol.endswith(q) and len(symbol) > len(q)), "price")


def _plain_prices(ax) -> None:
    """Full prices on the y axis: no '+1.234e-5' offset or '1e-5' factor above it."""
    fmt = _ticker().ScalarFormatter(useOffset=False)
    fmt.set_scientific(False)
    ax.yaxis.set_major_formatter(fmt)


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


def loss_label(train_cfg) -> str:
    """The y label of a loss plot, named from the run's own train.loss and train.loss_scale
    (cpbjax/training/losses.py): e.g. "loss (MAE / persistence MAE)"."""
    kind = train_cfg.loss.upper()
    if train_cfg.loss_scale != "persistence":
        return f"loss ({kind} of normalised prices)"
    return (
        "loss (MAE / persistence MAE)"
        if kind == "MAE"
        else f"loss ({kind}, errors / persistence MAE)"
    )


def kept_point(epochs, val, entry: dict, val_label: str = "val"):
    """(epoch, val loss, legend label) of the model a series kept, or None if unknown.

    The kept model is results.json's `best_epoch`; None there means no epoch beat the
    untrained model (the baseline), so epoch 0 is kept, at the untrained val loss, which
    is the `best_val_loss` no epoch beat (step.first_bar; with train.share=pooled that
    loss is the pooled one of all series, and `val_label`, sharing.Sharing's, says so).
    An entry without a best_epoch at all (not a trained run's) marks nothing.
    """
    if "best_epoch" not in entry:
        return None
    best = entry["best_epoch"]
    if best is None:
        untrained = entry.get("best_val_loss")
        if untrained is None or not math.isfinite(untrained):
            return None  # no baseline (model.baseline=none) and no epoch kept
        return (
            0,
            float(untrained),
            f"kept: epoch 0, the untrained baseline ({val_label} {untrained:.3g})",
        )
    at = [v for e, v in zip(epochs, val, strict=True) if e == best]
    return (best, float(at[0]), f"kept: epoch {best} (val {at[0]:.3g})") if at else None


def loss_figure(name: str, curve: tuple, entry: dict, ylabel: str, val_label="val") -> Figure:
    """Train and validation loss of one series against the (whole) epoch, the kept model
    marked (`kept_point`: epoch 0 when the series kept its untrained baseline).

    Args:
      curve: (epochs, train losses, val losses), lists of equal length (`loss_curves`).
      entry: its results.json entry (best_epoch, best_val_loss, status).
      ylabel: `loss_label` of the run's config. val_label: `kept_point`'s.
    """
    epochs, train, val = curve
    fig = _figure(5.0, 3.2)
    ax = fig.add_subplot()
    ax.plot(epochs, train, "o-", ms=3, label="train")
    ax.plot(epochs, val, "o-", ms=3, label="val")
    kept = kept_point(epochs, np.asarray(val, float), entry, val_label)
    losses = np.r_[np.asarray(train, float), np.asarray(val, float)]
    if kept is not None:
        ax.axvline(kept[0], color="C2", ls="--", lw=1)
        ax.plot([kept[0]], [kept[1]], "*", color="C2", ms=11, label=kept[2])
        losses = np.r_[losses, kept[1]]
    ax.xaxis.set_major_locator(_ticker().MaxNLocator(integer=True))
    _loss_axis(ax, losses)
    status = entry.get("status")
    title = f"{name} loss" + (f" ({status.replace('_', ' ')})" if status else "")
    ax.set(title=title, xlabel="epoch", ylabel=ylabel)
    ax.legend(fontsize=8)
    return fig


def plot_loss(path: str, name: str, curve: tuple, entry: dict, ylabel: str, val_label="val") -> str:
    """Writes `loss_figure` as a PNG at `path`; returns the path."""
    return _save(loss_figure(name, curve, entry, ylabel, val_label), path)


def _loss_axis(ax, losses) -> None:
    """A log y axis when the losses span more than a decade, else linear; "0.000117"-style
    tick labels either way (no "x 10^-4" labels or factors above the axis)."""
    finite = losses[np.isfinite(losses)]
    if finite.size and finite.min() > 0 and finite.max() / finite.min() > 10:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(_ticker().NullFormatter())
    ax.yaxis.set_major_formatter(_ticker().FuncFormatter(lambda v, _: f"{v:.3g}"))


def _pick_windows(times, n: int, num_windows: int, context: int):
    """Evenly spaced test windows, skipping the first ones so that each has its context."""
    first = min(context - 1, n - 1)
    return np.unique(np.linspace(first, n - 1, num_windows).round().astype(int))


def _close_band(record: dict, i: int):
    """(lower [H], upper [H], label) of close's shaded band in window i: the calibrated
    interval (as scored); None without one."""
    if "interval_bounds" not in record:
        return None
    levels, q_H2 = record["interval_levels"], record["interval_bounds"][i, :, 3]  # [N, H, C, 2]
    label = f"calibrated interval q{100 * levels[0]:.0f}-q{100 * levels[-1]:.0f} of close"
    return q_H2[:, 0], q_H2[:, -1], label


def _forecast_panel(ax, record: dict, i: int, context: int, step: int) -> None:
    """One test window: context closes, actual, predicted, persistence, candle ranges."""
    times, last = record["last_open_time_ms"], record["last_candle"]
    horizon = record["actual"].shape[1]
    prev = np.arange(max(0, i - context + 1), i + 1)
    prev = prev[(times[i] - times[prev]) < context * step]  # same run of candles only
    ax.plot((times[prev] - times[i]) / step, last[prev, 3], "k-", lw=1, label="input closes")
    steps = np.arange(horizon + 1)  # 0 is the last input candle
    pred, close0 = record["predicted"][i], last[i, 3]
    band = _close_band(record, i)
    if band is not None:
        ax.fill_between(steps[1:], band[0], band[1], color="C0", alpha=0.15, label=band[2])
    ax.vlines(steps[1:], pred[:, 2], pred[:, 1], color="C0", lw=3, alpha=0.35)
    ax.plot([], [], color="C0", lw=3, alpha=0.35, label="predicted low-high of each candle")
    ax.hlines(close0, 0, horizon, color="C3", ls=":", lw=1.5, label="persistence (last close)")
    ax.plot(steps, np.r_[close0, record["actual"][i, :, 3]], "k.-", lw=1, label="actual close")
    ax.plot(steps, np.r_[close0, pred[:, 3]], "C0.--", lw=1.2, label="predicted close")
    ax.set_title(parsing.iso(times[i])[:16].replace("T", " ") + " UTC", fontsize=9)
    ax.set_xlabel("candles after the last input", fontsize=9)
    ax.xaxis.set_major_locator(_ticker().MaxNLocator(integer=True))
    ax.tick_params(labelsize=8)
    _plain_prices(ax)


def plot_forecasts(path: str, record: dict, num_windows: int, context: int) -> str:
    """Forecast against actual close for `num_windows` test windows of one series.

    Each panel shows the closes of the `context` candles up to the window's last one
    (taken from the preceding windows' last candles), the actual next H closes, the
    predicted closes, the persistence forecast (the last close repeated) and the
    predicted low-high range of each candle (a candle's range, not an uncertainty
    band). A record with `interval_bounds` (the calibrated interval) gets close's
    interval shaded.
    """
    n = record["actual"].shape[0]
    step = INTERVAL_MS[str(record["interval"])]
    picks = _pick_windows(record["last_open_time_ms"], n, num_windows, context)
    fig = _figure(max(4.2 * len(picks), 6.0), 3.9)
    for k, i in enumerate(picks):
        _forecast_panel(fig.add_subplot(1, len(picks), k + 1), record, i, context, step)
    fig.axes[0].set_ylabel(f"close ({quote_asset(str(record['symbol']))})", fontsize=9)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle(f"{record['series']}: test-window forecasts")
    return _save(fig, path)


def skill_of(entry: dict, column: str, split: str = "test") -> float | None:
    """The skill of one column of a results.json series entry, None if not scored."""
    columns = (entry.get(split) or {}).get("columns") or {}
    return (columns.get(column) or {}).get("skill")


def plot_skill(path: str, results: dict) -> str | None:
    """Test skill of close, high and low of every series; None if nothing to draw."""
    series = results.get("series", {})
    names = sorted(n for n, e in series.items() if skill_of(e, "close") is not None)
    if not names:
        return None
    fig = _figure(7.0, 1.2 + 0.32 * len(names))
    ax = fig.add_subplot()
    y = np.arange(len(names))
    for j, col in enumerate(("close", "high", "low")):
        vals = [100 * (skill_of(series[n], col) or 0.0) for n in names]
        ax.barh(y + (j - 1) * 0.27, vals, height=0.27, label=col)
    ax.axvspan(-100 * NOISE_BAND, 100 * NOISE_BAND, color="0.85", zorder=0, label="noise band")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()  # alphabetical from the top, as in the tables
    ax.set(xlabel="test skill vs better naive (%)", title="skill = 1 - MAE / MAE naive")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def fold_skills(backtest: dict, column: str) -> dict:
    """fold index -> the test skills of `column` of its scored series (backtest.json)."""
    by_fold: dict = {}
    for entry in backtest.get("series", {}).values():
        for fold in entry.get("folds", []):
            skill = skill_of(fold, column)
            if skill is not None:
                by_fold.setdefault(fold["fold"], []).append(skill)
    return by_fold


def plot_fold_skill(path: str, backtest: dict) -> str | None:
    """A backtest's test skill per fold, in time order: each series a dot, the mean a line,
    one panel per column (close, high, low). None if no fold was scored."""
    columns = ("close", "high", "low")
    if not any(fold_skills(backtest, c) for c in columns):
        return None
    fig = _figure(9.0, 3.0)
    axes = fig.subplots(1, len(columns), sharey=False)
    for ax, col in zip(axes, columns, strict=True):
        by_fold = fold_skills(backtest, col)
        folds = sorted(by_fold)
        for f in folds:
            ax.plot([f] * len(by_fold[f]), [100 * v for v in by_fold[f]], ".", color="0.6", ms=4)
        means = [100 * float(np.mean(by_fold[f])) for f in folds]
        ax.plot(folds, means, "o-", color="C0", label="mean over series")
        ax.axhspan(-100 * NOISE_BAND, 100 * NOISE_BAND, color="0.9", zorder=0)
        ax.axhline(0, color="k", lw=0.8)
        ax.xaxis.set_major_locator(_ticker().MaxNLocator(integer=True))
        ax.set(title=col, xlabel="fold (oldest first)")
    axes[0].set_ylabel("test skill vs better naive (%)")
    axes[0].legend(fontsize=8)
    return _save(fig, path)
