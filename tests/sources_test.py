"""Tests for cpbjax/data/sources.py (registry, load_all, local, synthetic) and the data CLI."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import sources, synthetic
from cpbjax.data.series import Series, SeriesSkipped

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTE_KEYS = {
    "candles",
    "first",
    "last",
    "gaps",
    "longest_gap",
    "dropped_rows",
    "months",
    "failed_months",
}


def _data(**overrides):
    d = config_lib.base_config().data
    d.update(overrides)
    return d


@pytest.fixture
def fake_source():
    """Registers a source "fake" for one test, and removes it afterwards."""
    calls = []

    @sources.register("fake")
    def load_fake(data_cfg, pairs):
        calls.append(pairs)
        loaded = {
            f"{s}-{i}": Series(s, i, np.zeros(1, np.int64), np.ones((1, 5)))
            for s, i in pairs
            if s != "ETHUSDT"
        }
        skipped = {"ETHUSDT-1h": "no data"}
        return loaded, skipped

    yield calls
    del sources.SOURCES["fake"]


def test_registry_order_and_unreported_series(fake_source):
    d = _data(source="fake", symbols=("SOLUSDT", "ETHUSDT", "BTCUSDT"), intervals=("1h", "15m"))
    series, skipped = sources.load_all(d)
    assert fake_source == [
        [
            ("SOLUSDT", "1h"),
            ("SOLUSDT", "15m"),
            ("ETHUSDT", "1h"),
            ("ETHUSDT", "15m"),
            ("BTCUSDT", "1h"),
            ("BTCUSDT", "15m"),
        ]
    ]
    assert [s.name for s in series] == ["SOLUSDT-1h", "SOLUSDT-15m", "BTCUSDT-1h", "BTCUSDT-15m"]
    assert skipped == {"ETHUSDT-1h": "no data", "ETHUSDT-15m": "the source returned nothing"}


def test_registering_a_name_twice_or_loading_an_unknown_source_fails(fake_source):
    with pytest.raises(ValueError, match="'fake' is registered twice"):
        sources.register("fake")(lambda data_cfg, pairs: ({}, {}))
    assert set(sources.SOURCES) >= {"binance", "local", "synthetic"}
    with pytest.raises(ConfigError, match="data.source='nope'"):
        sources.load_all(_data(source="nope"))


def test_synthetic_source_is_reproducible_and_validated():
    d = _data(
        source="synthetic",
        symbols=("BTCUSDT", "PEPEUSDT"),
        synthetic_candles=700,
        min_candles=500,
        max_candles=600,
    )
    series, skipped = sources.load_all(d)
    again, _ = sources.load_all(d)
    assert skipped == {} and len(series) == 4
    for s, t in zip(series, again, strict=True):
        np.testing.assert_array_equal(s.ohlcv, t.ohlcv)
        assert set(s.notes) >= NOTE_KEYS and s.notes["candles"] == 700 and s.notes["gaps"] == 0
        ref = synthetic.generate(s.symbol, s.interval, 700, sources.SYNTHETIC_SEED)
        np.testing.assert_array_equal(s.ohlcv, ref.ohlcv)
    too_short, skipped = sources.load_all(
        _data(source="synthetic", symbols=("BTCUSDT",), synthetic_candles=100, min_candles=101)
    )
    assert too_short == []
    assert skipped == {
        n: "only 100 usable candles, need data.min_candles=101"
        for n in ("BTCUSDT-15m", "BTCUSDT-1h")
    }


def _frame(symbol, n=30):
    s = synthetic.generate(symbol, "1h", n)
    return s, pd.DataFrame(s.ohlcv, columns=["open", "high", "low", "close", "volume"])


def test_local_source_csv_iso_parquet_ms_missing_and_bad_files(tmp_path):
    btc, frame = _frame("BTCUSDT")
    iso = pd.to_datetime(btc.open_time_ms, unit="ms", utc=True).strftime("%Y-%m-%dT%H:%M:%SZ")
    frame.columns = ["Open", "HIGH", "low", "Close", "Volume"]
    frame.insert(0, "Date", iso)
    frame.sample(frac=1.0, random_state=0).to_csv(tmp_path / "btcusdt-1H.csv", index=False)
    eth, frame = _frame("ETHUSDT")
    frame.insert(0, "open_time", eth.open_time_ms)
    frame.to_parquet(tmp_path / "ETHUSDT-1h.parquet")
    sol, frame = _frame("SOLUSDT")
    frame.insert(0, "timestamp", sol.open_time_ms)
    frame.loc[5, "high"] = frame.loc[5, "low"] / 2  # One invalid candle.
    frame.to_csv(tmp_path / "SOLUSDT-1h.csv", index=False)
    d = _data(
        source="local",
        local_dir=str(tmp_path),
        intervals=("1h",),
        min_candles=20,
        symbols=("BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT"),
    )
    series, skipped = sources.load_all(d)
    by_name = {s.name: s for s in series}
    for ref in (btc, eth):
        np.testing.assert_array_equal(by_name[ref.name].open_time_ms, ref.open_time_ms)
        np.testing.assert_allclose(by_name[ref.name].ohlcv, ref.ohlcv, rtol=1e-15)
        assert set(by_name[ref.name].notes) >= NOTE_KEYS
    assert "1 invalid candles (1 high below max(open, close)" in skipped["SOLUSDT-1h"]
    assert skipped["XRPUSDT-1h"].startswith("no XRPUSDT-1h.csv or .parquet in")
    d.bad_rows = "drop_rows"
    series, _ = sources.load_all(d)
    assert {s.name: s.notes["dropped_rows"] for s in series}["SOLUSDT-1h"] == 1


def test_one_bad_series_never_stops_the_others(tmp_path):
    root = tmp_path / "mirror"
    synthetic.write_vision_mirror(str(root), ["BTCUSDT", "ETHUSDT"], ["1h"], ["2025-01"])
    bad = root / "data/spot/monthly/klines/ETHUSDT/1h/ETHUSDT-1h-2025-01.zip"
    csv = b"1735689600000,1,2,0.5,1.5,10,0,0,0,0,0,0\n1735689600000,1,2,0.5,1.6,10,0,0,0,0,0,0\n"
    synthetic.write_zip(str(bad), csv)  # Two different rows at one open_time.
    d = _data(
        base_url=str(root),
        symbols=("BTCUSDT", "ETHUSDT"),
        intervals=("1h",),
        months=1,
        end="2025-01",
        min_candles=100,
    )
    series, skipped = sources.load_all(d)
    assert [s.name for s in series] == ["BTCUSDT-1h"]
    assert skipped["ETHUSDT-1h"].startswith("ETHUSDT-1h-2025-01.zip: 1 open_time(s) with different")


def test_summary_lines_merge_runs_of_failed_months():
    s = Series(
        "BTCUSDT",
        "1h",
        np.zeros(1, np.int64),
        np.ones((1, 5)),
        {
            "failed_months": {
                "2023-01": "missing",
                "2023-02": "missing",
                "2023-03": "missing",
                "2023-05": "missing",
                "2023-06": "HTTP 500",
            },
            "dropped_rows": 2,
        },
    )
    lines = sources.summary_lines([s], {"ETHUSDT-1h": "no data"})
    assert lines == [
        "ETHUSDT-1h: skipped: no data",
        "BTCUSDT-1h: partly loaded: 2023-01..2023-03 missing; 2023-05 missing; 2023-06 HTTP 500; "
        "2 invalid candles dropped",
    ]
    assert isinstance(SeriesSkipped("x"), Exception)


def _cli(*args):
    return subprocess.run(
        [
            sys.executable,
            "launch.py",
            "--mode=data",
            "--config",
            os.path.join(REPO, "configs/transformer.py:tiny"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_cli_prints_one_row_per_series_and_rejects_bad_config():
    done = _cli("--config.data.symbols=('BTCUSDT','PEPEUSDT')")
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[0].split()[:4] == ["series", "candles", "first", "last"]
    assert [r.split()[0] for r in rows[1:5]] == [
        "BTCUSDT-15m",
        "BTCUSDT-1h",
        "PEPEUSDT-15m",
        "PEPEUSDT-1h",
    ]
    assert rows[1].split()[1] == "1400" and rows[1].split()[-1] == "ok"
    short = _cli("--config.data.symbols=('BTCUSDT',)", "--config.data.synthetic_candles=500")
    assert short.returncode == 0, short.stderr
    assert "BTCUSDT-1h" in short.stdout and "skipped: only 500 usable candles" in short.stdout
    bad = _cli("--config.data.months=-1")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: config.data.months=-1")


def test_the_old_data_command_names_the_new_one():
    done = subprocess.run(
        [sys.executable, "-m", "cpbjax.data", "--config", "configs/mlp.py"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    assert "python launch.py --mode data" in done.stderr.strip().splitlines()[-1]
