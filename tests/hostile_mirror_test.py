"""The Binance Vision downloader against a hostile local mirror (tests/fake_vision.py's modes).

Every case must end within seconds (deadlines made small through the config: one request
DEADLINE_S, one file FILE_S) with a named skip, one warning for the whole download, or a
ConfigError naming the URL and the fix (launch.py: one line, exit 2), never hang, and
never hold more than the body cap.
"""

from __future__ import annotations

import datetime
import logging
import re
import socket
import time

import numpy as np
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import binance, http_client, mirrors, synthetic
from tests import fake_data, fake_vision, helpers
from tests.fake_vision import HUGE_BODY_BYTES, FakeVision, running

DEADLINE_S = 0.5  # one request's total deadline (data.timeout_seconds) in these tests
FILE_S = 3.0  # one file's (data.download_deadline_s)
SYMBOLS = ("BTCUSDT", "ETHUSDT", "SOLUSDT")
MONTHS = ("2024-12", "2025-01", "2025-02")
WORKERS = 4  # fewer than the 6 files of a load (3 series x data.months=2)
NO_DNS = "http://nonexistent.invalid"  # .invalid never resolves (RFC 2606)
SKIPPED_LINE = "the remaining downloads are skipped"


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    fake_data.fast_backoff(monkeypatch)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("vision"))
    synthetic.write_vision_mirror(folder, SYMBOLS, ("1h",), MONTHS)
    return folder


@pytest.fixture
def vision(root):
    v = FakeVision(root)
    with running(v) as base_url:
        yield base_url, v


def _cfg(base_url, cache_dir, **overrides):
    d = config_lib.base_config().data
    d.update(
        dict(
            base_url=str(base_url),
            cache_dir=str(cache_dir),
            parsed_cache="off",
            symbols=SYMBOLS,
            intervals=("1h",),
            months=2,
            end="2025-02",
            min_candles=24,
            retries=2,
            timeout_seconds=DEADLINE_S,
            download_deadline_s=FILE_S,
            download_workers=WORKERS,
        )
    )
    d.update(overrides)
    return d


def _load(d):
    """(loaded, skipped, seconds) of binance.load."""
    started = time.monotonic()
    pairs = [(s, i) for s in d.symbols for i in d.intervals]
    loaded, skipped = binance.load(d, pairs, today=datetime.date(2025, 3, 3))
    return loaded, skipped, time.monotonic() - started


def _closed_port_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize(
    "mode, got",
    [
        ("drip", r"\d+ bytes of the body by then"),
        ("slow_head", "no headers"),
        ("tarpit", "no headers"),
    ],
)
def test_a_host_that_does_not_answer_in_time_is_one_warning_and_the_rest_unasked(
    vision, tmp_path, caplog, mode, got
):
    base_url, v = vision
    v.mode = mode
    with caplog.at_level(logging.WARNING):
        loaded, skipped, seconds = _load(_cfg(base_url, tmp_path, download_workers=2))
    assert loaded == {} and sorted(skipped) == [f"{s}-1h" for s in sorted(SYMBOLS)]
    assert seconds < 2 * DEADLINE_S + 2.0  # two rounds of stalls open the breaker
    said = [r.getMessage() for r in caplog.records if SKIPPED_LINE in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"data.base_url {base_url} did not answer within {DEADLINE_S:g} s")
    # Each worker's stall before the breaker opened may start one more request; no more.
    assert len(v.zip_requests()) <= 2 + http_client.SLOW_STRIKES - 1 < 2 * len(SYMBOLS)
    reasons = " | ".join(skipped.values())
    assert re.search(rf"no complete answer from {base_url}/\S+\.zip .*{got}", reasons), reasons
    assert f"not requested: {base_url} did not answer within {DEADLINE_S:g} s" in reasons


def test_one_stall_fails_its_own_file_and_the_download_goes_on(vision, tmp_path, caplog):
    base_url, v = vision
    v.faults = [fake_vision.STALL]  # the first zip asked for gets no answer
    with caplog.at_level(logging.WARNING):
        loaded, skipped, _ = _load(_cfg(base_url, tmp_path))
    assert skipped == {} and sorted(loaded) == [f"{s}-1h" for s in sorted(SYMBOLS)]
    assert not [r for r in caplog.records if SKIPPED_LINE in r.getMessage()]
    assert len(v.zip_requests()) == 2 * len(SYMBOLS)  # every file asked for, the stalled once
    failed = [n for n, s in loaded.items() if s.notes.get("failed_months")]
    assert len(failed) == 1, {n: s.notes for n, s in loaded.items()}


@pytest.mark.parametrize("where", ["refused", "no DNS"])
def test_a_host_that_does_not_connect_ends_the_load_naming_the_url_and_the_fix(tmp_path, where):
    base_url = _closed_port_url() if where == "refused" else NO_DNS
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        _load(_cfg(base_url, tmp_path))
    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert message.startswith(f"config.data.base_url={base_url!r} is not allowed: expected a host")
    assert f"request failed for {base_url}/data/spot/monthly/klines/" in message
    assert "point --config.data.base_url at a local mirror" in message and "\n" not in message


def test_a_huge_zip_stops_at_the_cap_unread_beyond_it(vision, tmp_path, monkeypatch):
    base_url, v = vision
    monkeypatch.setattr(mirrors, "MAX_ZIP_BYTES", 1 << 20)
    v.mode = "huge"  # 1 GiB of body with no Content-Length
    loaded, skipped, seconds = _load(_cfg(base_url, tmp_path / "a", symbols=("BTCUSDT",)))
    assert loaded == {} and "passed the 1048576 byte cap; stopped reading" in skipped["BTCUSDT-1h"]
    # What the server could write before the client hung up: the cap plus socket buffers.
    # Each reply's handler records its bytes once its write fails on the closed socket,
    # which on a loaded machine can come after the load returned: wait for both records.
    deadline = time.monotonic() + 10.0
    while len(v.sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(v.sent) == 2 and max(v.sent) < 32 << 20 < HUGE_BODY_BYTES and seconds < 10
    v.mode = "huge_announced"
    loaded, skipped, _ = _load(_cfg(base_url, tmp_path / "b", symbols=("BTCUSDT",)))
    assert f"announced {HUGE_BODY_BYTES} bytes, over the 1048576 byte cap" in skipped["BTCUSDT-1h"]


def test_retry_after_is_waited_out_within_the_budget_and_a_huge_one_not_at_all(vision, tmp_path):
    base_url, v = vision
    v.faults = [(429, {"Retry-After": "100000"})] * 2
    loaded, skipped, seconds = _load(_cfg(base_url, tmp_path / "a", symbols=("BTCUSDT",)))
    assert loaded == {} and seconds < 2.0
    assert re.search(
        rf"HTTP 429 for {base_url}/\S+\.zip: Retry-After 100000 s would exceed the wait budget",
        skipped["BTCUSDT-1h"],
    )
    v.faults = [(429, {"Retry-After": "1"})]  # within FILE_S: waited, then the zip comes
    loaded, skipped, seconds = _load(_cfg(base_url, tmp_path / "b", symbols=("BTCUSDT",)))
    assert skipped == {} and loaded["BTCUSDT-1h"].notes["months"] == ["2025-01", "2025-02"]
    assert seconds >= 1.0


def test_cached_months_load_offline_and_a_month_not_cached_names_the_fix(root, tmp_path):
    v = FakeVision(root)
    with running(v) as base_url:
        online, _, _ = _load(_cfg(base_url, tmp_path))
    # The server is gone (its port refuses): every file the load needs is in the cache.
    offline, skipped, _ = _load(_cfg(base_url, tmp_path))
    assert skipped == {} and sorted(offline) == sorted(online)
    for name, s in online.items():
        np.testing.assert_array_equal(offline[name].ohlcv, s.ohlcv)
    with pytest.raises(ConfigError, match=r"ConnectionError.*local mirror"):
        _load(_cfg(base_url, tmp_path, months=3))  # 2024-12 was never downloaded


@pytest.mark.parametrize("mode", ["data", "train"])
def test_launch_without_network_is_one_line_and_exit_2(tmp_path, mode):
    flags = ["--mode=data"] if mode == "data" else [f"--workdir={tmp_path / 'run'}"]
    started = time.monotonic()
    proc = helpers.run_launch(
        "--config=configs/gru.py:tiny",
        "--config.data.source=binance",
        f"--config.data.base_url={NO_DNS}",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
        *flags,
        jax_platforms="cpu",
    )
    assert proc.returncode == 2 and time.monotonic() - started < 60, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: config.data.base_url='{NO_DNS}' is not allowed"), last
    assert "--config.data.base_url at a local mirror" in last
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
