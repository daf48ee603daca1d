"""Tests of cpbjax/report/plot_workers.py: plots drawn in worker processes are the in-process ones."""

import io
import os

from rich.console import Console

from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report.plot_workers import PlotWorkers
from tests.fake_data import forecast_record, report_config, report_history, report_results

NAMES = ("BTCUSDT-1h", "ETHUSDT-1h")


def _report(workdir, results, records, drawn=None):
    """write_reports into `workdir`; returns report.md's text and the plots' bytes."""
    report.write_reports(
        workdir,
        results,
        report_spec.make_spec(report_config()),
        report.PlotInputs(report_history(NAMES), records, drawn),
        console=Console(file=io.StringIO()),
    )
    folder = os.path.join(workdir, "plots")
    pngs = {}
    for p in sorted(os.listdir(folder)):
        with open(os.path.join(folder, p), "rb") as f:
            pngs[p] = f.read()
    with open(os.path.join(workdir, "report.md")) as f:
        return f.read(), pngs


def test_workers_draw_the_in_process_report(tmp_path):
    records = {n: forecast_record(n, i) for i, n in enumerate(NAMES)}
    results = report_results(records)
    alone = _report(str(tmp_path / "alone"), results, records)

    workdir = str(tmp_path / "pooled")
    workers = PlotWorkers(os.path.join(workdir, "plots"), report_spec.make_spec(report_config()), 1)
    for name in NAMES:  # one "group" per series, as the driver submits them
        workers.submit(
            {name: results["series"][name]}, report_history(NAMES), {name: records[name]}
        )
    drawn = workers.finish()
    assert sorted(drawn) == list(NAMES)
    assert all(len(paths) == 2 for paths in drawn.values())  # loss and forecast
    pooled = _report(workdir, results, {}, drawn)  # no records: nothing drawn twice

    assert pooled[0] == alone[0]  # report.md: same plots, same order
    assert pooled[1].keys() == alone[1].keys()
    assert pooled[1] == alone[1]  # byte-identical PNGs


def test_a_failed_worker_leaves_the_series_to_the_report(tmp_path):
    records = {n: forecast_record(n, i) for i, n in enumerate(NAMES)}
    results = report_results(records)
    workers = PlotWorkers(str(tmp_path / "plots"), report_spec.make_spec(report_config()), 1)
    bad_record = {"actual": None}  # plot_forecasts fails on it in the worker
    workers.submit(
        results["series"],
        report_history(NAMES),
        {NAMES[0]: bad_record, **{NAMES[1]: records[NAMES[1]]}},
    )
    drawn = workers.finish()
    assert list(drawn) == [NAMES[1]]
    md, pngs = _report(str(tmp_path), results, records, drawn)
    assert f"forecast-{NAMES[0]}.png" in pngs and f"forecast-{NAMES[0]}.png" in md
