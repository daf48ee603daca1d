"""The per-series plots drawn in worker processes, off the run's critical path.

Drawing the 2 PNGs of each series (matplotlib: text layout, constrained layout, PNG
encoding) is single-threaded Python that took 32-43 s of every 40-series demo run when
done after the last group. `PlotWorkers` hands each finished group's series to a small
process pool, so they are drawn while the next group trains (whose XLA program leaves
part of the cores idle) and, at the end, on every worker at once while the main process
draws the skill chart. The plots are the same files `report.write_plots` writes, drawn by
the same `report.series_plots`. The workers (360 MB each) are spawned and end with the
run (cpbjax/process_pool.py).
"""

from __future__ import annotations

import concurrent.futures
import os

from absl import logging

from cpbjax import process_pool, progress, sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.report import run_report as report
from cpbjax.report.spec import ReportSpec


class PlotWorkers:
    """A process pool drawing loss and forecast plots of series handed to it group by group."""

    def __init__(self, folder: str, spec: ReportSpec, workers: int):
        """Args:
        folder: the plots folder (`workdir.plots_dir`).
        spec: the run's ReportSpec (eval.plot_windows, data.lookback, the loss label).
        workers: processes in the pool (eval.plot_workers, >= 1).
        """
        self.spec = report.series_plot_spec(folder, spec)
        os.makedirs(folder, exist_ok=True)
        self._pool = process_pool.spawn(workers)
        self._futures: dict[str, concurrent.futures.Future] = {}

    def submit(self, entries: dict, history: list[dict], forecasts: dict) -> None:
        """Queues the plots of a finished group's series.

        Args:
          entries: series name -> results.json entry. history: the metrics.jsonl records
            holding those series. forecasts: series name -> test forecast record.
        """
        curves = report.loss_curves(history)
        for name, entry in entries.items():
            args = (name, entry, curves.get(name), forecasts.get(name))
            self._futures[name] = self._pool.submit(report.series_plots, self.spec, *args)

    def finish(self) -> dict[str, list[str]]:
        """Waits for every queued series; returns series name -> its plot paths.

        A series whose worker failed is left out (with a warning), so that the report
        draws it in the run's own process and a plotting failure there is raised as it
        would be without workers.
        """
        drawn, counted = {}, progress.Counted("plots", len(self._futures))
        for name, future in self._futures.items():
            try:
                drawn[name] = future.result()
            except Exception as e:  # noqa: BLE001 (any failure: redrawn in-process)
                logging.warning("plot worker failed on %s (%s); drawing it again", name, e)
            counted.advance()
        counted.finish()
        self._pool.shutdown()
        return drawn

    def close(self) -> None:
        """Stops the pool without waiting (a run that failed before its report)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def start(spec: ReportSpec, workdir: str) -> PlotWorkers | None:
    """The pool drawing each group's plots while the next one trains (process 0, when
    eval.plots and eval.plot_workers ask for it), else None: plots drawn at the end."""
    if not (spec.plots and spec.plot_workers and sharding.is_primary()):
        return None
    folder = workdir_lib.plots_dir(workdir, "report")
    return PlotWorkers(folder, spec, spec.plot_workers)


def submit_group(workers, workdir: str, group: str, entries: dict, records: dict) -> None:
    """Hands a finished group's series, their loss history and forecasts to the plot pool
    (nothing without one)."""
    if workers is None:
        return
    history = [r for r in writers.MetricsLog(workdir).records() if r.get("group") == group]
    workers.submit(entries, history, records)
