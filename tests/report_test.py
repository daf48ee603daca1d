"""Tests of cpbjax/report.py: the table, report.md and the PNG plots."""

import io
import os

import numpy as np
from rich.console import Console

from cpbjax import metrics, plots, report, report_tables
from tests.helpers import forecast_record, report_config, report_history, report_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def test_table_row_cells():
    records = {"BTCUSDT-1h": forecast_record("BTCUSDT-1h", 0)}
    results = report_results(records)
    test = results["series"]["BTCUSDT-1h"]["test"]
    row = report_tables.table_rows(results, "gru")[0]
    assert row[:5] == ["BTCUSDT-1h", "gru", "stopped_early", "3", "0.5"]
    close = test["columns"]["close"]
    assert row[5] == format(close["mae"], ".4g")
    assert row[8] == format(100 * close["skill"], "+.2f")
    d = test["direction"]
    assert row[9] == f"{100 * d['accuracy']:.1f} ({100 * d['up_share']:.1f})"
    assert row[11] == "1.2"  # 1.25 s


def test_summary_counts_skill_and_significance():
    def entry(skill, p):
        return {"test": {"columns": {"close": {"skill": skill}}, "dm": {"p_value_better": p}}}

    results = {
        "series": {
            "A-1h": entry(0.02, 0.01),
            "B-1h": entry(-0.005, 0.7),
            "C-1h": entry(0.001, 0.2),
            "D-1h": {"status": "diverged"},
        }
    }
    lines = report_tables.summary_lines(results)
    assert "median +0.10%" in lines[0] and "positive on 2 of 3" in lines[0]
    assert "p < 0.05: 1 of 3" in lines[1]
    assert lines[2].startswith("2 of 3 series have |skill| < 1%")
    assert len(lines) == 3  # no series has a calibrated interval: no line for it


def test_summary_gives_the_interval_coverage_median_over_series():
    def entry(coverage, skill):
        columns = {c: {"coverage": coverage, "skill_vs_band": skill} for c in metrics.COLUMNS}
        block = {"central": [0.1, 0.9], "columns": columns}
        test = {"columns": {"close": {"skill": 0.0}}, "calibrated_interval": block}
        return {"test": test}

    results = {"series": {"A": entry(0.7, -0.01), "B": entry(0.8, 0.02), "C": entry(0.9, 0.0)}}
    line = report_tables.summary_lines(results)[-1]
    assert line.startswith("Calibrated 80% interval (q10-q90, fitted on train+val)")
    assert "median over 3 series: test coverage close 80.0%, high 80.0%, low 80.0%" in line
    assert "band's quantiles close +0.00%" in line
    assert line.endswith("Its scale is the window's EWMA range, as the band's.")  # saved before
    for name, candles in (("A", 168), ("B", 672), ("C", 672)):
        block = results["series"][name]["test"]["calibrated_interval"]
        block["scale"] = {"long_candles": candles, "long_weight": 0.25}
        for c in metrics.COLUMNS:
            block["columns"][c]["skill_vs_scaled_band"] = {"A": -0.004, "B": 0.003, "C": 0.001}[
                name
            ]
    line = report_tables.summary_lines(results)[-1]
    assert "band's quantiles close +0.00%, high +0.00%, low +0.00%, and against the band " in line
    assert "with the interval's own scale close +0.10%, high +0.10%, low +0.10%." in line
    assert line.endswith("with the mean range of the last 168-672 candles, at weight 0.25.")


def test_summary_counts_the_models_that_kept_their_refit_band():
    def entry(best_epoch, refit=True):
        test = {"columns": {"close": {"skill": 0.0}}}
        if refit:
            test["band_refit"] = {"high": [0.01], "low": [-0.02]}
        return {"best_epoch": best_epoch, "test": test}

    results = {
        "series": {"A": entry(None), "B": entry(3), "C": entry(None), "D": entry(None, False)}
    }
    line = report_tables.summary_lines(results)[-1]
    assert line.startswith("The volatility band was refit on train+val after training for 3 series")
    assert "2 of them kept the untrained band" in line
    results = {"series": {"D": entry(None, False)}}
    assert not any("refit" in x for x in report_tables.summary_lines(results))


def test_write_reports_files(tmp_path):
    workdir = str(tmp_path)
    names = ("BTCUSDT-1h", "ETHUSDT-1h")
    records = {n: forecast_record(n, i) for i, n in enumerate(names)}
    results = report_results(records)
    out = io.StringIO()
    path = report.write_reports(
        workdir,
        results,
        report_config(),
        report.PlotInputs(report_history(names), records),
        console=Console(file=out, width=250),
    )
    assert path == os.path.join(workdir, "report.md")
    printed = out.getvalue()
    assert "BTCUSDT-1h" in printed and "skipped LUNAUSDT-1h: only 10 usable candles" in printed
    with open(path) as f:
        md = f.read()
    assert "| BTCUSDT-1h | gru | stopped_early | 3 |" in md
    assert "- LUNAUSDT-1h: only 10 usable candles" in md
    assert "- wall_seconds: 9.5" in md and "- versions.jax: 0.10.2" in md
    plots = sorted(os.listdir(os.path.join(workdir, "plots")))
    expected = ["skill.png"] + [f"{k}-{n}.png" for k in ("forecast", "loss") for n in names]
    assert plots == sorted(expected)
    assert all(_is_png(os.path.join(workdir, "plots", p)) for p in plots)
    assert "![skill.png](plots/skill.png)" in md


def test_forecasts_read_from_saved_files_and_stem(tmp_path):
    workdir = str(tmp_path)
    rec = forecast_record("BTCUSDT-1h", 3)
    os.makedirs(os.path.join(workdir, "forecasts"))
    np.savez(os.path.join(workdir, "forecasts", "BTCUSDT-1h.npz"), **rec)
    results = report_results({"BTCUSDT-1h": rec})
    report.write_reports(
        workdir,
        results,
        report_config(),
        report.PlotInputs(history=[]),
        stem="eval-20240101-000000",
        console=Console(file=io.StringIO()),
    )
    folder = os.path.join(workdir, "plots", "eval-20240101-000000")
    assert sorted(os.listdir(folder)) == ["forecast-BTCUSDT-1h.png", "skill.png"]
    assert os.path.exists(os.path.join(workdir, "eval-20240101-000000.md"))
    assert not os.path.exists(os.path.join(workdir, "report.md"))


def test_plots_off(tmp_path):
    workdir = str(tmp_path)
    records = {"BTCUSDT-1h": forecast_record("BTCUSDT-1h", 0)}
    report.write_reports(
        workdir,
        report_results(records),
        report_config(plots=False),
        report.PlotInputs(forecasts=records),
        console=Console(file=io.StringIO()),
    )
    assert sorted(os.listdir(workdir)) == ["report.html", "report.md"]


def test_loss_curves_from_history():
    curves = plots.loss_curves(report_history(("A-1h", "B-1h")))
    epochs, train, val = curves["A-1h"]
    assert epochs == [1, 2, 3]
    np.testing.assert_allclose(val, [1.5, 0.75, 0.5])
    assert np.isnan(curves["B-1h"][1]).all()
