"""Tests of cpbjax/report/run_report.py: the table, report.md and the PNG plots.

The loss plot and the printed table are also checked on one tiny run trained in-process
(module fixture `kept`) whose series keep their untrained baseline.
"""

import io
import os

import numpy as np
import pytest
from rich.console import Console

from cpbjax import columns, writers
from cpbjax.modes import driver
from cpbjax.report import plots
from cpbjax.report import run_report as report
from cpbjax.report import spec as report_spec
from cpbjax.report import tables as report_tables
from tests import helpers
from tests.fake_data import forecast_record, report_config, report_history, report_results

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
    assert len(lines) == 4  # no series has a calibrated interval: no line for it
    assert lines[3] == (
        "Verdict (median test skill over 3 series, in points): close: 0.1 points above naive "
        "(level with it)."
    )


def test_summary_gives_the_interval_coverage_median_over_series():
    def entry(coverage, skill):
        cols = {c: {"coverage": coverage, "skill_vs_band": skill} for c in columns.COLUMNS}
        block = {"central": [0.1, 0.9], "columns": cols}
        test = {"columns": {"close": {"skill": 0.0}}, "calibrated_interval": block}
        return {"test": test}

    results = {"series": {"A": entry(0.7, -0.01), "B": entry(0.8, 0.02), "C": entry(0.9, 0.0)}}
    line = report_tables.summary_lines(results)[-2]  # [-1]: the verdict
    assert line.startswith("Calibrated 80% interval (q10-q90, fitted on train+val)")
    assert "median over 3 series: test coverage close 80.0%, high 80.0%, low 80.0%" in line
    assert "band's quantiles close +0.00%" in line
    assert line.endswith("Its scale is the window's EWMA range, as the band's.")  # saved before
    for name, candles in (("A", 168), ("B", 672), ("C", 672)):
        block = results["series"][name]["test"]["calibrated_interval"]
        block["scale"] = {"long_candles": candles, "long_weight": 0.25}
        for c in columns.COLUMNS:
            block["columns"][c]["skill_vs_scaled_band"] = {"A": -0.004, "B": 0.003, "C": 0.001}[
                name
            ]
    line = report_tables.summary_lines(results)[-2]
    assert "band's quantiles close +0.00%, high +0.00%, low +0.00%, and against the band " in line
    assert "with the interval's own scale close +0.10%, high +0.10%, low +0.10%." in line
    assert line.endswith("with the mean range of the last 168-672 candles, at weight 0.25.")


def test_summary_says_plainly_whether_high_and_low_beat_the_band():
    def entry(high_mae, low_mae):
        def cols(high, low):
            return {"close": {"skill": 0.0}, "high": {"mae": high}, "low": {"mae": low}}

        return {
            "test": {"columns": cols(high_mae, low_mae), "vol_band": {"columns": cols(2.0, 4.0)}}
        }

    # MAE against the band's 2.0 (high) and 4.0 (low): medians of 1 - model / band.
    ahead = {"A": entry(1.9, 4.0), "B": entry(2.0, 3.8), "C": entry(2.2, 3.9)}
    line = report_tables.summary_lines({"series": ahead})[-1]
    assert line == (
        "Verdict (median test skill over 3 series, in points): high: level with the volatility "
        "band; low: 2.5 points above the volatility band; close: level with naive."
    )
    behind = {"A": entry(2.0, 4.0), "B": entry(2.1, 4.4)}
    line = report_tables.summary_lines({"series": behind})[-1]
    assert line.startswith("Verdict (median test skill over 2 series, in points): high: 2.5 ")
    assert line.endswith(
        "The model does not beat the band here: its high and low are worth no more."
    )
    assert not any(
        "volatility band" in x
        for x in report_tables.summary_lines(
            {"series": {"A": {"test": {"columns": {"close": {"skill": 0.0}}}}}}
        )
    )


def test_summary_counts_the_models_that_kept_their_refit_band():
    def entry(best_epoch, refit=True):
        test = {"columns": {"close": {"skill": 0.0}}}
        if refit:
            test["band_refit"] = {"high": [0.01], "low": [-0.02]}
        return {"best_epoch": best_epoch, "test": test}

    results = {
        "series": {"A": entry(None), "B": entry(3), "C": entry(None), "D": entry(None, False)}
    }
    line = report_tables.summary_lines(results)[-2]  # [-1]: the verdict
    assert line.startswith("The volatility band was refit on train+val after training for 3 series")
    assert "2 of them kept the untrained band" in line
    results = {"series": {"D": entry(None, False)}}
    assert not any("refit" in x for x in report_tables.summary_lines(results))
    assert not any("kept" in x for x in report_tables.summary_lines(results))  # no val loss
    # Without a refit: the series that kept their baseline, and what they give.
    results["series"]["D"]["best_val_loss"] = 0.5
    results["series"]["E"] = {**entry(2, False), "best_val_loss": 0.4}
    line = report_tables.summary_lines(results)[-2]
    assert line.startswith("1 of 2 series kept the untrained band (no epoch beat it")
    # A fine-tuned run's bar was its starting model: that is what a series kept.
    tuned = {n: {**e, "started_from": "runs/base"} for n, e in results["series"].items()}
    assert report_tables.summary_lines({"series": tuned})[-2] == (
        "2 series started from runs/base (train.init_from); 1 of them kept that starting "
        "model (no epoch beat it on validation by train.min_delta)."
    )
    assert line.endswith(
        ": for those you get the band's forecast (the volatility band for high and low, the "
        "last close for close), and more data or one pooled model over many series "
        "(train.share=pooled) is what usually changes that."
    )


def test_write_reports_files(tmp_path):
    workdir = str(tmp_path)
    names = ("BTCUSDT-1h", "ETHUSDT-1h")
    records = {n: forecast_record(n, i) for i, n in enumerate(names)}
    results = report_results(records)
    out = io.StringIO()
    path = report.write_reports(
        workdir,
        results,
        report_spec.make_spec(report_config()),
        report.PlotInputs(report_history(names), records),
        console=Console(file=out, width=250),
    )
    assert path == os.path.join(workdir, "report.md")
    printed = out.getvalue()
    assert (
        "BTCUSDT-1h" in printed
        and "skipped 1 series: only 10 usable candles (LUNAUSDT-1h)" in printed
    )
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
        report_spec.make_spec(report_config()),
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
        report_spec.make_spec(report_config(plots=False)),
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


# -- a tiny run whose series keep their untrained baseline -------------------------------


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """(config, workdir, results) of a 1-series, 2-epoch run of the default objective (vol_band
    baseline, MAE / persistence MAE) with min_delta 1e3: no epoch beats the baseline by a
    thousand standard errors, so the series keeps it (best_epoch null), as 36 of the 40 demo
    series do."""
    c = helpers.tiny_config()
    c.data.symbols, c.train.epochs = ("BTCUSDT",), 2
    c.model.baseline, c.train.loss, c.train.loss_scale = "vol_band", "mae", "persistence"
    c.train.min_delta = 1e3
    workdir = str(tmp_path_factory.mktemp("kept"))
    results = driver.train_and_evaluate(c, workdir)
    return c, workdir, results


def test_the_loss_plot_marks_the_kept_baseline_at_epoch_0(kept):
    config, workdir, results = kept
    history = writers.MetricsLog(workdir).records()
    (name,) = results["series"]
    entry = results["series"][name]
    assert entry["best_epoch"] is None and entry["epochs_run"] == 2
    curve = plots.loss_curves(history)[name]
    ylabel = report.series_plot_spec(workdir, report_spec.make_spec(config)).loss_label
    ax = plots.loss_figure(name, curve, entry, ylabel).axes[0]
    assert ax.get_ylabel() == "loss (MAE / persistence MAE)"
    (star,) = [line for line in ax.get_lines() if line.get_label().startswith("kept")]
    # The untrained val loss: the loss epoch 1 had to beat and did not (metrics.jsonl).
    first = history[0]
    untrained = first["best_val_loss"][first["series"].index(name)]
    assert list(star.get_xdata()) == [0]
    assert star.get_ydata()[0] == pytest.approx(untrained)
    assert "epoch 0, the untrained baseline" in star.get_label()
    # Not the epoch of lowest val loss, which was not kept.
    assert ax.get_legend() is not None and min(curve[0]) == 1


def test_the_loss_plot_stars_a_kept_epoch_and_labels_mse():
    curve = plots.loss_curves(report_history(("A-1h", "B-1h")))["A-1h"]  # val 1.5, 0.75, 0.5
    config = report_config()
    config.train.loss, config.train.loss_scale = "mse", "none"
    entry = {"best_epoch": 2, "best_val_loss": 0.75, "status": "stopped_early"}
    ax = plots.loss_figure("A-1h", curve, entry, plots.loss_label(config.train)).axes[0]
    assert ax.get_ylabel() == "loss (MSE of normalised prices)"
    (star,) = [line for line in ax.get_lines() if line.get_label().startswith("kept")]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([2], [0.75])
    # An entry without best_epoch (not a trained run's) marks nothing.
    ax = plots.loss_figure("A-1h", curve, {}, "loss").axes[0]
    assert not [line for line in ax.get_lines() if line.get_label().startswith("kept")]


def test_the_printed_table_fits_80_columns(kept):
    _, _, results = kept
    results = {**results, "series": dict(results["series"])}
    (entry,) = results["series"].values()
    results["series"]["1000SHIBUSDT-15m"] = {**entry, "best_epoch": 12}  # a long name
    out = io.StringIO()
    report.print_table(results, Console(file=out, width=80))
    printed = out.getvalue()
    assert "…" not in printed and max(map(len, printed.splitlines())) <= 80
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if "USDT-" in line}
    close = entry["test"]["columns"]["close"]["skill"]
    band = entry["test"]["vol_band"]["columns"]["high"]["mae"]
    vs_band = 1 - entry["test"]["columns"]["high"]["mae"] / band
    assert rows["BTCUSDT-1h"][1:3] == ["0", f"{100 * close:+.2f}"]
    assert rows["BTCUSDT-1h"][5] == f"{100 * vs_band:+.2f}"
    assert rows["1000SHIBUSDT-15m"][1] == "12"
    coverage = entry["test"]["calibrated_interval"]["columns"]["close"]["coverage"]
    assert rows["BTCUSDT-1h"][-1] == f"{100 * coverage:.1f}"
    # The kept band is explained in one sentence of the summary.
    text = " ".join(printed.split())
    assert "after training for 2 series; 1 of them kept the untrained band" in text
    assert "you get the band's forecast (the volatility band for high and low" in text


def test_terminal_console_takes_the_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "97")
    assert report.terminal_console().width == 97
    monkeypatch.delenv("COLUMNS")

    def piped(fd):
        raise OSError(25, "Inappropriate ioctl for device")  # what a pipe answers

    monkeypatch.setattr(os, "get_terminal_size", piped)
    assert report.terminal_console().width == report.FALLBACK_WIDTH
