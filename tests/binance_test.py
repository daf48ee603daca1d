"""Tests for cpbjax/data/binance.py: mirrors, month selection, and downloads with faults.

The HTTP tests serve a synthetic Binance Vision mirror from a local
ThreadingHTTPServer on 127.0.0.1 and inject faults per URL path.
"""

import collections
import datetime
import functools
import http.server
import os
import threading
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import binance, parsing, synthetic
from tests import fake_data
from tests.fake_data import damage_deflate

MONTHS = ["2024-10", "2024-11", "2024-12", "2025-01", "2025-02"]
HOURS = {"2024-10": 744, "2024-11": 720, "2024-12": 744, "2025-01": 744, "2025-02": 672}


def _ms(day: str) -> int:
    return int(np.datetime64(day, "ms").astype(np.int64))


def _cfg(base_url, cache_dir, symbols, **overrides):
    d = config_lib.base_config().data
    d.update(
        dict(
            base_url=str(base_url),
            cache_dir=str(cache_dir),
            symbols=tuple(symbols),
            intervals=("1h",),
            months=3,
            end="2025-02",
            min_candles=24,
            retries=2,
            timeout_seconds=10,  # no test here waits on it; 0.5 s failed on a loaded machine
            download_workers=4,
        )
    )
    d.update(overrides)
    return d


def _load(d):
    pairs = [(s, i) for s in d.symbols for i in d.intervals]
    return binance.load(d, pairs, today=datetime.date(2025, 3, 3))


def _mirror(root, symbols, seed=7):
    synthetic.write_vision_mirror(str(root), symbols, ["1h"], MONTHS, seed=seed)
    return root


def _zip(root, symbol, month):
    return os.path.join(root, f"data/spot/monthly/klines/{symbol}/1h/{symbol}-1h-{month}.zip")


def _reference(symbol, months, seed=7):
    """Times and OHLCV that write_vision_mirror wrote for `months`, from `generate`."""
    s = synthetic.generate(symbol, "1h", sum(HOURS.values()), seed, _ms("2025-03-01") - 1)
    keep = np.isin(
        s.open_time_ms.astype("datetime64[ms]").astype("datetime64[M]").astype(str), months
    )
    return s.open_time_ms[keep], s.ohlcv[keep]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    fake_data.fast_backoff(monkeypatch)


def test_end_month_and_month_arithmetic():
    assert binance.resolve_end("", datetime.date(2026, 11, 23)) == "2026-10"
    assert binance.resolve_end("", datetime.date(2026, 1, 1)) == "2025-12"
    assert binance.resolve_end("2024-03", datetime.date(2026, 1, 1)) == "2024-03"
    assert binance.months_back("2025-02", 4) == ["2025-02", "2025-01", "2024-12", "2024-11"]
    ref = binance.FileRef("BTCUSDT", "15m", "2025-03-04")
    assert ref.relpath == "data/spot/daily/klines/BTCUSDT/15m/BTCUSDT-15m-2025-03-04.zip"


def test_directory_mirror_mixes_ms_and_us_months(tmp_path):
    root = _mirror(tmp_path / "mirror", ["BTCUSDT"])
    loaded, skipped = _load(_cfg(root, tmp_path / "cache", ["BTCUSDT"]))
    assert skipped == {}
    s = loaded["BTCUSDT-1h"]
    times, ohlcv = _reference("BTCUSDT", ["2024-12", "2025-01", "2025-02"])
    np.testing.assert_array_equal(s.open_time_ms, times)  # 2024-12 in ms, 2025 in us.
    np.testing.assert_allclose(s.ohlcv, ohlcv, rtol=0, atol=1e-8)
    assert s.notes["months"] == ["2024-12", "2025-01", "2025-02"]
    assert (s.notes["gaps"], s.notes["failed_months"], s.notes["candles"]) == (0, {}, 2160)
    assert not (tmp_path / "cache").exists()  # A directory is read in place.


def test_file_url_mirror_matches_directory(tmp_path):
    root = _mirror(tmp_path / "mirror", ["ETHUSDT"])
    by_dir, _ = _load(_cfg(root, tmp_path / "c", ["ETHUSDT"]))
    by_url, _ = _load(_cfg(root.as_uri(), tmp_path / "c", ["ETHUSDT"]))
    np.testing.assert_array_equal(by_url["ETHUSDT-1h"].ohlcv, by_dir["ETHUSDT-1h"].ohlcv)
    assert by_url["ETHUSDT-1h"].notes == by_dir["ETHUSDT-1h"].notes


def test_directory_month_selection_holes_and_bad_files(tmp_path):
    root = _mirror(tmp_path / "mirror", ["BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT"])
    for month in ("2025-01", "2025-02"):  # ETH stops two months earlier than the others.
        os.remove(_zip(root, "ETHUSDT", month))
    os.remove(_zip(root, "SOLUSDT", "2025-01"))  # A hole.
    with open(_zip(root, "XRPUSDT", "2024-12"), "r+b") as f:  # A corrupted file.
        f.seek(100)
        f.write(b"corrupted")
    d = _cfg(root, tmp_path / "cache", ["BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT", "LTCUSDT"])
    loaded, skipped = _load(d)
    assert loaded["ETHUSDT-1h"].notes["months"] == ["2024-10", "2024-11", "2024-12"]
    assert loaded["ETHUSDT-1h"].notes["failed_months"] == {}
    sol = loaded["SOLUSDT-1h"].notes
    assert sol["months"] == ["2024-11", "2024-12", "2025-02"]
    assert sol["failed_months"] == {"2025-01": "missing from the mirror"}
    assert (sol["gaps"], sol["longest_gap"]) == (744, 744)
    xrp = loaded["XRPUSDT-1h"].notes
    assert xrp["months"] == ["2025-01", "2025-02"]
    assert xrp["failed_months"]["2024-12"].startswith("checksum mismatch")
    assert os.path.exists(_zip(root, "XRPUSDT", "2024-12"))  # A user's mirror is never edited.
    assert (
        set(skipped) == {"LTCUSDT-1h"}
        and "no usable kline file up to 2025-02" in skipped["LTCUSDT-1h"]
    )


def test_include_daily_adds_the_next_month_up_to_yesterday(tmp_path):
    root = tmp_path / "mirror"
    days = ["2025-03-01", "2025-03-02", "2025-03-03"]
    synthetic.write_vision_mirror(str(root), ["BTCUSDT"], ["1h"], MONTHS, seed=7, days=days)
    loaded, _ = _load(_cfg(root, tmp_path / "cache", ["BTCUSDT"], include_daily=True))
    s = loaded["BTCUSDT-1h"]
    assert s.notes["days"] == ["2025-03-01", "2025-03-02"]  # today (2025-03-03) is not complete.
    assert s.notes["last"] == "2025-03-02T23:00:00Z" and s.notes["gaps"] == 0


def test_bad_base_url_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="data.base_url.*not a directory"):
        _load(_cfg(tmp_path / "nope", tmp_path / "cache", ["BTCUSDT"]))


class _Faults:
    """Per-path fault queues (one fault per request) and request counts of a server."""

    def __init__(self):
        self.queues = collections.defaultdict(list)
        self.hits = collections.Counter()
        self.lock = threading.Lock()

    def next(self, path):
        with self.lock:
            self.hits[path] += 1
            return self.queues[path].pop(0) if self.queues[path] else None


class _Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, faults, **kwargs):
        self.faults = faults
        super().__init__(*args, **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        fault = self.faults.next(urllib.parse.urlparse(self.path).path)
        if fault in ("429", "500", "502", "503"):
            self.send_error(int(fault))
        elif fault == "html":
            self._send(b"<!DOCTYPE html><html><body>Service busy</body></html>", "text/html")
        elif fault == "truncate":
            body = Path(self.translate_path(self.path)).read_bytes()
            self._send(body[: len(body) // 2], "application/zip", length=len(body))
        else:
            super().do_GET()

    def _send(self, body, content_type, length=None):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length or len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # as tests/fake_exchange.py's: no SYN dropped in a burst

    def handle_error(self, request, client_address):
        pass  # Clients that time out close their sockets; that is expected here.


@pytest.fixture
def server(tmp_path):
    """(base_url, mirror root, faults) of a mirror served on 127.0.0.1:<random port>."""
    root = str(tmp_path / "served")
    os.makedirs(root)
    faults = _Faults()
    handler = functools.partial(_Handler, faults=faults, directory=root)
    httpd = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, faults
    httpd.shutdown()
    httpd.server_close()


def _url_path(symbol, month):
    return f"/data/spot/monthly/klines/{symbol}/1h/{symbol}-1h-{month}.zip"


def _cache_files(cache):
    return sorted(f for _, _, files in os.walk(cache) for f in files)


def _expected_cache(loaded):
    names = []
    for s in loaded.values():
        for month in s.notes["months"]:
            names += [f"{s.name}-{month}.zip", f"{s.name}-{month}.zip.CHECKSUM"]
    return sorted(names)


# Symbols of the fault test, and the month whose requests fail.
FAULT_SYMBOLS = (
    "BTCUSDT",
    "ETHUSDT",
    "BNBUSDT",
    "SOLUSDT",
    "PEPEUSDT",
    "XRPUSDT",
    "ADAUSDT",
    "LTCUSDT",
    "AVAXUSDT",
)
FAULTY = "2025-01"


def _inject_faults(root, faults):
    """Queues one server fault per request of FAULTY and damages XRPUSDT's and LTCUSDT's files."""
    faulty = FAULTY
    faults.queues[_url_path("BTCUSDT", faulty)] = ["500"]  # then success
    faults.queues[_url_path("ETHUSDT", faulty)] = ["502", "503"]  # retried into a success
    faults.queues[_url_path("BNBUSDT", faulty)] = ["429", "503"]
    faults.queues[_url_path("SOLUSDT", faulty)] = ["truncate", "truncate"]
    faults.queues[_url_path("PEPEUSDT", faulty)] = ["truncate"]  # fetched once more: fine
    faults.queues[_url_path("ADAUSDT", faulty)] = ["html", "html"]
    faults.queues[_url_path("AVAXUSDT", faulty)] = ["500"] * 10  # more than data.retries
    with open(_zip(root, "XRPUSDT", faulty) + ".CHECKSUM", "w") as f:
        f.write("0" * 64 + f"  XRPUSDT-1h-{faulty}.zip\n")
    for suffix in ("", ".CHECKSUM"):
        os.remove(_zip(root, "LTCUSDT", "2024-12") + suffix)


def test_http_download_with_injected_faults(server, tmp_path):
    base_url, root, faults = server
    symbols = list(FAULT_SYMBOLS)
    _mirror(root, symbols)
    faulty = FAULTY
    _inject_faults(root, faults)
    cache = tmp_path / "cache"
    loaded, skipped = _load(_cfg(base_url, cache, [*symbols, "DOGEUSDT"]))
    for symbol, hits in (("BTCUSDT", 2), ("ETHUSDT", 3), ("BNBUSDT", 3), ("PEPEUSDT", 2)):
        s = loaded[f"{symbol}-1h"]
        assert faults.hits[_url_path(symbol, faulty)] == hits, symbol
        assert s.notes["months"] == ["2024-12", "2025-01", "2025-02"], symbol
        assert s.notes["failed_months"] == {}, symbol
        np.testing.assert_allclose(s.ohlcv, _reference(symbol, MONTHS[2:])[1], atol=1e-8)
    for symbol, reason in (
        ("SOLUSDT", "download failed"),
        ("XRPUSDT", "checksum mismatch"),
        ("ADAUSDT", "got an HTML page instead of a zip"),
    ):
        notes = loaded[f"{symbol}-1h"].notes
        assert notes["months"] == ["2024-12", "2025-02"], symbol
        assert list(notes["failed_months"]) == [faulty], symbol
        assert notes["failed_months"][faulty].startswith(reason), (symbol, notes)
        assert " / then " in notes["failed_months"][faulty]  # It was fetched twice.
        assert faults.hits[_url_path(symbol, faulty)] == 2, symbol
    avax = loaded["AVAXUSDT-1h"].notes
    assert avax["failed_months"][faulty].startswith("HTTP 500 for http://127.0.0.1")
    assert faults.hits[_url_path("AVAXUSDT", faulty)] == 3  # 1 + data.retries, not fetched again.
    ltc = loaded["LTCUSDT-1h"].notes
    assert ltc["months"] == ["2024-11", "2025-01", "2025-02"]
    assert ltc["failed_months"] == {"2024-12": "missing (HTTP 404)"}
    assert "no usable kline file up to 2025-02" in skipped.pop("DOGEUSDT-1h")
    assert skipped == {}
    # The cache holds exactly the verified zips with their CHECKSUMs: nothing partial.
    assert _cache_files(cache) == _expected_cache(loaded)

    _assert_no_download_again(base_url, cache, symbols, loaded, faults)


def _assert_no_download_again(base_url, cache, symbols, loaded, faults):
    """A second run downloads no verified zip again and loads the same candles."""
    faults.hits.clear()
    again, _ = _load(_cfg(base_url, cache, symbols))
    for s in loaded.values():
        for month in s.notes["months"]:
            assert faults.hits[_url_path(s.symbol, month)] == 0, (s.name, month)
        np.testing.assert_array_equal(again[s.name].ohlcv[-672:], s.ohlcv[-672:])


def test_damaged_deflate_month_with_matching_checksum_skips_the_series_naming_the_file(tmp_path):
    root = _mirror(tmp_path / "mirror", ["BTCUSDT", "ETHUSDT"])
    damage_deflate(_zip(root, "ETHUSDT", "2025-01"))
    loaded, skipped = _load(_cfg(root, tmp_path / "cache", ["BTCUSDT", "ETHUSDT"]))
    assert list(loaded) == ["BTCUSDT-1h"]  # The run goes on with the other series.
    assert skipped["ETHUSDT-1h"].startswith("ETHUSDT-1h-2025-01.zip: damaged compressed data")


def test_zip_bomb_month_skips_the_series_naming_the_cap(tmp_path):
    root = _mirror(tmp_path / "mirror", ["BTCUSDT"])
    bomb = b"1" * (parsing.MIN_CSV_BYTES + 1)  # one byte over the 1h month's cap, ~1 KB zipped
    synthetic.write_zip(_zip(root, "BTCUSDT", "2025-01"), bomb)
    _, skipped = _load(_cfg(root, tmp_path / "cache", ["BTCUSDT"]))
    assert skipped["BTCUSDT-1h"].startswith(
        f"BTCUSDT-1h-2025-01.zip: BTCUSDT-1h-2025-01.csv unpacks to more than "
        f"{parsing.MIN_CSV_BYTES} bytes"
    )


def test_plain_http_mirror_warns_once_naming_the_url(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(binance, "_WARNED_PLAIN_HTTP", set())
    for _ in range(2):  # Two loads of one run (e.g. train, then evaluate) warn once.
        binance.open_mirror(_cfg("http://mirror.example:8080/v", tmp_path, ["BTCUSDT"]))
    for url in ("https://data.binance.vision", tmp_path.as_uri(), str(tmp_path)):
        binance.open_mirror(_cfg(url, tmp_path, ["BTCUSDT"]))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "http://mirror.example:8080/v" in warnings[0] and "not encrypted" in warnings[0]


@pytest.mark.parametrize(
    "url", ["http://..", "http://.", "http:///..", "https://../..", "http://127.0.0.1:1234/../x"]
)
def test_cache_folder_of_any_base_url_stays_inside_cache_dir(tmp_path, url):
    cache_dir = tmp_path / "cache"
    mirror = binance.open_mirror(_cfg(url, cache_dir, ["BTCUSDT"]))
    folder = Path(os.path.realpath(mirror.cache_root))
    assert folder.parent == Path(os.path.realpath(cache_dir)), (url, folder)
