"""Parses in worker processes (cpbjax/data/parse_pool.py) against the same parses in the
calling thread: the same arrays bit for bit, the same errors, and the same parsed-cache
entries. CSVs parsed in this process are counted by wrapping `parsing.read_kline_csv`
(a worker's parses do not reach the wrapper)."""

import datetime
import glob
import logging
import os
import signal
import threading
import time

import numpy as np
import pytest

from cpbjax import process_pool
from cpbjax.config import schema as config_lib
from cpbjax.data import binance, parse_pool, parsed_cache, parsing, synthetic

SYMBOLS, INTERVALS = ("BTCUSDT", "ETHUSDT"), ("1h", "15m")
MONTHS = ["2024-10", "2024-11", "2024-12", "2025-01"]
TODAY = datetime.date(2025, 2, 3)
CAP = parsing.DEFAULT_MAX_CSV_BYTES
# Two different candles at one open time: not valid klines.
BAD_CSV = synthetic.kline_csv(np.array([5, 5]), np.ones((2, 5)) * [[1], [2]], "1h", False)


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """Every core idle, whatever else the test machine runs (a busy one starts no pool)."""
    monkeypatch.setattr(process_pool, "idle_cores", lambda: 8.0)


@pytest.fixture
def mirror(tmp_path):
    root = tmp_path / "mirror"
    synthetic.write_vision_mirror(str(root), SYMBOLS, INTERVALS, MONTHS, seed=5)
    return root


def _zips(root) -> list[tuple[str, bytes, str]]:
    """(name, bytes, sha256 from its CHECKSUM) of every zip of the mirror."""
    found = []
    for path in sorted(glob.glob(str(root / "data/spot/monthly/klines/*/*/*.zip"))):
        with open(path, "rb") as f, open(path + ".CHECKSUM") as c:
            found.append((os.path.basename(path), f.read(), c.read().split()[0]))
    return found


def _ready(parser: parse_pool.Parser) -> None:
    """Waits until the parser's workers have started (until then misses parse in the
    calling thread)."""
    for started in parser._started:
        started.result(timeout=120)


def _same(a, b) -> None:
    assert [x.dtype for x in a] == [x.dtype for x in b]
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def test_workers_parse_and_store_what_the_thread_would(mirror, tmp_path, monkeypatch, csv_parses):
    monkeypatch.setattr(parse_pool, "MIN_PARSES", 0)
    zips = _zips(mirror)
    inline = {name: parsing.read_kline_zip(data, name, CAP) for name, data, _ in zips}
    cache = parsed_cache.ParsedCache(str(tmp_path / "pc"))
    with parse_pool.Parser(cache, workers=2) as parser:
        first = parser.klines(*zips[0], CAP)  # starts the pool, parsed here meanwhile
        assert parser._pool is not None
        _ready(parser)
        before = len(csv_parses)
        pooled = {name: parser.klines(name, data, sha, CAP) for name, data, sha in zips[1:]}
        assert len(csv_parses) == before  # every one parsed in a worker
        with pytest.raises(parsing.KlineError) as in_worker:
            parser.klines("bad.zip", _zip_bytes(tmp_path, BAD_CSV), "0" * 64, CAP)
    with pytest.raises(parsing.KlineError) as in_thread:
        parsing.read_kline_zip(_zip_bytes(tmp_path, BAD_CSV), "bad.zip", CAP)
    assert str(in_worker.value) == str(in_thread.value)
    for name, klines in {zips[0][0]: first, **pooled}.items():
        _same(klines, inline[name])
    for name, _, sha in zips:  # the workers' entries, read back here
        _same(cache.load(sha), inline[name])
    assert not os.path.exists(cache.path("0" * 64))  # an invalid zip is never stored


def _zip_bytes(tmp_path, csv: bytes) -> bytes:
    path = str(tmp_path / "bad" / "BAD-1h-2025-01.zip")
    synthetic.write_zip(path, csv)
    with open(path, "rb") as f:
        return f.read()


def test_an_unwritable_cache_is_warned_about_once_from_the_workers(
    mirror, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(parse_pool, "MIN_PARSES", 0)
    (tmp_path / "file").write_text("not a folder")
    cache = parsed_cache.ParsedCache(str(tmp_path / "file" / "pc"))
    zips, bad = _zips(mirror), _zip_bytes(tmp_path, BAD_CSV)
    with parse_pool.Parser(cache, workers=2) as parser, caplog.at_level(logging.WARNING):
        with pytest.raises(parsing.KlineError):  # starts the pool; nothing to store
            parser.klines("bad.zip", bad, "0" * 64, CAP)
        _ready(parser)
        got = [parser.klines(name, data, sha, CAP) for name, data, sha in zips]
    _same(got[-1], parsing.read_kline_zip(zips[-1][1], zips[-1][0], CAP))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "Cannot write to the parsed cache" in warnings[0], warnings


def _load(root, **overrides):
    d = config_lib.base_config().data
    d.update(base_url=str(root), symbols=SYMBOLS, intervals=INTERVALS, months=len(MONTHS))
    d.update(end=MONTHS[-1], min_candles=24, download_workers=4, **overrides)
    loaded, skipped = binance.load(d, [(s, i) for s in SYMBOLS for i in INTERVALS], today=TODAY)
    assert skipped == {}
    return loaded


def _started_pools(monkeypatch) -> list:
    """The pools parse_pool starts from now on, each with its workers up before it returns
    (so the load's misses go to them from the first)."""
    pools, spawn = [], process_pool.spawn

    def spawn_ready(workers):
        pool = spawn(workers)
        for started in [pool.submit(parse_pool._imported) for _ in range(workers)]:
            started.result(timeout=120)
        pools.append(pool)
        return pool

    monkeypatch.setattr(process_pool, "spawn", spawn_ready)
    return pools


def test_a_load_parsed_in_workers_is_the_serial_load(mirror, tmp_path, monkeypatch, csv_parses):
    serial = _load(mirror, parsed_cache="off")
    assert len(csv_parses) == len(_zips(mirror))  # below MIN_PARSES: all in this process
    monkeypatch.setattr(parse_pool, "MIN_PARSES", 0)
    monkeypatch.setattr(process_pool, "cores", lambda: 2)
    pools = _started_pools(monkeypatch)
    pooled = _load(mirror, parsed_cache=str(tmp_path / "pc"))
    assert len(pools) == 1
    assert sorted(pooled) == sorted(serial)
    for name, s in serial.items():
        _same((pooled[name].open_time_ms, pooled[name].ohlcv), (s.open_time_ms, s.ohlcv))
        assert pooled[name].notes == s.notes
    parsed = len(csv_parses)
    again = _load(mirror, parsed_cache=str(tmp_path / "pc"))  # every entry cached
    assert len(csv_parses) == parsed and len(pools) == 1  # no CSV read, no pool started
    for name, s in serial.items():
        _same((again[name].open_time_ms, again[name].ohlcv), (s.open_time_ms, s.ohlcv))


def test_a_small_load_parses_in_its_threads(mirror, monkeypatch, csv_parses):
    pools = _started_pools(monkeypatch)
    monkeypatch.setattr(process_pool, "cores", lambda: 2)
    _load(mirror, parsed_cache="off")
    assert len(csv_parses) == len(_zips(mirror)) < parse_pool.MIN_PARSES and pools == []


def test_a_pool_that_cannot_start_leaves_the_parses_to_the_threads(mirror, monkeypatch, caplog):
    serial = _load(mirror, parsed_cache="off")
    monkeypatch.setattr(parse_pool, "MIN_PARSES", 0)
    monkeypatch.setattr(process_pool, "cores", lambda: 2)

    def no_semaphores(workers):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(process_pool, "spawn", no_semaphores)
    with caplog.at_level(logging.WARNING):
        loaded = _load(mirror, parsed_cache="off")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "Cannot start parse workers" in warnings[0], warnings
    for name, s in serial.items():
        _same((loaded[name].open_time_ms, loaded[name].ohlcv), (s.open_time_ms, s.ohlcv))


def test_a_dead_worker_leaves_the_rest_to_the_threads(mirror, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(parse_pool, "MIN_PARSES", 0)
    zips = _zips(mirror)
    with parse_pool.Parser(None, workers=2) as parser, caplog.at_level(logging.WARNING):
        parser.klines(*zips[0], CAP)
        _ready(parser)
        pool = parser._pool
        os.kill(next(iter(pool._processes)), signal.SIGKILL)  # as the OOM killer would
        deadline = time.monotonic() + 60
        while not pool._broken and time.monotonic() < deadline:
            time.sleep(0.05)
        got = {name: parser.klines(name, data, sha, CAP) for name, data, sha in zips}
    for name, data, _ in zips:
        _same(got[name], parsing.read_kline_zip(data, name, CAP))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "A parse worker died" in warnings[0], warnings


def test_a_busy_machine_parses_in_the_threads(mirror, monkeypatch, csv_parses):
    serial = _load(mirror, parsed_cache="off")
    monkeypatch.setattr(parse_pool, "MIN_PARSES", 0)
    monkeypatch.setattr(process_pool, "cores", lambda: 2)
    monkeypatch.setattr(process_pool, "idle_cores", lambda: 0.4)
    pools = _started_pools(monkeypatch)
    loaded = _load(mirror, parsed_cache="off")
    assert pools == [] and len(csv_parses) == 2 * len(_zips(mirror))
    for name, s in serial.items():
        _same((loaded[name].open_time_ms, loaded[name].ohlcv), (s.open_time_ms, s.ohlcv))


def test_a_local_mirror_is_read_by_one_thread_per_core(mirror, monkeypatch):
    """More threads than cores only contend for the GIL on local reads (data.download_workers
    is 4 here): one core, one reading thread, and the same series."""
    readers, fetch = set(), binance.DirMirror.fetch

    def recorded(self, ref):
        readers.add(threading.get_ident())
        return fetch(self, ref)

    monkeypatch.setattr(binance.DirMirror, "fetch", recorded)
    monkeypatch.setattr(process_pool, "cores", lambda: 1)
    one_core = _load(mirror, parsed_cache="off")
    assert len(readers) == 1
    monkeypatch.setattr(process_pool, "cores", lambda: 3)
    assert binance.DirMirror(str(mirror)).fetch_threads(4) == 3
    assert binance.DirMirror(str(mirror)).fetch_threads(2) == 2
    for name, s in _load(mirror, parsed_cache="off").items():
        _same((one_core[name].open_time_ms, one_core[name].ohlcv), (s.open_time_ms, s.ohlcv))
