"""The parsed-array cache (cpbjax/data/parsed_cache.py) behind a Binance Vision mirror.

Every test points $XDG_CACHE_HOME or data.parsed_cache at its own tmp_path, and counts
the CSVs parsed by wrapping `parsing.read_kline_csv`, which every zip's parse calls.
"""

import datetime
import os
import shutil

import numpy as np
import pytest

from cpbjax import workdir
from cpbjax.config import schema as config_lib
from cpbjax.data import binance, mirrors, parsed_cache, synthetic
from cpbjax.data.progress import Progress

MONTHS = ["2024-11", "2024-12", "2025-01"]
TODAY = datetime.date(2025, 2, 3)


def _cfg(root, **overrides):
    d = config_lib.base_config().data
    d.update(base_url=str(root), symbols=("BTCUSDT",), intervals=("1h",), months=3)
    d.update(end="2025-01", min_candles=24, bad_rows="drop_rows", download_workers=2)
    d.update(overrides)
    return d


def _load(d):
    loaded, skipped = binance.load(d, [("BTCUSDT", "1h")], today=TODAY)
    assert skipped == {}
    return loaded["BTCUSDT-1h"]


def _zip(root, month):
    return os.path.join(root, f"data/spot/monthly/klines/BTCUSDT/1h/BTCUSDT-1h-{month}.zip")


def _rewrite_month(root, month, seed, bad_row=False):
    """Rewrites `month`'s zip and CHECKSUM with the candles of another seed; returns them."""
    s = synthetic.generate("BTCUSDT", "1h", 24 * 92, seed, _ms("2025-02-01") - 1)
    keep = s.open_time_ms.astype("datetime64[ms]").astype("datetime64[M]").astype(str) == month
    times, ohlcv = s.open_time_ms[keep], s.ohlcv[keep].copy()
    if bad_row:  # a high below its close: data.bad_rows=drop_rows drops it
        ohlcv[5, 1] = ohlcv[5, 3] / 2
    csv = synthetic.kline_csv(times, ohlcv, "1h", month >= synthetic.MICROSECONDS_FROM)
    synthetic.write_zip(_zip(root, month), csv)
    return times, ohlcv


def _ms(day: str) -> int:
    return int(np.datetime64(day, "ms").astype(np.int64))


@pytest.fixture
def mirror(tmp_path):
    """A three-month mirror whose 2024-12 holds one invalid candle (a dropped row)."""
    root = tmp_path / "mirror"
    synthetic.write_vision_mirror(str(root), ["BTCUSDT"], ["1h"], MONTHS, seed=3)
    _rewrite_month(root, "2024-12", seed=3, bad_row=True)
    return root


def _entries(folder) -> list[str]:
    found = [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]
    return sorted(found)


def _assert_same(a, b):
    np.testing.assert_array_equal(a.open_time_ms, b.open_time_ms)
    assert a.ohlcv.tobytes() == b.ohlcv.tobytes()
    assert (a.open_time_ms.dtype, a.ohlcv.dtype) == (b.open_time_ms.dtype, b.ohlcv.dtype)
    assert a.notes == b.notes


def test_a_second_load_reads_arrays_not_csv(mirror, tmp_path, monkeypatch, csv_parses):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    first = _load(_cfg(mirror))  # data.parsed_cache "auto": $XDG_CACHE_HOME/cpbjax/parsed
    assert len(csv_parses) == 3 and first.notes["dropped_rows"] == 1
    entries = _entries(tmp_path / "xdg" / "cpbjax" / "parsed")
    assert len(entries) == 3 and all(e.endswith(".klines") for e in entries)
    second = _load(_cfg(mirror))
    assert len(csv_parses) == 3  # no CSV read the second time
    _assert_same(first, second)  # dropped_rows, gaps, months... alike


@pytest.mark.parametrize("damage", ["flip", "truncate", "padded", "another_month"])
def test_a_damaged_entry_is_named_reparsed_and_rewritten(
    mirror, tmp_path, csv_parses, caplog, damage
):
    d = _cfg(mirror, parsed_cache=str(tmp_path / "pc"))
    first = _load(d)
    entry = parsed_cache.ParsedCache(str(tmp_path / "pc")).path(_sha256(mirror, "2024-12"))
    with open(entry, "rb") as f:
        good = bytearray(f.read())
    bad = good[: len(good) // 2] if damage == "truncate" else good.copy()
    if damage == "padded":
        bad += b"\0" * 8
    if damage == "flip":
        bad[len(bad) // 2] ^= 0x01  # inside the ohlcv array's bytes
    if damage == "another_month":  # an intact entry, of another zip: its digest tells
        with open(entry.replace(_sha256(mirror, "2024-12"), _sha256(mirror, "2024-11")), "rb") as f:
            bad = f.read()
    with open(entry, "wb") as f:
        f.write(bad)
    caplog.clear()
    second = _load(d)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and entry in warnings[0], warnings
    assert csv_parses[3:] == ["BTCUSDT-1h-2024-12.zip"]  # that month alone re-parsed
    _assert_same(first, second)
    with open(entry, "rb") as f:
        assert f.read() != bytes(bad)  # rewritten...
    assert parsed_cache.ParsedCache(str(tmp_path / "pc")).load(_sha256(mirror, "2024-12"))
    caplog.clear()
    _assert_same(first, _load(d))  # ...and trusted again, silently
    assert len(csv_parses) == 4 and not caplog.records


def _sha256(root, month) -> str:
    with open(_zip(root, month) + ".CHECKSUM") as f:
        return f.read().split()[0]


def test_a_changed_zip_misses_the_cache_and_loads_its_new_candles(mirror, tmp_path, csv_parses):
    d = _cfg(mirror, parsed_cache=str(tmp_path / "pc"))
    first = _load(d)
    times, ohlcv = _rewrite_month(mirror, "2025-01", seed=11)
    second = _load(d)
    assert csv_parses[3:] == ["BTCUSDT-1h-2025-01.zip"]
    new = np.isin(second.open_time_ms, times)
    np.testing.assert_array_equal(second.open_time_ms[new], times)
    np.testing.assert_allclose(second.ohlcv[new], ohlcv, rtol=0, atol=1e-8)
    assert not np.allclose(first.ohlcv[np.isin(first.open_time_ms, times)], ohlcv)
    np.testing.assert_array_equal(second.ohlcv[~new], first.ohlcv[~new])
    assert len(_entries(tmp_path / "pc")) == 4  # the old month's entry stays, unused


def test_off_writes_nothing(mirror, tmp_path, monkeypatch, csv_parses):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    d = _cfg(mirror, parsed_cache="off")
    _assert_same(_load(d), _load(d))
    assert len(csv_parses) == 6  # both loads parse every month
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()


def test_the_setting_names_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    want = str(tmp_path / "cpbjax" / "parsed")

    def named(setting):
        return workdir.cache_setting(setting, parsed_cache.FOLDER)

    assert named("auto") == named("") == want
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert named("") == str(tmp_path / "home" / ".cache/cpbjax/parsed")
    assert named("~/pc") == str(tmp_path / "home" / "pc")
    assert named("off") is None


def test_an_http_mirrors_cached_zips_are_parsed_once(mirror, tmp_path, csv_parses):
    # The zips sit in the HTTP mirror's download cache already: no request is made.
    cache = parsed_cache.ParsedCache(str(tmp_path / "pc"))
    http = mirrors.HttpMirror(
        "https://vision.test", str(tmp_path / "dl"), None, Progress("off"), cache
    )
    ref = mirrors.FileRef("BTCUSDT", "1h", "2025-01")
    os.makedirs(os.path.dirname(os.path.join(http.cache_root, ref.relpath)))
    for suffix in ("", ".CHECKSUM"):
        shutil.copy(
            _zip(mirror, "2025-01") + suffix, os.path.join(http.cache_root, ref.relpath) + suffix
        )
    first, second = http.fetch(ref), http.fetch(ref)
    assert (first.status, second.status, csv_parses) == ("ok", "ok", ["BTCUSDT-1h-2025-01.zip"])
    assert all((a == b).all() for a, b in zip(first.klines, second.klines, strict=True))
    assert os.path.exists(cache.path(_sha256(mirror, "2025-01")))
