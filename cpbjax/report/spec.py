"""`ReportSpec`: what the run report reads of the config, frozen.

A mode (train, sweep, backtest, evaluate) builds it once (`make_spec`) and hands it to
cpbjax/report/run_report.py, html_page.py and plot_workers.py; a plot worker process gets
its plain `SeriesPlotSpec` part.
"""

from __future__ import annotations

import dataclasses

from cpbjax.data import spec as data_spec
from cpbjax.report.plots import loss_label
from cpbjax.training import sharing


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReportSpec:
    """The run facts, loss label and plot settings of a report."""

    model: str  # model.name
    decoding: str  # model.decoding
    data: data_spec.DataSpec  # the data facts (lookback, horizon, source, symbols, ...)
    loss_label: str  # the loss plots' y label (`plots.loss_label` of train.loss)
    val_label: str  # a kept baseline's val loss, "val" or "pooled val" (sharing.Sharing)
    plots: bool  # eval.plots: draw the PNGs at all
    plot_windows: int  # eval.plot_windows; 0 draws no forecast plot
    plot_workers: int  # eval.plot_workers; 0 draws every plot in the run's own process
    print_table: bool  # eval.print_table: print the results table to stdout


def make_spec(config) -> ReportSpec:
    """The ReportSpec of a run config (model, data, train.loss*, train.share, eval.plot*, eval.print_table)."""
    return ReportSpec(
        model=config.model.name,
        decoding=config.model.decoding,
        data=data_spec.make_spec(config.data),
        loss_label=loss_label(config.train),
        val_label=sharing.from_config(config.train).val_label,
        plots=config.eval.plots,
        plot_windows=config.eval.plot_windows,
        plot_workers=config.eval.plot_workers,
        print_table=config.eval.print_table,
    )
