"""A local HTTP server that plays a Binance Vision mirror, honest or hostile, for tests.

`FakeVision` serves the files of a folder in the Vision layout (e.g. one that
synthetic.write_vision_mirror wrote) and answers each zip request per its one-shot
`faults` ((status, headers) answered first) and then its mode; CHECKSUM files are
always served as they are, so the fault lies in the zip. `running` serves it on
127.0.0.1 at a free port for the duration of a `with` block.

The hostile modes play what a broken or malicious host does; every one is bounded
(it stops at fake_exchange.HOSTILE_LIMIT_S, at HUGE_BODY_BYTES, or when the client hangs up), so a
test never hangs on its own server:
  drip            the zip's status line and headers at once, its body one byte every fake_exchange.SLOW_BYTE_S
  slow_head       the status line and headers one byte every fake_exchange.SLOW_BYTE_S, then the body
  tarpit          accepts and reads the request, never answers
  huge            a zip body that never ends (no Content-Length), until HUGE_BODY_BYTES
  huge_announced  the same body, announced as HUGE_BODY_BYTES long
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import os
import threading
import urllib.parse

from tests import fake_exchange

HUGE_BODY_BYTES = 1 << 30
STALL = ("stall", {})  # a fault that answers nothing, as the tarpit mode, once


@dataclasses.dataclass
class FakeVision:
    """What the server holds and does: a mirror folder, one-shot faults, a mode, a log."""

    root: str
    mode: str = "normal"
    faults: list = dataclasses.field(default_factory=list)  # (status, headers) or STALL, for zips
    requests: list = dataclasses.field(default_factory=list)  # URL paths, in order
    sent: list = dataclasses.field(default_factory=list)  # body bytes written per zip reply
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    stopping: threading.Event = dataclasses.field(default_factory=threading.Event)

    def zip_requests(self) -> list[str]:
        with self.lock:
            return [p for p in self.requests if p.endswith(".zip")]

    def next_fault(self, path: str):
        with self.lock:
            self.requests.append(path)
            if path.endswith(".zip") and self.faults:
                return self.faults.pop(0)
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    def __init__(self, *args, vision, **kwargs):
        self.vision = vision
        super().__init__(*args, **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        path = urllib.parse.urlparse(self.path).path
        fault, v = self.vision.next_fault(path), self.vision
        file = os.path.join(v.root, path.lstrip("/"))
        if fault == STALL:
            v.stopping.wait(fake_exchange.HOSTILE_LIMIT_S)
        elif fault is not None:
            self._reply(fault[0], fault[1], b"")
        elif not os.path.isfile(file):
            self._reply(404, {}, b"")
        elif not path.endswith(".zip") or v.mode == "normal":
            with open(file, "rb") as f:
                self._reply(200, {"Content-Type": "application/zip"}, f.read())
        elif v.mode == "tarpit":
            v.stopping.wait(fake_exchange.HOSTILE_LIMIT_S)
        elif v.mode in ("huge", "huge_announced"):
            self._send_huge(announced=v.mode == "huge_announced")
        else:
            with open(file, "rb") as f:
                self._send_slowly(f.read(), head_too=v.mode == "slow_head")

    def _reply(self, status: int, headers: dict, body: bytes) -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_slowly(self, body: bytes, head_too: bool) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        if not head_too:
            self.wfile.write(head)
            self.wfile.flush()
        fake_exchange.trickle(self.wfile, self.vision.stopping, head + body if head_too else body)

    def _send_huge(self, announced: bool) -> None:
        """Zeros until HUGE_BODY_BYTES or hang-up; the bytes written go to vision.sent."""
        self.send_response(200)
        if announced:
            self.send_header("Content-Length", str(HUGE_BODY_BYTES))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk, sent = b"\0" * (1 << 20), 0
        with contextlib.suppress(OSError):  # the client hung up at its cap
            while sent < HUGE_BODY_BYTES and not self.vision.stopping.is_set():
                sent += self.wfile.write(chunk)
        with self.vision.lock:
            self.vision.sent.append(sent)


@contextlib.contextmanager
def running(vision: FakeVision):
    """Serves `vision` on 127.0.0.1:<free port>; yields its base_url."""
    with fake_exchange.serving(functools.partial(_Handler, vision=vision), vision.stopping) as url:
        yield url
