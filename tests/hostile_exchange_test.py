"""The REST klines source against a hostile local exchange (tests/fake_exchange.py's modes).

Every case must end quickly with one clear reason (a SeriesSkipped naming the URL or the
candle), never hang, never hold more than the body cap, and never pass bad candles on.
Deadlines are made small through the client's arguments; every server reply is bounded.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import cpbjax
from cpbjax.config import schema as config_lib
from cpbjax.data import http_client, klines_api, parsing, sources, synthetic
from cpbjax.data.series import SeriesSkipped
from tests import fake_data
from tests.fake_exchange import STEP, T0, FakeExchange, candles, hourly_exchange, rows, running

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOW = T0 + 2500 * STEP + STEP // 2  # half way through the candle opened at T0 + 2500 h
DEADLINE_S = 0.6  # one request's total deadline in these tests
BUDGET_S = 3.0  # one fetch's wall clock in these tests


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    fake_data.fast_backoff(monkeypatch)


@pytest.fixture
def exchange():
    ex = hourly_exchange()
    with running(ex) as api_url:
        yield api_url, ex


def _client(api_url, **kw):
    kw = dict(dict(budget_s=BUDGET_S), **kw)
    return http_client.Client(api_url, http_client.make_session(), DEADLINE_S, 2, **kw)


def _fetch(api_url, start=T0, now=NOW, **kw):
    return klines_api.fetch_recent("BTCUSDT", "1h", start, _client(api_url, **kw), now)


def _timed_failure(api_url, match, **kw):
    """The SeriesSkipped of a fetch that must fail within the budget, and its seconds."""
    started = time.monotonic()
    with pytest.raises(SeriesSkipped, match=match) as caught:
        _fetch(api_url, **kw)
    return caught.value, time.monotonic() - started


@pytest.mark.parametrize(
    "mode, got",
    [
        ("slow_body", r"\d+ bytes of the body"),
        ("slow_headers", "no headers"),  # each byte well inside the per-read timeout
        ("tarpit", "no headers"),
    ],
)
def test_a_slow_body_or_a_tarpit_ends_at_the_request_deadline(exchange, mode, got):
    api_url, ex = exchange
    ex.mode = mode
    error, seconds = _timed_failure(api_url, f"no complete answer from {api_url}.*{got}")
    assert isinstance(error, http_client.Unreachable) and error.why == "did not answer within 0.6 s"
    assert seconds < DEADLINE_S + 1.0 and len(ex.requests) == 1  # not retried


def test_a_tarpit_skips_the_other_series_unasked(exchange):
    api_url, ex = exchange
    ex.mode = "tarpit"
    d = config_lib.base_config().data
    d.update(dict(min_candles=100, retries=2, timeout_seconds=DEADLINE_S, api_url=api_url))
    t = T0 + np.arange(2000, dtype=np.int64) * STEP
    history = {
        f"{sym}-1h": parsing.build_series(sym, "1h", [(t, candles(t))], d)
        for sym in ("BTCUSDT", "ETHUSDT", "SOLUSDT")
    }
    started = time.monotonic()
    loaded, skipped = klines_api.top_up(history, {}, d, NOW)
    assert time.monotonic() - started < DEADLINE_S + 1.5 and loaded == {}
    assert skipped["BTCUSDT-1h"].startswith("fresh candles: no complete answer")
    assert skipped["SOLUSDT-1h"] == (
        f"fresh candles: not requested: {api_url} did not answer within 0.6 s for BTCUSDT-1h"
    )


def test_the_fetch_budget_bounds_a_slow_but_answering_exchange(exchange):
    api_url, ex = exchange
    ex.faults = [(503, {}, b"")] * 100  # retried with backoff until the budget ends
    error, seconds = _timed_failure(api_url, r"HTTP 503 .*after 2 retries", budget_s=0.5)
    assert seconds < 1.5 and len(ex.requests) == 3
    ex.faults = [(429, {"Retry-After": "0"}, b"")] * 10_000  # waited out, within the budget
    error, seconds = _timed_failure(api_url, "gave up after|budget of this fetch ran out")
    assert seconds < BUDGET_S + 1.0


def test_a_huge_retry_after_fails_at_once_saying_what_was_waited(exchange):
    api_url, ex = exchange
    ex.faults = [(429, {"Retry-After": "100000"}, b"")]
    error, seconds = _timed_failure(api_url, r"HTTP 429 .*Retry-After 100000 s would exceed")
    assert "waited 0.0 s so far" in str(error) and seconds < 1.0
    ex.faults = [(429, {"Retry-After": "1"}, b""), (429, {"Retry-After": "100000"}, b"")]
    error, seconds = _timed_failure(api_url, r"Retry-After 100000 s would exceed")
    assert "waited 1.0 s so far" in str(error) and 1.0 <= seconds < 2.0


def test_a_huge_body_stops_at_the_cap(exchange):
    api_url, ex = exchange
    ex.mode = "huge_body"  # never ends; the fake stops at 256 MiB
    error, seconds = _timed_failure(
        api_url, r"body from .* passed the 1048576 byte cap", max_body_bytes=1 << 20
    )
    assert seconds < 2.0
    ex.mode = "normal"  # a page of 1000 rows announced at about 140 KB
    _timed_failure(api_url, r"announced \d+ bytes, over the 65536 byte cap", max_body_bytes=1 << 16)


def test_rows_beyond_the_limit_are_refused(exchange):
    api_url, ex = exchange
    ex.mode = "beyond_limit"
    _timed_failure(api_url, r"2501 kline rows from .*beyond its limit=1000")


def test_a_gap_deep_in_the_past_does_not_end_the_paging(exchange, caplog):
    """A page made short by a gap (by time, as `time_pages` pages) is not the last one."""
    api_url, ex = exchange
    ex.mode = "time_pages"
    ex.times = np.delete(ex.times, [100, 1500, 1501])
    with caplog.at_level(logging.WARNING):
        times, _, report = _fetch(api_url)
    np.testing.assert_array_equal(times, ex.times[:-1])  # up to the newest closed candle
    assert report == {
        "gaps": [(T0 + 99 * STEP, T0 + 101 * STEP, 1), (T0 + 1499 * STEP, T0 + 1502 * STEP, 2)],
        "nothing_after_ms": None,
    }
    assert len(ex.requests) == 3  # the short first page did not end it
    for before, after, n in report["gaps"]:
        span = f"between {parsing.iso(before)} and {parsing.iso(after)} ({n} missing)"
        assert span in caplog.text


def test_an_exchange_that_stops_early_says_why_the_data_is_stale(exchange, caplog):
    api_url, ex = exchange
    ex.times = ex.times[:2000]  # nothing after T0 + 1999 h
    d = config_lib.base_config().data
    d.update(dict(min_candles=100, retries=2, timeout_seconds=DEADLINE_S, api_url=api_url))
    t = T0 + np.arange(1500, dtype=np.int64) * STEP
    history = parsing.build_series("BTCUSDT", "1h", [(t, candles(t))], d)
    with caplog.at_level(logging.WARNING):
        loaded, _ = klines_api.top_up({history.name: history}, {}, d, NOW)
    assert loaded["BTCUSDT-1h"].notes["fresh_nothing_after_ms"] == T0 + 2000 * STEP
    assert (
        f"BTCUSDT-1h: the newest candle after the top-up ({parsing.iso(T0 + 1999 * STEP)}) is "
        f"501 intervals old: the exchange returned nothing after {parsing.iso(T0 + 2000 * STEP)}"
    ) in caplog.text
    assert f"data.api_url {api_url} is plain http://" in caplog.text


def test_fresh_candles_that_do_not_continue_the_history_are_refused(exchange):
    # The exchange serves `candles` (about 120 at the seam) for every symbol; ETHUSDT's
    # history is 1,000 times higher, as a wrong symbol or a wrong unit would be.
    api_url, _ = exchange
    d = config_lib.base_config().data
    d.update(dict(min_candles=100, retries=2, timeout_seconds=DEADLINE_S, api_url=api_url))
    t = T0 + np.arange(2000, dtype=np.int64) * STEP
    history = {
        "BTCUSDT-1h": parsing.build_series("BTCUSDT", "1h", [(t, candles(t))], d),
        "ETHUSDT-1h": parsing.build_series("ETHUSDT", "1h", [(t, candles(t) * 1000)], d),
    }
    loaded, skipped = klines_api.top_up(history, {}, d, NOW)
    assert (
        list(loaded) == ["BTCUSDT-1h"] and loaded["BTCUSDT-1h"].open_time_ms[-1] == T0 + 2499 * STEP
    )
    last_close = candles(t[-1:])[0, 3] * 1000  # 120490.0
    first_open = candles([T0 + 2000 * STEP])[0, 0]  # 120.0
    assert skipped == {
        "ETHUSDT-1h": (
            "fresh candles: they do not continue the history: the first fresh candle "
            f"({parsing.iso(T0 + 2000 * STEP)}) opens at {first_open:.8g}, the history's last "
            f"close ({parsing.iso(int(t[-1]))}) is {last_close:.8g}, "
            f"{last_close / first_open:.3g} times apart (over 10: another symbol or price scale?)"
        )
    }
    assert "120490" in skipped["ETHUSDT-1h"] and "opens at 120," in skipped["ETHUSDT-1h"]


@pytest.mark.parametrize(
    "mode, rule, at",
    [
        ("future_open", "opens after now", T0 + 2501 * STEP),
        ("wrong_interval", r"closes at the wrong time for BTCUSDT-1h .*another interval", T0),
        ("wrong_spacing", "open_time off the interval grid", T0 + STEP // 2),
    ],
)
def test_impossible_candles_are_refused_naming_the_candle(exchange, mode, rule, at):
    api_url, ex = exchange
    ex.mode = mode
    _timed_failure(
        api_url, f"BTCUSDT-1h from {api_url}: the candle opening {parsing.iso(at)}.*{rule}"
    )


def test_inconsistent_prices_are_refused_naming_the_candle(exchange):
    api_url, ex = exchange
    times = T0 + np.arange(3, dtype=np.int64) * STEP
    bad = candles(times)
    bad[1, 2] = bad[1, 3] + 1  # low above the close
    body = str(rows(times, bad, STEP)).replace("'", '"').encode()
    ex.faults = [(200, {}, body)]
    _timed_failure(
        api_url, f"candle opening {parsing.iso(T0 + STEP)}.*low above min", now=T0 + 3 * STEP
    )


# -- --mode predict end to end: each case ends within 60 s, one clear line, no traceback --


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(workdir, newest history open time, its close): a tiny GRU on a 2-month mirror."""
    root = tmp_path_factory.mktemp("hostile")
    mirror, workdir = str(root / "mirror"), str(root / "run")
    synthetic.write_vision_mirror(mirror, ("BTCUSDT",), ("1h",), fake_data.last_complete_months(2))
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.source, c.data.base_url, c.data.months = "binance", mirror, 2
    c.data.symbols, c.data.intervals = ("BTCUSDT",), ("1h",)
    c.train.epochs, c.eval.plots = 1, False
    cpbjax.train(c, workdir)
    (series,), _ = sources.load_all(config_lib.validate(c).data)
    return workdir, int(series.open_time_ms[-1]), float(series.ohlcv[-1, 3])


def _live_exchange(last_ms: int, last_close: float) -> FakeExchange:
    """The fresh candles after the history up to now (+ the open one), flat at its close."""
    now_ms = int(time.time() * 1000)
    times = np.arange(last_ms + STEP, now_ms // STEP * STEP + STEP, STEP, dtype=np.int64)
    return FakeExchange(times, lambda t: np.tile([last_close] * 4 + [1.0], (len(t), 1)))


def _predict(workdir, api_url, *flags):
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "launch.py", "--mode=predict", f"--workdir={workdir}"]
        + [f"--config.data.api_url={api_url}", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, time.monotonic() - started


@pytest.mark.parametrize(
    "mode, fault, flags, reason",
    [
        # A 3 s deadline, not the default 30 s, which the tarpit would make the test wait.
        (
            "tarpit",
            None,
            ("--config.data.timeout_seconds=3",),
            r"no complete answer from .* within its deadline of 3 s",
        ),
        ("slow_body", None, ("--config.data.timeout_seconds=3",), r"bytes of the body by then"),
        ("future_open", None, (), r"the candle opening .* opens after now"),
        ("normal", (429, {"Retry-After": "100000"}, b""), (), r"HTTP 429 .*waited 0\.0 s"),
    ],
)
def test_predict_against_a_hostile_exchange_ends_with_one_line(trained, mode, fault, flags, reason):
    workdir, last_ms, last_close = trained
    ex = _live_exchange(last_ms, last_close)
    ex.mode, ex.faults = mode, [fault] if fault else []
    with running(ex) as api_url:
        proc, seconds = _predict(workdir, api_url, *flags)
    assert proc.returncode == 2 and seconds < 60, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no series could be forecast") and re.search(reason, last)
    assert "Traceback" not in proc.stderr


def test_predict_pages_past_a_gap_in_the_exchange_and_names_it(trained):
    workdir, last_ms, last_close = trained
    ex = _live_exchange(last_ms, last_close)
    ex.mode, ex.times = "time_pages", np.delete(ex.times, 3)  # one candle never traded
    with running(ex) as api_url:
        proc, seconds = _predict(workdir, api_url)
    assert proc.returncode == 0 and seconds < 60, proc.stderr[-3000:]
    span = (
        f"between {parsing.iso(int(ex.times[2]))} and {parsing.iso(int(ex.times[3]))} (1 missing)"
    )
    assert span in proc.stderr and "(up to date)" in proc.stdout


def test_a_gzipped_page_is_decoded_and_a_gzip_bomb_stops_at_the_cap(exchange):
    api_url, ex = exchange
    times = T0 + np.arange(3, dtype=np.int64) * STEP
    page = json.dumps(rows(times, candles(times), STEP)).encode()
    ex.faults = [(200, {"Content-Encoding": "gzip"}, gzip.compress(page))]
    got, ohlcv, _ = _fetch(api_url, now=T0 + 3 * STEP)
    np.testing.assert_array_equal(got, times)
    np.testing.assert_allclose(ohlcv, candles(times), rtol=0, atol=1e-8)
    bomb = gzip.compress(b"[" + b" " * (64 << 20) + b"]")  # 64 MiB of JSON in about 64 KB
    ex.faults = [(200, {"Content-Encoding": "gzip"}, bomb)]
    _timed_failure(api_url, r"passed the 1048576 byte cap", max_body_bytes=1 << 20)
