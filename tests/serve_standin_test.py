"""Tests of serve's app (cpbjax/modes/serve.py, http_server.py) against stand-in
forecasters, without a trained model: the last-resort 500, the bound on forecasts in
flight, a request head or body that never completes, and a POST body's checks and limits.
tests/serve_test.py runs the real server on a trained workdir."""

import json
import socket
import threading
import time

import ml_collections
import pytest

from cpbjax.modes import http_server, serve
from tests import http_helpers

SERIES = "BTCUSDT-1h"
OHLC = ["open", "high", "low", "close"]


class _FailingForecaster:
    """A stand-in whose every call fails, for the server's last-resort handler."""

    models, unreadable, workdir = {SERIES: None}, {}, "/nonexistent"
    config = ml_collections.ConfigDict({"model": {"name": "gru"}})

    def series(self):
        raise ValueError("damaged results.json")

    def forecast(self, name):
        raise RuntimeError("boom")


def test_a_failing_handler_answers_json_500_without_traceback():
    with http_helpers.serving(serve.build_app(_FailingForecaster())) as port:
        for path, kind in ((f"/forecast/{SERIES}", "RuntimeError"), ("/series", "ValueError")):
            status, body, _ = http_helpers.request(port, path)
            assert status == 500 and body["error"] == f"internal error ({kind}); see the server log"


class _HangingForecaster(_FailingForecaster):
    """A stand-in whose forecasts wait on `release` (at most 30 s)."""

    def __init__(self):
        self.release = threading.Event()

    def series(self):
        return []

    def forecast(self, name):
        self.release.wait(30)
        return {"series": name}


def test_hung_forecasts_are_bounded_and_never_block_the_cheap_endpoints():
    forecaster = _HangingForecaster()
    app = serve.build_app(forecaster)
    with http_helpers.serving(app) as port:
        answers = []
        askers = [
            threading.Thread(
                target=lambda: answers.append(http_helpers.request(port, f"/forecast/{SERIES}"))
            )
            for _ in range(serve.MAX_FORECASTS)
        ]
        for t in askers:
            t.start()
        deadline = time.monotonic() + 10  # until each asker's forecast thread is running
        while time.monotonic() < deadline:
            if sum(t.name.startswith("forecast") for t in threading.enumerate()) == len(askers):
                break
            time.sleep(0.05)
        status, body, _ = http_helpers.request(
            port, f"/forecast/{SERIES}"
        )  # one more than the bound
        assert status == 503 and "forecasts in progress" in body["error"]
        started = time.monotonic()
        assert (
            http_helpers.request(port, "/health")[0] == 200
            and http_helpers.request(port, "/series")[0] == 200
        )
        assert time.monotonic() - started < 2
        app.state.stopping.set()  # what SIGTERM does: the waiting forecasts give up
        for t in askers:
            t.join(10)
        assert [a[0] for a in answers] == [503] * serve.MAX_FORECASTS
        assert all("shutting down" in a[1]["error"] for a in answers)
        forecaster.release.set()


def test_a_request_head_that_never_completes_is_cut_off(monkeypatch):
    monkeypatch.setattr(http_server, "HEADER_TIMEOUT_S", 0.5)
    with http_helpers.serving(
        serve.build_app(_HangingForecaster()), http=http_server.HeadTimeoutH11
    ) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            started = time.monotonic()
            assert s.recv(4096) == b""  # closed by the server
            assert time.monotonic() - started < 3
        assert http_helpers.request(port, "/health")[0] == 200  # whole heads are served as before


class _PostForecaster(_FailingForecaster):
    """A stand-in that answers a POST with what it was given; no close column is refused."""

    def forecast_candles(self, name, candles):
        if "close" not in candles.columns:
            raise serve.BadCandles("candles lack the columns ['close']")
        return {"series": name, "candles": len(candles), "columns": list(candles.columns)}


def _records(n: int) -> list[dict]:
    start = 1_767_225_600_000  # 2026-01-01T00:00Z
    return [
        {"open_time": start + i * 3_600_000, "open": 1, "high": 2, "low": 0.5, "close": 1.5}
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "body, code, words",
    [
        ({"candles": _records(3)}, 200, None),
        (b"{not json", 400, "the body is not JSON"),
        ({"rows": _records(3)}, 400, 'a JSON object {"candles": [...]}'),
        ({"candles": [{"open_time": 1, "open": "1.5"}]}, 400, "candles[0]['open'] is '1.5'"),
        ({"candles": [{"open": 1.5}]}, 400, 'candles[0] is not an object with an "open_time"'),
        ({"candles": [{"open_time": "soon", "open": 1}]}, 400, "an open_time is not a time"),
        ({"candles": _records(5)}, 413, "5 candles; at most 4"),
        ({"candles": _records(3), "pad": "x" * 5000}, 413, "at most 4096"),
        ({"candles": [{"open_time": 1, "open": 1}]}, 422, "lack the columns ['close']"),
    ],
    ids=["ok", "not-json", "no-candles", "text", "no-time", "bad-time", "many", "big", "422"],
)
def test_a_posted_body_is_checked_within_its_limits(monkeypatch, body, code, words):
    monkeypatch.setattr(serve, "MAX_POST_CANDLES", 4)
    monkeypatch.setattr(http_server, "MAX_BODY_BYTES", 4096)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with http_helpers.serving(serve.build_app(_PostForecaster())) as port:
        status, answer, _ = http_helpers.request(port, f"/forecast/{SERIES}", "POST", raw)
        assert status == code, answer
        if code == 200:
            assert answer == {"series": SERIES, "candles": 3, "columns": OHLC}
        else:
            assert words in answer["error"] and "Traceback" not in answer["error"]
        assert http_helpers.request(port, "/forecast/DOGEUSDT-1h", "POST", raw)[0] == 404


def test_a_body_that_never_completes_is_answered_408(monkeypatch):
    monkeypatch.setattr(http_server, "BODY_TIMEOUT_S", 0.5)
    with http_helpers.serving(serve.build_app(_PostForecaster())) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            head = f"POST /forecast/{SERIES} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            s.sendall(head.encode() + b'{"candles": [')  # and never the rest
            started = time.monotonic()
            answer = s.recv(4096).decode()
            assert answer.startswith("HTTP/1.1 408") and "did not arrive within 0.5 s" in answer
            assert time.monotonic() - started < 3
        assert http_helpers.request(port, "/health")[0] == 200
