"""A local HTTP server that plays the exchange's public klines endpoint, for tests.

`FakeExchange` holds the candles it knows (open times, and a function giving their
OHLCV), one-shot faults to answer first, a mode, and the requests it saw; `running`
serves it on 127.0.0.1 at a free port for the duration of a `with` block.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable

import numpy as np


def rows(times, ohlcv, step_ms: int):
    """Binance's 12-column kline rows: numbers as strings, times as integers."""
    return [
        [int(t), *(f"{v:.8f}" for v in row), int(t) + step_ms - 1, "0", 1, "0", "0", "0"]
        for t, row in zip(times, ohlcv, strict=True)
    ]


@dataclasses.dataclass
class FakeExchange:
    """What the server holds and does: candles, one-shot faults, a mode, request log."""

    times: np.ndarray
    ohlcv: Callable[[np.ndarray], np.ndarray]  # open times [N] -> float64 [N, 5]
    step_ms: int = 3_600_000
    faults: list = dataclasses.field(default_factory=list)  # (status, headers, body)
    mode: str = "normal"  # normal | ignore_start (same page always) | endless (full pages)
    requests: list = dataclasses.field(default_factory=list)  # query dicts
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def reply(self, query: dict) -> tuple[int, dict, bytes]:
        with self.lock:
            self.requests.append(query)
            if self.faults:
                return self.faults.pop(0)
        start, end, limit = (int(query[k]) for k in ("startTime", "endTime", "limit"))
        if self.mode == "endless":  # Full pages on the grid, ten per hour of span.
            times = start + np.arange(limit, dtype=np.int64) * (self.step_ms // 10)
        elif self.mode == "ignore_start":
            times = self.times[:limit]
        else:
            times = self.times[(self.times >= start) & (self.times <= end)][:limit]
        body = json.dumps(rows(times, self.ohlcv(times), self.step_ms)).encode()
        return 200, {"Content-Type": "application/json"}, body


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
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def running(exchange: FakeExchange):
    """Serves `exchange` on 127.0.0.1:<free port>; yields its api_url."""
    handler = functools.partial(_Handler, exchange=exchange)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
