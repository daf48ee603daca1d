"""Tests for cpbjax/data/klines_api.py against a local server that plays the exchange."""

from __future__ import annotations

import json
import logging
import re
import socket

import numpy as np
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.data import http_client, klines_api, parsing
from cpbjax.data.series import SeriesSkipped
from tests import fake_data
from tests.fake_exchange import STEP, T0, candles, hourly_exchange, rows, running

HALF = STEP // 2


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    fake_data.fast_backoff(monkeypatch)


@pytest.fixture
def exchange():
    """(api_url, FakeExchange) on 127.0.0.1:<random port>; 2500 closed 1h candles + 1 open."""
    ex = hourly_exchange()
    with running(ex) as api_url:
        yield api_url, ex


NOW = T0 + 2500 * STEP + HALF  # Half way through the candle that opened at T0 + 2500 h.


def _fetch(api_url, start=T0, now=NOW, max_requests=None):
    """(times, ohlcv) of fetch_recent through a client with a 2 s deadline and 2 retries."""
    client = http_client.Client(api_url, http_client.make_session(), 2.0, 2)
    times, ohlcv, _ = klines_api.fetch_recent(
        "BTCUSDT", "1h", start, client, now, max_requests=max_requests
    )
    return times, ohlcv


def _status(code, retry_after=None, body=b""):
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    return code, headers, body


def test_pages_across_three_requests_and_drops_the_open_candle(exchange):
    api_url, ex = exchange
    times, ohlcv = _fetch(api_url)
    assert times.dtype == np.int64 and ohlcv.dtype == np.float64 and ohlcv.shape == (2500, 5)
    np.testing.assert_array_equal(times, ex.times[:2500])  # The open candle is dropped.
    np.testing.assert_allclose(ohlcv, candles(times), rtol=0, atol=1e-8)
    starts = [int(q["startTime"]) for q in ex.requests]
    assert starts == [T0, T0 + 1000 * STEP, T0 + 2000 * STEP]
    assert {q["endTime"] for q in ex.requests} == {str(NOW)}
    assert {(q["symbol"], q["interval"], q["limit"]) for q in ex.requests} == {
        ("BTCUSDT", "1h", "1000")
    }


def test_stops_when_a_full_page_reaches_now(exchange):
    api_url, ex = exchange
    times, _ = _fetch(api_url, now=T0 + 1000 * STEP)  # Exactly 1000 closed candles.
    assert len(times) == 1000 and len(ex.requests) == 1


def test_429_with_retry_after_0_then_success(exchange):
    api_url, ex = exchange
    ex.faults = [_status(429, 0)]
    times, _ = _fetch(api_url, start=T0 + 2000 * STEP)
    assert len(times) == 500 and len(ex.requests) == 2  # waited out and retried
    ex.faults = [_status(429, 0)]  # the retries count against the request limit
    with pytest.raises(SeriesSkipped, match=r"gave up after 2 requests"):
        _fetch(api_url, max_requests=2)


def test_418_then_success(exchange):
    api_url, ex = exchange
    ex.faults = [_status(418, 0)]
    times, _ = _fetch(api_url, start=T0 + 2000 * STEP)
    assert len(times) == 500 and len(ex.requests) == 2  # klines_api waited it out.


def test_retry_after_beyond_the_wait_budget_fails_at_once(exchange):
    api_url, ex = exchange
    ex.faults = [_status(418, 3600)]
    with pytest.raises(SeriesSkipped, match=r"HTTP 418 for http://127.*Retry-After 3600 s.*budget"):
        _fetch(api_url)
    assert len(ex.requests) == 1


def test_endless_bans_end_at_the_request_limit(exchange):
    api_url, ex = exchange
    ex.faults = [_status(418, 0)] * 50
    with pytest.raises(SeriesSkipped, match=r"gave up after 6 requests.*http://127"):
        _fetch(api_url, max_requests=6)
    assert len(ex.requests) == 6


def test_endless_full_pages_end_at_the_request_limit(exchange):
    api_url, ex = exchange
    ex.mode = "endless"  # One candle a page: paging by time would need 2500 requests.
    with pytest.raises(SeriesSkipped, match=r"gave up after 14 requests \(limit 14\)"):
        _fetch(api_url)  # 2500.5 h: 3 pages, + 1 short one, + EXTRA_REQUESTS = 14.
    assert len(ex.requests) == 14


def test_a_server_ignoring_start_time_is_caught(exchange):
    api_url, ex = exchange
    ex.mode = "ignore_start"
    with pytest.raises(SeriesSkipped, match=r"http://127.*paging would not advance"):
        _fetch(api_url)
    assert len(ex.requests) == 2


def test_a_gap_in_the_exchange_is_reported_never_filled(exchange, caplog):
    api_url, ex = exchange
    ex.times = np.delete(ex.times, np.arange(1200, 1205))  # 5 candles never traded.
    with caplog.at_level(logging.WARNING):
        times, _ = _fetch(api_url)
    assert len(times) == 2495
    assert parsing.gap_stats(times, STEP) == (5, 5)
    assert (
        f"the exchange has no candles between {parsing.iso(T0 + 1199 * STEP)} and "
        f"{parsing.iso(T0 + 1205 * STEP)} (5 missing), not filled"
    ) in caplog.text


@pytest.mark.parametrize(
    "fault, reason",
    [
        (_status(200, body=b"<!DOCTYPE html><html>busy</html>"), "got an HTML page"),
        (_status(200, body=b"[[1735689600000, "), "malformed JSON"),
        (_status(200, body=b'{"rows": []}'), "expected a JSON list of klines"),
        (_status(200, body=b'[[1735689600000, "1", "2", "0.5", "1"]]'), "row 0 has 5 columns"),
        (_status(200, body=b'[[1, "x", "2", "1", "1", "1", 2]]'), "non-numeric kline values"),
        (
            _status(400, body=b'{"code": -1121, "msg": "Invalid symbol."}'),
            r"HTTP 400 for .*: Invalid symbol\. \(code -1121\)",
        ),
    ],
)
def test_bad_replies_skip_the_series_naming_the_url(exchange, fault, reason):
    api_url, ex = exchange
    ex.faults = [fault]
    with pytest.raises(SeriesSkipped, match=reason) as caught:
        _fetch(api_url)
    assert f"{api_url}/api/v3/klines?symbol=BTCUSDT&interval=1h&startTime={T0}" in str(caught.value)
    assert len(ex.requests) == 1


def test_a_start_too_far_back_is_refused_before_any_request():
    with pytest.raises(SeriesSkipped, match="pages of 1000 candles before now"):
        _fetch("http://127.0.0.1:9", start=T0 - 30 * 365 * 24 * STEP)


def _hist(first, count):
    times = T0 + np.arange(first, first + count, dtype=np.int64) * STEP
    return times, candles(times)


def test_merge_overlap_keeps_the_history():
    history, recent = _hist(0, 10), _hist(7, 8)  # 7..9 in both.
    recent[1][1, 3] += 5.0  # The fresh source disagrees about candle 8's close.
    times, ohlcv, seam = klines_api.merge_with_history(*history, *recent, STEP)
    np.testing.assert_array_equal(times, T0 + np.arange(15) * STEP)
    np.testing.assert_array_equal(ohlcv[:10], history[1])
    np.testing.assert_array_equal(ohlcv[10:], recent[1][3:])
    assert seam == klines_api.Seam(3, 1, 0, int(history[0][-1]), int(recent[0][3]))


def test_merge_with_a_gap_reports_it():
    history, recent = _hist(0, 10), _hist(13, 3)  # Candles 10, 11, 12 missing.
    times, _, seam = klines_api.merge_with_history(*history, *recent, STEP)
    assert len(times) == 13 and (seam.overlap, seam.missing) == (0, 3)
    assert parsing.gap_stats(times, STEP) == (3, 3)  # Left as a gap.
    _, _, none_new = klines_api.merge_with_history(*history, *_hist(5, 3), STEP)
    assert (none_new.missing, none_new.fresh_first_ms, none_new.overlap) == (0, None, 3)


def test_newest_closed_age():
    times = T0 + np.arange(10, dtype=np.int64) * STEP  # Candle 9 closes at T0 + 10 h.
    assert klines_api.newest_closed_age(times, STEP, T0 + 10 * STEP) == 1  # Up to date.
    assert klines_api.newest_closed_age(times, STEP, T0 + 11 * STEP - 1) == 1
    assert klines_api.newest_closed_age(times, STEP, T0 + 12 * STEP + HALF) == 3
    assert klines_api.newest_closed_age(times, STEP, T0 + 9 * STEP + HALF) == 1  # 9 is open.
    with pytest.raises(ValueError, match="no candle closed"):
        klines_api.newest_closed_age(times[:1], STEP, T0 + HALF)


def _data_cfg(api_url):
    d = config_lib.base_config().data
    d.update(dict(min_candles=100, retries=2, timeout_seconds=2.0))
    d.api_url = api_url
    return d


def test_top_up_extends_a_history_series(exchange):
    api_url, ex = exchange
    d = _data_cfg(api_url)
    history = parsing.build_series("BTCUSDT", "1h", [_hist(0, 2000)], d, {"months": ["x"]})
    loaded, skipped = klines_api.top_up({history.name: history}, {"A-1h": "why"}, d, NOW)
    s = loaded["BTCUSDT-1h"]
    np.testing.assert_array_equal(s.open_time_ms, ex.times[:2500])
    assert [int(q["startTime"]) for q in ex.requests] == [T0 + 2000 * STEP]
    assert (s.notes["fresh_candles"], s.notes["seam_missing"], s.notes["months"]) == (500, 0, ["x"])
    assert skipped == {"A-1h": "why"}
    ex.faults = [_status(200, body=b"<html>")]
    loaded, skipped = klines_api.top_up({history.name: history}, {}, d, NOW)
    assert loaded == {} and skipped["BTCUSDT-1h"].startswith("fresh candles: got an HTML page")


def _two_histories(d):
    return {
        s.name: s
        for s in (
            parsing.build_series(symbol, "1h", [_hist(0, 2000)], d, {})
            for symbol in ("BTCUSDT", "ETHUSDT")
        )
    }


def test_top_up_goes_on_after_a_series_the_api_refuses(exchange):
    api_url, ex = exchange
    d = _data_cfg(api_url)
    ex.faults = [_status(400, body=b'{"code": -1121, "msg": "Invalid symbol."}')]
    loaded, skipped = klines_api.top_up(_two_histories(d), {}, d, NOW)
    assert list(loaded) == ["ETHUSDT-1h"] and len(loaded["ETHUSDT-1h"].open_time_ms) == 2500
    assert skipped["BTCUSDT-1h"].startswith("fresh candles: HTTP 400")


def test_top_up_asks_no_more_once_the_api_does_not_connect():
    with socket.socket() as sock:  # A port nothing listens on once this closes.
        sock.bind(("127.0.0.1", 0))
        api_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    d = _data_cfg(api_url)
    loaded, skipped = klines_api.top_up(_two_histories(d), {"A-1h": "why"}, d, NOW)
    assert loaded == {}
    assert re.match(r"fresh candles: request failed for .*ConnectionError", skipped["BTCUSDT-1h"])
    assert skipped["ETHUSDT-1h"] == (
        f"fresh candles: not requested: {api_url} did not connect for BTCUSDT-1h"
    )
    assert skipped["A-1h"] == "why"


def test_rows_are_sorted_and_exact_duplicates_dropped(exchange):
    api_url, ex = exchange
    times = T0 + np.array([2, 0, 1, 1], dtype=np.int64) * STEP
    ex.faults = [_status(200, body=json.dumps(rows(times, candles(times), STEP)).encode())]
    got, ohlcv = _fetch(api_url, now=T0 + 3 * STEP + HALF)  # one page reaches now
    np.testing.assert_array_equal(got, T0 + np.arange(3) * STEP)
    np.testing.assert_allclose(ohlcv, candles(got), rtol=0, atol=1e-8)
