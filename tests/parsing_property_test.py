"""Property tests of cpbjax/data/parsing.py: any input ends in candles or a documented error.

The kline parsers (read_kline_csv, read_kline_zip, read_local_file) may raise only
KlineError, and build_series only SeriesSkipped or KlineError, whatever the bytes,
timestamps (ms, us, huge, negative), column names and column counts; and candles
written as a Binance kline CSV parse back to the same times and values.
"""

from __future__ import annotations

import io
import zipfile

import ml_collections
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cpbjax.data import local_files, parsing, synthetic
from cpbjax.data.series import INTERVAL_MS, SeriesSkipped

# Few examples and no deadline: the whole file runs in a few seconds on a 2-core CPU.
FAST = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
MAX_MS = 32_503_680_000_000  # 3000-01-01, the parsers' upper bound on open_time

# Timestamps of every kind a file may hold: ms, us, beyond int64, negative, off-grid.
TIMES = st.one_of(
    st.integers(1_500_000_000_000, 1_800_000_000_000),  # ms
    st.integers(1_500_000_000_000_000, 1_800_000_000_000_000),  # us
    st.integers(-(10**25), 10**25),  # anything, int64 overflow included
    st.integers(-1000, 1000),
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.sampled_from(["", "nan", "inf", "-0", "1e400", "abc", '"7"', "True"]),
)
FIELDS = st.one_of(TIMES.map(str), VALUES.map(str), st.text(max_size=6))


@st.composite
def csv_bodies(draw) -> bytes:
    """A CSV of 0-6 rows whose rows all have one column count (0-14), or not."""
    columns = draw(st.integers(0, 14))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        width = columns if draw(st.booleans()) else draw(st.integers(0, 14))
        row = [str(draw(TIMES))] + [draw(FIELDS) for _ in range(width - 1)]
        rows.append(",".join(row[:width]))
    header = draw(st.sampled_from(["", "open_time,open,high,low,close,volume\n", "\ufeffa,b\n"]))
    return (header + "\n".join(rows) + draw(st.sampled_from(["", "\n"]))).encode()


@FAST
@given(csv_bodies())
def test_any_csv_body_is_candles_or_a_kline_error(body):
    try:
        times, ohlcv = parsing.read_kline_csv(body, "x.csv")
    except parsing.KlineError as e:
        assert str(e).startswith("x.csv: ")
        return
    assert times.dtype == np.int64 and ohlcv.shape == (len(times), 5)
    assert ((times >= 0) & (times < MAX_MS)).all()


def _zip(members: dict[str, bytes], method=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@FAST
@given(
    csv_bodies(),
    st.sampled_from(["a.csv", "A.CSV", "a.txt"]),
    st.integers(0, 3),
    st.binary(max_size=8),
    st.integers(0, 400),
)
# A cut that leaves the local header offset before the file start: zipfile's own
# ValueError ("negative seek value") once escaped as that instead of a KlineError.
@example(body=b"\xef\xbb\xbfa,b\n", member="a.csv", copies=1, junk=b".", cut=113)
def test_any_zip_is_candles_or_a_kline_error(body, member, copies, junk, cut):
    """Zips of random CSVs, with 0-3 CSV members, cut short or with bytes flipped."""
    data = _zip({f"{i}{member}": body for i in range(copies)})
    damaged = [data, data[:cut], data[:cut] + junk + data[cut + len(junk) :]]
    for blob in damaged:
        try:
            parsing.read_kline_zip(blob, "x.zip", max_bytes=1 << 12)
        except parsing.KlineError as e:
            assert str(e).startswith("x.zip: ")


NAMES = st.sampled_from(
    ["open_time", "Timestamp", "DATE", "time", "open", "High", "low", "close", "volume", "Open"]
)
PLAUSIBLE = st.lists(st.integers(1, 9), min_size=3, max_size=3)  # prices and ms times
COLUMN = st.one_of(
    PLAUSIBLE,
    st.lists(TIMES, min_size=3, max_size=3),
    st.lists(VALUES, min_size=3, max_size=3),
    st.lists(st.sampled_from(["2024-01-01", "2024-01-01T01:00:00+02:00", "x", ""]), min_size=3),
)


@st.composite
def local_columns(draw) -> list[tuple[str, list]]:
    """(name, 3 values) per column: usually the needed names, plus 0-3 drawn ones, shuffled."""
    needed = ["time", "open", "high", "low", "close", "volume"]
    names = needed[: draw(st.integers(4, 6))] + draw(st.lists(NAMES, max_size=3))
    names = draw(st.permutations(names))
    clean = draw(st.booleans())  # Half the files are all plausible numbers: parse or name why.
    return [(name, draw(PLAUSIBLE if clean else COLUMN)) for name in names]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("local")


@FAST
@given(local_columns(), st.sampled_from([".csv", ".parquet"]))
def test_any_local_file_is_candles_or_a_kline_error(folder, columns, ext):
    """Random column names (duplicates in another case included) and values, CSV or Parquet."""
    path = folder / f"BTCUSDT-1h{ext}"
    header = ",".join(name for name, _ in columns)
    rows = [",".join(str(values[i]) for _, values in columns) for i in range(3)]
    path.write_text("\n".join([header, *rows]) + "\n")
    if ext == ".parquet":  # Random text is no Parquet; read_local_file must say so.
        path.write_bytes(path.read_bytes()[:64])
    try:
        times, ohlcv = local_files.read_local_file(str(path))
    except parsing.KlineError as e:
        assert str(e).startswith(path.name)
        return
    assert ohlcv.shape == (len(times), 5) and ((times >= 0) & (times < MAX_MS)).all()


PRICES = st.floats(allow_nan=True, allow_infinity=True)
ROW = st.tuples(st.integers(0, MAX_MS - 1), *[PRICES] * 5)


@FAST
@given(
    st.lists(st.lists(ROW, max_size=8), max_size=3),
    st.sampled_from(["skip_series", "drop_rows"]),
    st.integers(1, 5),
)
def test_build_series_gives_a_series_or_a_documented_error(parts, bad_rows, min_candles):
    arrays = [
        (np.array([r[0] for r in p], np.int64), np.array([r[1:] for r in p], np.float64))
        for p in parts
        if p
    ]
    cfg = ml_collections.ConfigDict({"bad_rows": bad_rows, "min_candles": min_candles})
    try:
        s = parsing.build_series("BTCUSDT", "1h", arrays, cfg)
    except (SeriesSkipped, parsing.KlineError):
        return
    assert len(s.open_time_ms) >= min_candles and np.isfinite(s.ohlcv).all()


@st.composite
def candles(draw):
    """Valid candles on the interval grid: (interval, times_ms [N], ohlcv [N, 5])."""
    interval = draw(st.sampled_from(["1m", "15m", "1h", "1d"]))
    step = INTERVAL_MS[interval]
    slots = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=30, unique=True))
    start = draw(st.integers(200_000_000_000, 30_000_000_000_000)) // step * step
    times = start + step * np.array(sorted(slots), np.int64)
    n = len(times)
    level = st.floats(1.0, 1000.0)
    o, c = (np.array(draw(st.lists(level, min_size=n, max_size=n))) for _ in range(2))
    spread = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    volume = np.array(draw(st.lists(st.floats(0.0, 1e9), min_size=n, max_size=n)))
    ohlcv = np.stack([o, np.maximum(o, c) + spread, np.minimum(o, c) - spread / 2, c, volume], 1)
    return interval, times, ohlcv.round(8)  # Binance writes 8 decimals.


@FAST
@given(candles(), st.booleans())
def test_written_candles_parse_back_to_the_same_times_and_values(drawn, microseconds):
    interval, times, ohlcv = drawn
    csv = synthetic.kline_csv(times, ohlcv, interval, microseconds)
    for got_times, got in (
        parsing.read_kline_csv(csv, "x.csv"),
        parsing.read_kline_zip(_zip({"x.csv": csv}), "x.zip"),
    ):
        np.testing.assert_array_equal(got_times, times)
        np.testing.assert_allclose(got, ohlcv, rtol=1e-15, atol=1e-8)
    cfg = ml_collections.ConfigDict({"bad_rows": "skip_series", "min_candles": 1})
    s = parsing.build_series("BTCUSDT", interval, [(times, ohlcv)], cfg)
    np.testing.assert_array_equal(s.open_time_ms, times)
    assert s.notes["dropped_rows"] == 0


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.sampled_from(["", "NA", "None", "<NA>", "+1", ".5", "1.", "1e5", " 1", '"3"', "0x1"]),
)


@st.composite
def kline_like_bodies(draw) -> bytes:
    """A CSV of 1-5 rows of numbers, 5-13 columns, mostly of one width (so that both readers
    often accept it), with or without a header, BOM or CRLF."""
    columns, rows = draw(st.integers(5, 13)), []
    for _ in range(draw(st.integers(1, 5))):
        width = columns if draw(st.booleans()) else draw(st.integers(4, 13))
        rows.append(",".join([str(draw(TIMES))] + [draw(NUMBERS) for _ in range(width - 1)]))
    head = draw(st.sampled_from(["", "\ufeff", "open_time,open\n"]))
    return (head + draw(st.sampled_from(["\n", "\r\n"])).join(rows) + "\n").encode()


@FAST
@given(st.one_of(kline_like_bodies(), csv_bodies()))
@example(synthetic.kline_csv(np.array([0, 3_600_000]), np.ones((2, 5)), "1h", False))
def test_the_fast_reader_reads_what_pandas_reads(body):
    """pyarrow's reader (the fast path) gives pandas' arrays, bit for bit, wherever it reads
    a file at all; the rest goes to pandas, which reads it or names what is wrong."""
    first = body[: body.find(b",")].strip().strip(b'"').lstrip(b"\xef\xbb\xbf")
    header = not first.lstrip(b"-").isdigit()
    fast = parsing._arrow_columns(body, header)
    if fast is None:
        return
    times, ohlcv = parsing._pandas_columns(body, header, "x.csv")
    assert fast[0].dtype == np.int64 and fast[0].tobytes() == times.tobytes()
    assert fast[1].dtype == np.float64 and fast[1].tobytes() == ohlcv.tobytes()


def test_a_binance_csv_takes_the_fast_reader(monkeypatch):
    """A month as Binance writes it never reaches pandas' reader (the slow path)."""
    times = 1_700_000_000_000 + 3_600_000 * np.arange(48)
    ohlcv = np.abs(np.random.default_rng(0).normal(100, 1, (48, 5))).round(8)
    monkeypatch.setattr(parsing, "_pandas_columns", None)  # calling it would raise
    for microseconds in (False, True):
        got = parsing.read_kline_csv(synthetic.kline_csv(times, ohlcv, "1h", microseconds), "x")
        np.testing.assert_array_equal(got[0], times)
        assert got[1].tobytes() == ohlcv.tobytes()
