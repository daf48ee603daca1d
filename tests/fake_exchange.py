"""A local HTTP server that plays the exchange's public klines endpoint, for tests.

`FakeExchange` holds the candles it knows (open times, and a function giving their
OHLCV), one-shot faults to answer first, a mode, and the requests it saw; `running`
serves it on 127.0.0.1 at a free port for the duration of a `with` block.

The hostile modes play what a broken or malicious exchange does; every one is bounded
(it stops at HOSTILE_LIMIT_S, at a byte limit, or when the client hangs up), so a test
never hangs on its own server:
  slow_body      the right body, one byte every SLOW_BYTE_S
  slow_headers   the status line and headers one byte every SLOW_BYTE_S, then the body
  huge_body      a body that never ends (no Content-Length), until HUGE_BODY_BYTES
  tarpit         accepts and reads the request, never answers
  beyond_limit   every candle from startTime on, ignoring `limit`
  future_open    adds a candle opening one interval after endTime, claiming to be closed
  wrong_spacing  candles half an interval apart
  wrong_interval 1m candles (close time 1 min after the open) whatever was asked
  endless        one candle a page, so paging never reaches now
  ignore_start   the first page always
  time_pages     pages of `limit` intervals of time: a gap in the history makes one short
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Callable

import numpy as np

SLOW_BYTE_S = 0.05
HUGE_BODY_BYTES = 256 << 20
HOSTILE_LIMIT_S = 30.0  # the longest any hostile reply lasts
MINUTE_MS = 60_000
STEP = 3_600_000  # 1h in ms
T0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z: the first open time of hourly_exchange


def rows(times, ohlcv, step_ms: int, close_after_ms: int | None = None):
    """Binance's 12-column kline rows: numbers as strings, times as integers.

    close_after_ms: the close time's offset from the open (default step_ms - 1).
    """
    close = step_ms - 1 if close_after_ms is None else close_after_ms
    return [
        [int(t), *(f"{v:.8f}" for v in row), int(t) + close, "0", 1, "0", "0", "0"]
        for t, row in zip(times, ohlcv, strict=True)
    ]


@dataclasses.dataclass
class FakeExchange:
    """What the server holds and does: candles, one-shot faults, a mode, request log."""

    times: np.ndarray
    ohlcv: Callable[[np.ndarray], np.ndarray]  # open times [N] -> float64 [N, 5]
    step_ms: int = STEP
    faults: list = dataclasses.field(default_factory=list)  # (status, headers, body)
    mode: str = "normal"  # normal | ignore_start (same page always) | endless (full pages)
    requests: list = dataclasses.field(default_factory=list)  # query dicts
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)

    def reply(self, query: dict) -> tuple[int, dict, bytes]:
        with self.lock:
            self.requests.append(query)
            if self.faults:
                return self.faults.pop(0)
        start, end, limit = (int(query[k]) for k in ("startTime", "endTime", "limit"))
        close_after = MINUTE_MS - 1 if self.mode == "wrong_interval" else None
        times = self._times(start, end, limit)
        body = json.dumps(rows(times, self.ohlcv(times), self.step_ms, close_after)).encode()
        return 200, {"Content-Type": "application/json"}, body

    def _times(self, start: int, end: int, limit: int) -> np.ndarray:
        """The open times of the candles a page holds, per the mode."""
        if self.mode == "endless":
            return np.array([start], np.int64)
        if self.mode == "ignore_start":
            return self.times[:limit]
        if self.mode == "wrong_spacing":
            return start + np.arange(limit, dtype=np.int64) * (self.step_ms // 2)
        if self.mode == "time_pages":
            end = min(end, start + limit * self.step_ms - 1)
        within = self.times[(self.times >= start) & (self.times <= end)]
        if self.mode == "beyond_limit":
            return within
        if self.mode == "future_open":
            return np.append(within[: limit - 1], end // self.step_ms * self.step_ms + self.step_ms)
        return within[:limit]


class _Handler(http.server.BaseHTTPRequestHandler):
    def __init__(self, *args, exchange, **kwargs):
        self.exchange = exchange
        super().__init__(*args, **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        assert url.path == "/api/v3/klines", url.path
        query = dict(urllib.parse.parse_qsl(url.query))
        status, headers, body = self.exchange.reply(query)
        mode, stopping = self.exchange.mode, self.exchange.stopping
        if mode == "tarpit":
            stopping.wait(HOSTILE_LIMIT_S)
            return
        if mode == "huge_body":
            self._send_huge(body)
            return
        if mode == "slow_headers":
            head = [f"HTTP/1.1 {status} OK"]
            head += [f"{k}: {v}" for k, v in {**headers, "Content-Length": len(body)}.items()]
            trickle(
                self.wfile, self.exchange.stopping, ("\r\n".join(head) + "\r\n\r\n").encode() + body
            )
            return
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        if mode == "slow_body":
            trickle(self.wfile, self.exchange.stopping, body)
        else:
            self.wfile.write(body)

    def _send_huge(self, body: bytes) -> None:
        """A JSON array that never closes, with no Content-Length, until the cap or hang-up."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        row = body[1:-1] + b","  # the page's rows, repeated
        chunk = row * max(1, (1 << 20) // len(row))
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client hung up at its cap
            sent = self.wfile.write(b"[")
            while sent < HUGE_BODY_BYTES and not self.exchange.stopping.is_set():
                sent += self.wfile.write(chunk)


def candles(times) -> np.ndarray:
    """Deterministic valid candles float64 [N, 5] for 1h open times [N]: rising from 100 at T0."""
    base = 100.0 + (np.asarray(times) - T0) / STEP * 0.01
    return np.stack([base, base + 1, base - 1, base + 0.5, base * 10], axis=1)


def hourly_exchange() -> FakeExchange:
    """2500 closed 1h candles from T0, plus the open one after them, valued by `candles`."""
    return FakeExchange(T0 + np.arange(2501, dtype=np.int64) * STEP, candles)


@contextlib.contextmanager
def running(exchange: FakeExchange):
    """Serves `exchange` on 127.0.0.1:<free port>; yields its api_url."""
    with serving(functools.partial(_Handler, exchange=exchange), exchange.stopping) as url:
        yield url


def trickle(wfile, stopping: threading.Event, data: bytes) -> None:
    """Writes `data` to `wfile` one byte every SLOW_BYTE_S, until HOSTILE_LIMIT_S, `stopping`
    or hang-up (a hostile reply of either fake host)."""
    deadline = time.monotonic() + HOSTILE_LIMIT_S
    with contextlib.suppress(OSError):  # the client hung up at its deadline
        for i in range(len(data)):
            if stopping.wait(SLOW_BYTE_S) or time.monotonic() > deadline:
                return
            wfile.write(data[i : i + 1])
            wfile.flush()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # A burst of parallel downloads (several forecasts' workers at once) must not overflow
    # the listen backlog (5 by default): Linux then drops the SYN, and the client's retry
    # comes after the 1 s connect timeout hostile tests set, read as "did not connect".
    request_queue_size = 128


@contextlib.contextmanager
def serving(handler, stopping: threading.Event):
    """Serves `handler` (a request handler class or partial) on 127.0.0.1:<free port> in
    threads; yields its http:// URL. On leaving, `stopping` is set (a hostile reply that
    waits on it ends) and the server is shut down."""
    httpd = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
