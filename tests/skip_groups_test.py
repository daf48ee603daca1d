"""Skip reasons summed up one line per reason (cpbjax/data/skip_groups.py), in the warnings
before training (sources.grouped_lines) and after the printed summary."""

from __future__ import annotations

import numpy as np

from cpbjax.data import skip_groups, sources
from cpbjax.data.series import Series
from cpbjax.report import run_report


def test_reasons_group_by_their_head_with_numbers_and_names_masked():
    skipped = {
        f"S{i}USDT-15m": f"no usable kline file up to 2025-03-01 in /m; 2024-0{i % 9 + 1}: missing"
        for i in range(40)
    }
    skipped["AUSDT-1h"] = "only 120 usable candles (900 loaded), need data.min_candles=500"
    skipped["BUSDT-1h"] = "only 80 usable candles (700 loaded), need data.min_candles=500"
    skipped["CUSDT-1h"] = "no CUSDT-1h.csv or .parquet in /d"
    skipped["DUSDT-1h"] = "no DUSDT-1h.csv or .parquet in /d"
    assert skip_groups.lines("skipped", skipped.items()) == [
        "skipped 40 series: no usable kline file up to 2025-03-01 in /m "
        "(S0USDT-15m, S10USDT-15m, S11USDT-15m and 37 more)",
        "skipped 2 series: no <series>.csv or .parquet in /d (CUSDT-1h, DUSDT-1h)",
        "skipped 2 series: only N usable candles (AUSDT-1h, BUSDT-1h)",
    ]
    one = {"FLAT-1h": "flat candles: the band has no window"}
    assert skip_groups.lines("skipped", one.items()) == [
        "skipped 1 series: flat candles: the band has no window (FLAT-1h)"
    ]


def test_before_training_one_warning_per_reason():
    def series(name, failed, dropped=0):
        notes = {"failed_months": failed, "dropped_rows": dropped}
        return Series(name, "1h", np.zeros(1, np.int64), np.ones((1, 5)), notes)

    loaded = [
        series("A", {"2023-01": "missing", "2023-02": "HTTP 500"}),
        series("B", {"2023-04": "missing"}, dropped=2),
        series("C", {}),
    ]
    assert sources.grouped_lines(loaded, {"X-1h": "no data", "Y-1h": "no data"}) == [
        "skipped 2 series: no data (X-1h, Y-1h)",
        "partly loaded 2 series: some months missing (A-1h, B-1h)",
        "partly loaded 1 series: invalid candles dropped (B-1h)",
        "partly loaded 1 series: some months HTTP 500 (A-1h)",
    ]


def test_printed_summary_sums_up_the_skipped():
    skipped = {f"S{i}-1h": "no data" for i in range(5)}
    console = run_report.Console(record=True, width=300)
    run_report.print_table({"series": {}, "skipped": skipped}, console)
    text = console.export_text()
    assert "skipped 5 series: no data (S0-1h, S1-1h, S2-1h and 2 more)" in text
    assert 'every series and its reason: results.json "skipped"' in text
    assert "skipped S4-1h" not in text
    assert run_report.skipped_lines({}) == []


def test_backtest_printout_sums_up_the_skipped():
    skipped = {f"S{i}-1h": "too few windows for 3 folds" for i in range(6)}
    console = run_report.Console(record=True, width=300)
    run_report.print_backtest({"pooled": {}, "skipped": skipped}, ["backtest.json"], console)
    text = console.export_text()
    assert "skipped 6 series: too few windows for 3 folds (S0-1h, S1-1h, S2-1h and 3 more)" in text
    assert 'every series and its reason: backtest.json "skipped"' in text
    assert "skipped S5-1h" not in text
