"""Tests for cpbjax/data/synthetic.py: determinism, OHLC invariants, stylised facts, mirrors."""

import hashlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from cpbjax.data import parsing, synthetic
from cpbjax.data.series import INTERVAL_MS

N = 6000


def _log_returns(series):
    close = series.ohlcv[:, 3]
    return np.log(close[1:] / close[:-1])


def test_deterministic_per_seed_symbol_interval():
    a = synthetic.generate("BTCUSDT", "1h", 500, seed=3)
    b = synthetic.generate("BTCUSDT", "1h", 500, seed=3)
    np.testing.assert_array_equal(a.ohlcv, b.ohlcv)
    np.testing.assert_array_equal(a.open_time_ms, b.open_time_ms)
    for other in (
        synthetic.generate("BTCUSDT", "1h", 500, seed=4),
        synthetic.generate("ETHUSDT", "1h", 500, seed=3),
        synthetic.generate("BTCUSDT", "15m", 500, seed=3),
    ):
        assert not np.allclose(other.ohlcv[:, 3] / other.ohlcv[0, 3], a.ohlcv[:, 3] / a.ohlcv[0, 3])


@pytest.mark.parametrize(
    "symbol,interval", [("BTCUSDT", "1h"), ("PEPEUSDT", "15m"), ("ZZZUSDT", "1d")]
)
def test_ohlc_invariants_and_grid(symbol, interval):
    s = synthetic.generate(symbol, interval, 3000)
    o, h, low, c, v = s.ohlcv.T
    assert s.ohlcv.dtype == np.float64 and s.open_time_ms.dtype == np.int64
    assert (low > 0).all() and np.isfinite(s.ohlcv).all() and (v > 0).all()
    assert (h >= np.maximum(o, c)).all()
    assert (low <= np.minimum(o, c)).all()
    assert (h > low).mean() > 0.99  # Candles have a real range, not just O=H=L=C.
    step = INTERVAL_MS[interval]
    assert (np.diff(s.open_time_ms) == step).all()
    assert s.open_time_ms[-1] == synthetic.END_MS // step * step
    assert s.open_time_ms[0] % step == 0


def test_price_level_depends_on_symbol():
    btc = synthetic.generate("BTCUSDT", "1h", 1000).ohlcv[:, 3]
    pepe = synthetic.generate("PEPEUSDT", "1h", 1000).ohlcv[:, 3]
    assert 5_000 < np.median(btc) < 500_000
    assert 1e-7 < np.median(pepe) < 1e-3


def test_heavy_tails_and_volatility_clustering():
    r = _log_returns(synthetic.generate("ETHUSDT", "1h", N))
    d = r - r.mean()
    kurtosis = np.mean(d**4) / np.mean(d**2) ** 2  # Gaussian: 3.
    assert kurtosis > 4.0
    a = np.abs(r) - np.abs(r).mean()
    autocorr_lag1 = np.sum(a[1:] * a[:-1]) / np.sum(a * a)
    assert autocorr_lag1 > 0.05
    # A shuffled copy keeps the tails but loses the clustering.
    shuffled = np.random.default_rng(0).permutation(a)
    assert np.sum(shuffled[1:] * shuffled[:-1]) / np.sum(a * a) < autocorr_lag1 / 2


def test_intraday_seasonality_in_volatility_and_volume():
    s = synthetic.generate("BTCUSDT", "1h", N)
    hour = (s.open_time_ms[1:] // 3_600_000) % 24
    abs_r = np.abs(_log_returns(s))
    volume = s.ohlcv[1:, 4] * s.ohlcv[1:, 3]  # In quote currency, free of the price level.
    busy, quiet = (hour >= 12) & (hour <= 17), hour <= 5
    assert abs_r[busy].mean() > 1.3 * abs_r[quiet].mean()
    assert volume[busy].mean() > 1.3 * volume[quiet].mean()


def _read_zip(path):
    with zipfile.ZipFile(path) as z:
        (member,) = z.namelist()
        return member, z.read(member).decode()


def test_write_vision_mirror_layout_checksums_and_units(tmp_path):
    months = ["2024-12", "2025-01"]
    written = synthetic.write_vision_mirror(str(tmp_path), ["BTCUSDT"], ["1h"], months, seed=1)
    folder = tmp_path / "data/spot/monthly/klines/BTCUSDT/1h"
    assert sorted(written) == [str(folder / f"BTCUSDT-1h-{m}.zip") for m in months]
    for month, unit in (("2024-12", 1), ("2025-01", 1000)):
        path = folder / f"BTCUSDT-1h-{month}.zip"
        digest, name = (folder / f"BTCUSDT-1h-{month}.zip.CHECKSUM").read_text().split()
        assert name == path.name
        assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
        member, text = _read_zip(path)
        assert member == f"BTCUSDT-1h-{month}.csv"
        rows = [line.split(",") for line in text.splitlines()]
        assert all(len(r) == 12 for r in rows) and rows[0][0].isdigit()  # No header.
        start = int(np.datetime64(f"{month}-01T00:00", "ms").astype(np.int64))
        assert int(rows[0][0]) == start * unit
        assert int(rows[0][6]) == (start + 3_600_000) * unit - 1  # close_time
        assert len(rows) == 31 * 24
    # The files hold the generated series, rounded to 8 decimals like Binance's.
    end_ms = int(np.datetime64("2025-02-01", "ms").astype(np.int64)) - 1
    series = synthetic.generate("BTCUSDT", "1h", 62 * 24, seed=1, end_ms=end_ms)
    parts = [parsing.read_kline_zip(Path(p).read_bytes(), p) for p in written]
    np.testing.assert_array_equal(np.concatenate([t for t, _ in parts]), series.open_time_ms)
    ohlcv = np.concatenate([v for _, v in parts])
    np.testing.assert_allclose(ohlcv, series.ohlcv, rtol=0, atol=1e-8)


def test_write_vision_mirror_daily_files(tmp_path):
    synthetic.write_vision_mirror(
        str(tmp_path), ["ETHUSDT"], ["15m"], ["2025-01"], days=["2025-02-01", "2025-02-02"]
    )
    daily = tmp_path / "data/spot/daily/klines/ETHUSDT/15m"
    assert sorted(os.listdir(daily)) == [
        "ETHUSDT-15m-2025-02-01.zip",
        "ETHUSDT-15m-2025-02-01.zip.CHECKSUM",
        "ETHUSDT-15m-2025-02-02.zip",
        "ETHUSDT-15m-2025-02-02.zip.CHECKSUM",
    ]
    _, text = _read_zip(daily / "ETHUSDT-15m-2025-02-02.zip")
    assert len(text.splitlines()) == 96
    # The monthly file ends where the first daily file begins: one gap-free series.
    monthly = tmp_path / "data/spot/monthly/klines/ETHUSDT/15m/ETHUSDT-15m-2025-01.zip"
    t_month, _ = parsing.read_kline_zip(monthly.read_bytes(), "m")
    t_day, _ = parsing.read_kline_zip((daily / "ETHUSDT-15m-2025-02-01.zip").read_bytes(), "d")
    assert t_day[0] - t_month[-1] == 900_000


def test_kline_csv_parses_back_exactly():
    s = synthetic.generate("SOLUSDT", "1h", 50)
    for microseconds in (False, True):
        csv = synthetic.kline_csv(s.open_time_ms, s.ohlcv, "1h", microseconds)
        times, ohlcv = parsing.read_kline_csv(csv, "x.csv")
        np.testing.assert_array_equal(times, s.open_time_ms)
        np.testing.assert_allclose(ohlcv, s.ohlcv, rtol=0, atol=1e-8)
        assert io.BytesIO(csv).readline().count(b",") == 11
