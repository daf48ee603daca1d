"""Tests for cpbjax/data/parsing.py: CSV/zip/local parsing and every validation rule."""

import io
import re
import zipfile

import ml_collections
import numpy as np
import pandas as pd
import pytest

from cpbjax.data import local_files, parsing, synthetic
from cpbjax.data.series import SeriesSkipped
from tests import references
from tests.fake_data import damage_deflate

H = 3_600_000  # 1h in ms
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def _cfg(bad_rows="skip_series", min_candles=1):
    return ml_collections.ConfigDict({"bad_rows": bad_rows, "min_candles": min_candles})


def _candles(n=6):
    """n gap-free 1h candles from T0 with valid OHLCV: (times [n], ohlcv [n, 5])."""
    times = T0 + H * np.arange(n, dtype=np.int64)
    close = 100.0 + np.arange(n)
    o = close - 0.5
    ohlcv = np.stack([o, close + 1, o - 1, close, np.full(n, 10.0)], axis=1)
    return times, ohlcv


def _csv(times, ohlcv, header=False) -> bytes:
    lines = ["open_time,open,high,low,close,volume,close_time,qv,n,tb,tq,ignore"] if header else []
    for t, row in zip(times, ohlcv, strict=True):
        lines.append(
            ",".join([str(t), *map(repr, map(float, row)), str(t + 1), "0", "0", "0", "0", "0"])
        )
    return ("\n".join(lines) + "\n").encode()


def test_reads_headerless_csv_in_ms_and_us_alike():
    times, ohlcv = _candles()
    t_ms, v_ms = parsing.read_kline_csv(_csv(times, ohlcv), "a.csv")
    t_us, v_us = parsing.read_kline_csv(_csv(times * 1000, ohlcv), "b.csv")
    np.testing.assert_array_equal(t_ms, times)
    np.testing.assert_array_equal(t_us, times)
    np.testing.assert_array_equal(v_ms, ohlcv)
    np.testing.assert_array_equal(v_us, ohlcv)


def test_header_row_is_skipped():
    times, ohlcv = _candles()
    t, v = parsing.read_kline_csv(_csv(times, ohlcv, header=True), "futures.csv")
    np.testing.assert_array_equal(t, times)
    np.testing.assert_array_equal(v, ohlcv)


def test_mixed_units_in_one_file_is_an_error_naming_it():
    times, ohlcv = _candles()
    times = times.copy()
    times[3:] *= 1000
    with pytest.raises(parsing.KlineError, match="mixed.csv.*milliseconds and microseconds"):
        parsing.read_kline_csv(_csv(times, ohlcv), "mixed.csv")


def test_unsorted_rows_are_sorted_and_exact_duplicates_dropped():
    times, ohlcv = _candles()
    order = np.array([3, 0, 5, 1, 1, 4, 2, 3])
    t, v = parsing.read_kline_csv(_csv(times[order], ohlcv[order]), "x.csv")
    np.testing.assert_array_equal(t, times)
    np.testing.assert_array_equal(v, ohlcv)


def test_same_open_time_with_different_rows_is_an_error_naming_the_file():
    times, ohlcv = _candles()
    other = ohlcv[2].copy()
    other[3] += 0.25
    csv = _csv(np.append(times, times[2]), np.vstack([ohlcv, other]))
    with pytest.raises(
        parsing.KlineError, match=r"BTCUSDT-1h-2024-01.csv: 1 open_time.*2024-01-01T02:00"
    ):
        parsing.read_kline_csv(csv, "BTCUSDT-1h-2024-01.csv")


def test_bad_csv_and_bad_zip_name_the_file():
    with pytest.raises(parsing.KlineError, match="short.csv"):
        parsing.read_kline_csv(b"1704067200000,1,2,0.5\n", "short.csv")
    with pytest.raises(parsing.KlineError, match="words.csv"):
        parsing.read_kline_csv(b"1704067200000,a,b,c,d,e,0,0,0,0,0,0\n", "words.csv")
    with pytest.raises(parsing.KlineError, match="page.zip: not a valid zip"):
        parsing.read_kline_zip(b"<html>oops</html>", "page.zip")


def test_reads_zip_member():
    times, ohlcv = _candles()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("X-1h-2024-01.csv", _csv(times, ohlcv))
    t, v = parsing.read_kline_zip(buf.getvalue(), "X-1h-2024-01.zip")
    np.testing.assert_array_equal(t, times)
    np.testing.assert_array_equal(v, ohlcv)


def _corrupt(rule):
    """Valid candles with candle 2 broken by `rule`; returns (times, ohlcv)."""
    times, ohlcv = _candles()
    times, ohlcv = times.copy(), ohlcv.copy()
    if rule == "zero":
        ohlcv[2, 2] = 0.0  # low
    elif rule == "negative":
        ohlcv[2, :4] = -1.0
    elif rule == "nan":
        ohlcv[2, 0] = np.nan
    elif rule == "inf":
        ohlcv[2, 1] = np.inf
    elif rule == "high":
        ohlcv[2, 1] = ohlcv[2, 3] - 0.1  # high below close
    elif rule == "low":
        ohlcv[2, 2] = ohlcv[2, 0] + 0.1  # low above open
    elif rule == "grid":
        times[2] += 60_000  # 02:01, off the 1h grid
    elif rule == "volume":
        ohlcv[2, 4] = -5.0
    elif rule == "jump":
        ohlcv[2, :4] *= 1e300  # A spike that is still finite and well-formed.
    return times, ohlcv


RULES = {
    "zero": "non-positive or non-finite price",
    "negative": "non-positive or non-finite price",
    "nan": "non-positive or non-finite price",
    "inf": "non-positive or non-finite price",
    "high": "high below max(open, close)",
    "low": "low above min(open, close)",
    "grid": "open_time off the interval grid",
    "volume": "negative or non-finite volume",
    "jump": "implausible price jump",
}


def _walks(seed: int, n: int = 600):
    """OHLC prices [N, 4]: a random walk whose total range the seed sets, some far
    beyond JUMP_FACTOR (a long trend with no jump), some broken by spikes and holes."""
    rng = np.random.default_rng(seed)
    drift = rng.choice([0.0, 0.01, 0.05])  # 0.05 over 600 candles: a factor of 1e13
    close = np.exp(np.cumsum(rng.normal(drift, 0.02, n)))
    prices = close[:, None] * np.exp(rng.normal(0, 0.01, (n, 4)))
    if seed % 3 == 1:  # a spike of a few candles, and one just under the factor
        prices[200:203] *= 10.0 ** rng.uniform(6.5, 300)
        prices[400, 1] = prices[400, 3] * parsing.JUMP_FACTOR * 0.999
    if seed % 4 == 2:  # prices other rules reject take no part
        prices[rng.integers(0, n, 20), rng.integers(0, 4, 20)] = [np.nan, 0.0, -1.0, np.inf] * 5
    return prices


@pytest.mark.parametrize("seed", range(12))
def test_price_jumps_are_those_of_the_rolling_median_everywhere(seed):
    prices = _walks(seed)
    got = parsing._price_jumps(prices)
    np.testing.assert_array_equal(got, references.reference_price_jumps(prices))
    if seed % 3 == 1:
        assert got[200:203].all()


def test_a_range_at_the_factor_is_no_jump():
    prices = np.full((60, 4), 1.0)
    prices[30, 1] = parsing.JUMP_FACTOR  # exactly the factor away: not beyond it
    assert not parsing._price_jumps(prices).any()
    prices[30, 1] = np.nextafter(parsing.JUMP_FACTOR, np.inf) * 1.0000001
    assert parsing._price_jumps(prices)[30] and references.reference_price_jumps(prices)[30]


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_skips_the_series_with_its_reason(rule):
    times, ohlcv = _corrupt(rule)
    first_bad = parsing.iso(times[2])
    with pytest.raises(
        SeriesSkipped,
        match=rf"1 invalid candles \(1 {re.escape(RULES[rule])}\), first at {first_bad}",
    ):
        parsing.build_series("BTCUSDT", "1h", [(times, ohlcv)], _cfg())


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_drops_the_row_under_drop_rows(rule):
    times, ohlcv = _corrupt(rule)
    s = parsing.build_series("BTCUSDT", "1h", [(times, ohlcv)], _cfg("drop_rows"))
    keep = np.arange(6) != 2
    np.testing.assert_array_equal(s.open_time_ms, times[keep])
    np.testing.assert_array_equal(s.ohlcv, ohlcv[keep])
    assert s.notes["dropped_rows"] == 1 and s.notes["candles"] == 5
    assert s.notes["gaps"] == 1  # The dropped candle leaves a hole; nothing is filled in.


def test_a_run_of_spiked_candles_is_dropped_whole_and_nothing_else():
    times, ohlcv = _candles(40)
    ohlcv = ohlcv.copy()
    ohlcv[10:14, :4] *= 1e300  # Four candles in a row: the middle ones look calm to each other.
    ohlcv[0, :4] /= 1e9  # A spike down on the very first candle, which has no predecessor.
    s = parsing.build_series("BTCUSDT", "1h", [(times, ohlcv)], _cfg("drop_rows"))
    keep = np.ones(40, bool)
    keep[[0, 10, 11, 12, 13]] = False
    np.testing.assert_array_equal(s.open_time_ms, times[keep])
    assert s.notes["dropped_rows"] == 5


def test_valid_candles_pass_every_rule():
    times, ohlcv = _candles()
    masks = parsing.invalid_rows(times, ohlcv, H)
    assert set(masks) == set(RULES.values()) and not np.any(list(masks.values()))


def test_too_few_candles_is_skipped_with_reason():
    times, ohlcv = _candles(6)
    with pytest.raises(SeriesSkipped, match=r"only 6 usable candles, need data.min_candles=7"):
        parsing.build_series("BTCUSDT", "1h", [(times, ohlcv)], _cfg(min_candles=7))
    # Dropped rows do not count as usable.
    times, ohlcv = _corrupt("nan")
    with pytest.raises(SeriesSkipped, match="only 5 usable"):
        parsing.build_series("BTCUSDT", "1h", [(times, ohlcv)], _cfg("drop_rows", 6))


def test_gaps_are_counted_never_filled_and_parts_merged():
    times, ohlcv = _candles(20)
    keep = np.ones(20, bool)
    keep[[3, 10, 11, 12]] = False  # one missing candle, then a run of three
    parts = [(times[keep][8:], ohlcv[keep][8:]), (times[keep][:8], ohlcv[keep][:8])]
    s = parsing.build_series("ETHUSDT", "1h", parts, _cfg(), {"months": ["2024-01"]})
    np.testing.assert_array_equal(s.open_time_ms, times[keep])
    assert (s.notes["gaps"], s.notes["longest_gap"], s.notes["candles"]) == (4, 3, 16)
    assert s.notes["first"] == "2024-01-01T00:00:00Z" and s.notes["last"] == "2024-01-01T19:00:00Z"
    assert s.notes["months"] == ["2024-01"] and s.notes["failed_months"] == {}
    assert s.name == "ETHUSDT-1h" and s.notes["dropped_rows"] == 0


def test_files_disagreeing_on_a_candle_is_an_error():
    times, ohlcv = _candles()
    other = ohlcv.copy()
    other[:, 4] += 1
    with pytest.raises(parsing.KlineError, match="ETHUSDT-1h: 6 open_time"):
        parsing.build_series("ETHUSDT", "1h", [(times, ohlcv), (times, other)], _cfg())


def test_local_csv_with_iso_times_and_mixed_case_columns(tmp_path):
    times, ohlcv = _candles()
    frame = pd.DataFrame(ohlcv, columns=["Open", "HIGH", "low", "Close", "VoLuMe"])
    frame.insert(0, "Timestamp", pd.to_datetime(times, unit="ms").strftime("%Y-%m-%d %H:%M:%S"))
    frame.iloc[::-1].to_csv(tmp_path / "a.csv", index=False)
    t, v = local_files.read_local_file(str(tmp_path / "a.csv"))
    np.testing.assert_array_equal(t, times)
    np.testing.assert_allclose(v, ohlcv)


@pytest.mark.parametrize("unit", ["ms", "us", "datetime"])
def test_local_parquet_with_epoch_ms_us_or_datetimes(tmp_path, unit):
    times, ohlcv = _candles()
    frame = pd.DataFrame(ohlcv, columns=list(parsing.OHLCV))
    column = {"ms": times, "us": times * 1000, "datetime": pd.to_datetime(times, unit="ms")}
    frame.insert(0, "open_time", column[unit])
    frame.to_parquet(tmp_path / "a.parquet")
    t, v = local_files.read_local_file(str(tmp_path / "a.parquet"))
    np.testing.assert_array_equal(t, times)
    np.testing.assert_array_equal(v, ohlcv)


def test_local_file_missing_columns_names_the_file(tmp_path):
    pd.DataFrame({"date": ["2024-01-01"], "open": [1.0], "close": [1.0]}).to_csv(
        tmp_path / "BTCUSDT-1h.csv", index=False
    )
    with pytest.raises(
        parsing.KlineError, match=r"BTCUSDT-1h.csv: .*missing \['high', 'low', 'volume'\]"
    ):
        local_files.read_local_file(str(tmp_path / "BTCUSDT-1h.csv"))


@pytest.mark.parametrize("names", ["time,open,Open", "time,TIME,open"])
def test_local_file_with_a_column_in_two_cases_names_it(tmp_path, names):
    pd.DataFrame(
        [[T0, 1, 2, 3, 0.5, 1, 1]], columns=[*names.split(","), *parsing.OHLCV[1:]]
    ).to_csv(tmp_path / "a.csv", index=False)
    twice = "open" if "Open" in names else "time"
    with pytest.raises(parsing.KlineError, match=rf"a.csv: columns \['{twice}'\] appear more"):
        local_files.read_local_file(str(tmp_path / "a.csv"))


def test_gap_stats_and_iso_reference():
    times = np.array([0, 1, 2, 5, 6, 10]) * H
    assert parsing.gap_stats(times, H) == (2 + 3, 3)
    assert parsing.iso(T0) == "2024-01-01T00:00:00Z"
    assert parsing.months_of(np.array([T0, T0 + 40 * 24 * H])) == ["2024-01", "2024-02"]


def test_damaged_deflate_stream_is_a_kline_error_naming_the_file(tmp_path):
    times, ohlcv = _candles(200)
    path = str(tmp_path / "BTCUSDT-1h-2024-01.zip")
    synthetic.write_zip(path, synthetic.kline_csv(times, ohlcv, "1h", False))
    damage_deflate(path)
    with open(path, "rb") as f:
        data = f.read()
    with pytest.raises(parsing.KlineError, match="BTCUSDT-1h-2024-01.zip: damaged"):
        parsing.read_kline_zip(data, "BTCUSDT-1h-2024-01.zip")


@pytest.mark.parametrize("value", ["99999999999999999999999", "-99999999999999999999999"])
def test_open_time_beyond_int64_is_a_kline_error_naming_the_file(value):
    csv = f"{value},1,2,0.5,1.5,3,0,0,0,0,0,0\n".encode()
    with pytest.raises(parsing.KlineError, match="huge.csv: "):
        parsing.read_kline_csv(csv, "huge.csv")


@pytest.mark.parametrize("value", ["9223372036854775807", "-5", "99999999999999"])
def test_open_time_outside_the_calendar_is_a_kline_error_naming_the_file(value):
    csv = f"{value},1,2,0.5,1.5,3,0,0,0,0,0,0\n".encode()
    with pytest.raises(parsing.KlineError, match="far.csv: open_time .* outside"):
        parsing.read_kline_csv(csv, "far.csv")


def test_local_file_with_huge_epoch_is_a_kline_error_naming_it(tmp_path):
    (tmp_path / "a.csv").write_text(
        "open_time,open,high,low,close,volume\n99999999999999999999999,1,2,0.5,1.5,3\n"
    )
    with pytest.raises(parsing.KlineError, match="a.csv: "):
        local_files.read_local_file(str(tmp_path / "a.csv"))


def test_zip_bomb_stops_at_the_decompressed_size_cap(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("BOMB-1h-2024-01.csv", b"1" * (8 << 20))  # 8 MiB of one byte: ~8 KB zipped
    cap = parsing.csv_byte_cap("1h", "2024-01")
    assert cap == parsing.MIN_CSV_BYTES  # 744 candles x 512 bytes are below the floor.
    with pytest.raises(parsing.KlineError, match=rf"BOMB-1h-2024-01.zip: .*more than {cap} bytes"):
        parsing.read_kline_zip(buf.getvalue(), "BOMB-1h-2024-01.zip", max_bytes=cap)


def test_csv_byte_cap_follows_interval_and_period():
    month_1m = 31 * 24 * 60
    assert parsing.csv_byte_cap("1m", "2024-01") == month_1m * parsing.MAX_ROW_BYTES
    assert parsing.csv_byte_cap("1m", "2024-02") == 29 * 24 * 60 * parsing.MAX_ROW_BYTES
    assert parsing.csv_byte_cap("1m", "2024-01-05") == parsing.MIN_CSV_BYTES  # 1440 rows
    assert month_1m * parsing.MAX_ROW_BYTES == parsing.DEFAULT_MAX_CSV_BYTES
