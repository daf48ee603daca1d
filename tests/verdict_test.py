"""The verdict line (cpbjax/report/verdict.py) on fabricated results entries."""

from __future__ import annotations

from cpbjax.report import run_report, verdict
from cpbjax.report import tables as report_tables
from tests import fake_data


def _entry(close_skill, high_mae, low_mae, baseline=None):
    """A results entry: close skill against naive, high/low MAE against the band's 1.0."""
    cols = {"close": {"skill": close_skill}, "high": {"mae": high_mae}, "low": {"mae": low_mae}}
    band = {"high": {"mae": 1.0}, "low": {"mae": 1.0}}
    entry = {"test": {"columns": cols, "vol_band": {"columns": band}}}
    if baseline is not None:
        entry["baseline_columns"] = baseline
    return entry


def test_verdict_names_each_column_in_points_with_level_under_one_point():
    series = {
        "A": _entry(0.004, 1.002, 0.990),
        "B": _entry(0.020, 1.001, 0.960),
        "C": _entry(0.012, 1.003, 0.970),
    }
    assert verdict.verdict_lines({"series": series}) == [
        "Verdict (median test skill over 3 series, in points): "
        "high: 0.2 points below the volatility band (level with it); "
        "low: 3.0 points above the volatility band; close: 1.2 points above naive."
    ]


def test_a_column_no_series_corrects_names_its_baseline():
    series = {
        "A": _entry(0.0, 0.998, 0.998, baseline=["open", "close"]),
        "B": _entry(0.0, 0.996, 1.0, baseline=["open", "close", "low"]),
    }
    (line,) = verdict.verdict_lines({"series": series})
    assert line.endswith(
        "high: 0.3 points above the volatility band (level with it); low: 0.1 points above "
        "the volatility band (level with it) (1 of 2 series forecast it by the volatility "
        "band); close: the last close (the model does not correct it)."
    )


def test_no_scores_no_verdict_and_the_printed_summary_ends_with_it():
    assert verdict.verdict_lines({"series": {}}) == []
    assert verdict.points_phrase(-1.0, "naive") == "1.0 points below naive"
    assert verdict.points_phrase(0.0, "naive") == "level with naive"
    results = {"series": {"A": _entry(0.05, 0.9, 0.8)}}
    summary = report_tables.summary_lines(results)
    assert summary[-1].startswith("Verdict (median test skill over 1 series")
    records = {"BTCUSDT-1h": fake_data.forecast_record("BTCUSDT-1h", 0)}
    console = run_report.Console(record=True, width=200)
    run_report.print_table(fake_data.report_results(records), console)
    assert "Verdict (median test skill over 1 series" in console.export_text()
