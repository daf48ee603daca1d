"""The HTTP server under --mode serve (uvicorn): request heads and bodies within their
size and time limits, a clean stop on SIGTERM or Ctrl-C, and no wait at exit on threads
left behind. The routes are cpbjax/modes/serve.py's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading

import uvicorn
from absl import logging
from starlette.applications import Starlette
from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

SHUTDOWN_GRACE_S = 5  # uvicorn's cap on waiting for requests after SIGTERM
HEADER_TIMEOUT_S = 10.0  # a request head must arrive whole within this
MAX_BODY_BYTES = 8 * 2**20  # of a POST body
BODY_TIMEOUT_S = 30.0  # a POST body must arrive whole within this


class ServeError(RuntimeError):
    """The server cannot start (e.g. the port is taken); the message says why."""


class BadBody(Exception):
    """A POST body that is too big, too slow or not the candles' JSON (status: its answer)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def json_body(request: Request):
    """The JSON value of a POST's body, read within MAX_BODY_BYTES and BODY_TIMEOUT_S.

    Raises:
      BadBody: 413 too big, 408 too slow, 400 not JSON.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BadBody(413, f"the body is {declared} bytes; at most {MAX_BODY_BYTES}")
    body = bytearray()

    async def read():
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > MAX_BODY_BYTES:
                raise BadBody(413, f"the body is over {MAX_BODY_BYTES} bytes")

    try:
        await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except TimeoutError:
        raise BadBody(408, f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadBody(400, f"the body is not JSON: {e}") from None


class HeadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is not whole in time.

    uvicorn's own timeouts start after a response (keep-alive), so a client that opens
    connections and sends half a request head would hold them forever.
    """

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._head_too_slow)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and self._head_timer is not None:  # a whole head came
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.cycle is None:
            self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's Server that also tells waiting forecasts to give up on SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event):
        super().__init__(config)
        self.stopping = stopping

    def handle_exit(self, sig, frame) -> None:
        self.stopping.set()
        super().handle_exit(sig, frame)


def serve(app: Starlette, host: str, port: int) -> None:
    """Runs uvicorn until SIGTERM/SIGINT; returns normally after a graceful shutdown.

    uvicorn re-raises the signal it caught once it has shut down; with our no-op
    handlers installed underneath its own, that ends here instead of killing the
    process, so the exit status is 0.
    """
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        access_log=True,
        http=HeadTimeoutH11,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = _Server(config, app.state.stopping)
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits when it cannot bind
        raise ServeError(f"cannot serve on {host}:{port} (see the log above)") from e
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise ServeError(f"cannot serve on {host}:{port} (see the log above; port in use?)")


def leave_waiting_forecasts() -> None:
    """Ends the process now if forecasts still wait on their data after the server stopped.

    Their threads are daemons, but the data sources' download pools are not, and the
    interpreter would join those at exit: minutes behind an unanswering data location.
    """
    waiting = [t.name for t in threading.enumerate() if t.name.startswith("forecast ")]
    if waiting:
        logging.warning("leaving %d forecasts that still wait on their data", len(waiting))
        logging.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
