"""The one HTTP policy of every network path: GET with one wall-clock deadline, a body cap,
bounded waits and a circuit breaker, for the Binance Vision downloader (mirrors.HttpMirror)
and the REST klines source (klines_api).

A `Client` makes every request of one operation (a Vision file: its CHECKSUM and its zip;
the top-up of one series) against one `Budget`: a deadline on the monotonic clock, a
number of requests and a number of seconds of waiting. Each request has its own total
deadline as well (the client's `timeout`, or what is left of the budget if less):
connect (at most CONNECT_TIMEOUT_S), headers and the whole body. A watchdog shuts the
connection down if the reply's head is not in by then, and the body is streamed with
the socket's timeout set to the time left, so a server sending one byte a second cannot
stretch either. A body over its cap (announced or streamed) is refused at the cap, so
memory stays bounded.

Retries are made here, not by urllib3 (whose waits this module could not see or
bound): a connection that breaks after connecting, and 5xx, are retried at most
`retries` times with capped backoff (BACKOFF_*); 418 and 429 are waited out for their
Retry-After, within the budget's seconds of waiting. A host whose name does not resolve,
that refuses or does not accept the connection, or that sends no complete answer within
the deadline is not retried: it is `Unreachable`. The client's breaker (`down`) opens
at once on a host that does not connect, and on the SLOW_STRIKES-th answer that misses
its deadline (a stall or two on a sound link fail only their own files): every later request
of the client then fails at once with the opening one's reason, so the caller skips the
rest instead of waiting again for each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import socket
import threading
import time

import requests
import urllib3
from requests.adapters import HTTPAdapter

from cpbjax.data.series import SeriesSkipped
from cpbjax.version import __version__

WAIT_STATUSES = (418, 429)  # Statuses whose Retry-After is waited out.
RETRY_STATUSES = (500, 502, 503, 504)  # Retried with backoff, at most `retries` times.
MAX_BODY_BYTES = 8 << 20  # A full page of 1000 klines is about 200 KB.
ERROR_BODY_BYTES = 64 << 10  # Read of an error reply, for Binance's {"code", "msg"}.
CHUNK_BYTES = 64 << 10
SERIES_BUDGET_S = 45.0  # Wall clock for one operation (the top-up of one series).
MAX_WAIT_S = 30.0  # Retry-After and backoff waiting within it.
# A host that has not accepted the connection by then is taken to be unreachable: with
# no network a run ends this soon after its first request, whatever `timeout` is.
CONNECT_TIMEOUT_S = 10.0
BACKOFF_FACTOR = 0.5  # The backoff before retry n is BACKOFF_FACTOR * 2**(n - 1) s...
BACKOFF_JITTER_S = 0.5  # ...plus uniform(0, BACKOFF_JITTER_S) s...
BACKOFF_MAX_S = 30.0  # ...but never longer than this (nor a Retry-After that gives none).
DID_NOT_CONNECT = "did not connect"  # Unreachable.why of a host not connected to
# Answers of one client that miss their deadline before the breaker takes the host for a
# tarpit: counted over the whole download, not in a row, since a host may answer the small
# CHECKSUM files and drip every zip. Parallel downloads reach it together on a host that
# stalls every request, so it costs about one deadline there.
SLOW_STRIKES = 3


class Unreachable(SeriesSkipped):
    """The server did not connect, or sent no complete answer within the deadline.

    Attributes:
      why: e.g. "did not connect", "did not answer within 30 s".
    """

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


class BadStatus(SeriesSkipped):
    """A reply whose status is neither 200 nor waited out or retried into a 200.

    Attributes:
      status: the HTTP status, e.g. 404.
    """

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class CutShort(SeriesSkipped):
    """The reply's body broke off before its end (a caller may ask again)."""


@dataclasses.dataclass
class Budget:
    """One operation's limits: requests, seconds of waiting, and a wall-clock deadline."""

    max_requests: int
    max_wait_s: float
    seconds: float  # the whole operation's wall-clock budget
    deadline: float = 0.0  # time.monotonic() by which it must end; set from `seconds`
    requests: int = 0
    waited_s: float = 0.0

    def __post_init__(self):
        self.deadline = self.deadline or time.monotonic() + self.seconds

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def spend_request(self, url: str) -> None:
        if self.requests >= self.max_requests:
            raise SeriesSkipped(
                f"gave up after {self.requests} requests (limit {self.max_requests}); "
                f"the next would have been {url}"
            )
        if self.left_s() <= 0:
            raise Unreachable(
                f"the {self.seconds:g} s budget of this fetch ran out after {self.requests} "
                f"requests (waited {self.waited_s:.1f} s); the next would have been {url}",
                f"did not finish within {self.seconds:g} s",
            )
        self.requests += 1

    def wait(self, seconds: float, reason: str) -> None:
        """Sleeps `seconds` for `reason` (e.g. "HTTP 429 for <url>: Retry-After 5 s").

        Raises:
          SeriesSkipped: the wait would pass max_wait_s or the deadline; nothing is slept.
        """
        cap = min(self.max_wait_s - self.waited_s, self.left_s())
        if seconds > cap:
            raise SeriesSkipped(
                f"{reason} would exceed the wait budget: {max(cap, 0):.0f} s left of "
                f"{self.max_wait_s:g} s of waiting and of the {self.seconds:g} s budget "
                f"of this fetch (waited {self.waited_s:.1f} s so far)"
            )
        started = time.monotonic()
        time.sleep(seconds)
        self.waited_s += time.monotonic() - started


class _Reading(threading.local):
    """The sockets whose status line and headers this thread is reading (`_watched`)."""

    sockets: list | None = None


_READING = _Reading()


def _watched(connection_cls):
    """connection_cls, noting the socket it reads a reply's head from in _READING: a
    watchdog can then cut a head that trickles in a byte at a time (each read within
    the socket timeout) off at the request's deadline."""

    class Watched(connection_cls):
        def getresponse(self, *args, **kwargs):
            if _READING.sockets is not None and self.sock is not None:
                _READING.sockets.append(self.sock)
            return super().getresponse(*args, **kwargs)

    return Watched


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _watched(urllib3.connection.HTTPConnection)


class _TLSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _watched(urllib3.connection.HTTPSConnection)


class _Adapter(HTTPAdapter):
    """requests' adapter over the watched connections."""

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}


@contextlib.contextmanager
def _head_deadline(seconds: float):
    """Shuts the connection down if the reply's head is not read within `seconds`;
    yields a list that holds True once it did."""
    sockets, fired = [], []

    def cut_off():
        fired.append(True)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, cut_off)
    _READING.sockets = sockets
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()
        _READING.sockets = None


def make_session(workers: int = 1) -> requests.Session:
    """A Session without urllib3 retries (`Client` retries itself, within its budget),
    keeping a connection for each of `workers` threads."""
    session = requests.Session()
    retry = urllib3.Retry(0, read=False, redirect=3)
    adapter = _Adapter(max_retries=retry, pool_connections=1, pool_maxsize=max(workers, 1))
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = f"cpbjax/{__version__}"
    return session


@dataclasses.dataclass
class Client:
    """GETs of one host: a session, a per-request deadline, retries, a body cap, a breaker.

    `down` is the breaker: the Unreachable that opened it (None while closed). Every
    `get` after it raises at once; a caller tells the request that opened it by
    `client.down is error`. Safe to share between threads.
    """

    base_url: str
    session: requests.Session
    timeout: float  # seconds for one request, body included
    retries: int  # of broken connections and 5xx
    budget_s: float = SERIES_BUDGET_S  # wall clock of one operation (see `budget`)
    max_wait_s: float = MAX_WAIT_S
    max_body_bytes: int = MAX_BODY_BYTES
    down: Unreachable | None = dataclasses.field(default=None, init=False)
    _slow_answers: int = dataclasses.field(default=0, init=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, init=False)

    def budget(self, max_requests: int) -> Budget:
        """A fresh Budget for one operation, its deadline starting now."""
        return Budget(max_requests, self.max_wait_s, self.budget_s)

    def get(self, url: str, budget: Budget, cap: int | None = None) -> bytes:
        """The body of a 200 reply to GET url, at most `cap` bytes (None: max_body_bytes).

        Raises:
          Unreachable: no connection, no complete answer in time, or the breaker open.
          BadStatus: another status (5xx after the retries).
          CutShort: the body broke off.
          SeriesSkipped: a body over the cap, or a spent budget.
        """
        failures = 0
        while True:
            self._refuse_if_down()
            budget.spend_request(url)
            try:
                return self._once(url, budget, self.max_body_bytes if cap is None else cap)
            except Unreachable as e:
                self._strike(e)
                raise
            except _Retry as e:
                failures += e.wait_s is None
                if e.wait_s is None and failures > self.retries:
                    raise e.final(self.retries) from e.__cause__
                wait = e.wait_s if e.wait_s is not None else _backoff_s(failures)
                budget.wait(wait, e.reason(wait))

    def _refuse_if_down(self) -> None:
        down = self.down
        if down is not None:
            raise Unreachable(f"not requested: {self.base_url} {down.why}", down.why)

    def _strike(self, error: Unreachable) -> None:
        """Opens the breaker on `error` if its host did not connect, or if it is the
        SLOW_STRIKES-th answer to miss its deadline."""
        with self._lock:
            self._slow_answers += error.why != DID_NOT_CONNECT
            if error.why == DID_NOT_CONNECT or self._slow_answers >= SLOW_STRIKES:
                self.down = self.down or error

    def _once(self, url: str, budget: Budget, cap: int) -> bytes:
        deadline = min(time.monotonic() + self.timeout, budget.deadline)
        left = max(deadline - time.monotonic(), 0.001)
        with _head_deadline(left) as cut_off:
            try:
                timeout = (min(left, CONNECT_TIMEOUT_S), left)
                resp = self.session.get(url, timeout=timeout, stream=True)
            except requests.ConnectionError as e:  # ConnectTimeout included
                if cut_off:  # the head was still coming in at the deadline
                    raise self._too_slow(url, "headers", 0) from e
                message = f"request failed for {url} ({type(e).__name__}: {_short(e)})"
                if _not_connected(e):
                    raise Unreachable(message, DID_NOT_CONNECT) from e
                raise _Retry(message) from e
            except requests.Timeout as e:
                raise self._too_slow(url, "headers", 0) from e
            except requests.RequestException as e:
                raise SeriesSkipped(f"request failed for {url} ({type(e).__name__})") from e
        with resp:
            status = resp.status_code
            if status == 200:
                return self._body(resp, url, deadline, cap)
            detail = _error_detail(self._body(resp, url, deadline, ERROR_BODY_BYTES, cut=True))
            if status in WAIT_STATUSES:
                raise _Retry(f"HTTP {status} for {url}{detail}", _retry_after_s(resp))
            if status in RETRY_STATUSES:
                raise _Retry(f"HTTP {status} for {url}{detail}", status=status)
            raise BadStatus(f"HTTP {status} for {url}{detail}", status)

    def _body(self, resp, url: str, deadline: float, cap: int, cut: bool = False) -> bytes:
        """The body, streamed until EOF, the deadline or `cap` bytes (`cut`: keep those)."""
        declared = resp.headers.get("Content-Length", "")
        if not cut and declared.isdigit() and int(declared) > cap:
            raise SeriesSkipped(f"{url} announced {int(declared)} bytes, over the {cap} byte cap")
        sock = getattr(getattr(resp.raw, "connection", None), "sock", None)
        chunks, size = [], 0
        while size <= cap:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._too_slow(url, "body", size)
            if sock is not None:
                sock.settimeout(left)  # each read waits at most until the deadline
            try:
                chunk = resp.raw.read1(CHUNK_BYTES, decode_content=True)
            except (urllib3.exceptions.HTTPError, OSError) as e:
                if isinstance(e, urllib3.exceptions.ReadTimeoutError | TimeoutError):
                    raise self._too_slow(url, "body", size) from e
                raise CutShort(f"the reply from {url} broke off ({type(e).__name__})") from e
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        if cut:
            return b"".join(chunks)[:cap]
        raise SeriesSkipped(f"the body from {url} passed the {cap} byte cap; stopped reading")

    def _too_slow(self, url: str, part: str, size: int) -> Unreachable:
        got = f" ({size} bytes of the body by then)" if part == "body" else " (no headers)"
        return Unreachable(
            f"no complete answer from {url} within its deadline of {self.timeout:g} s or "
            f"the fetch's budget{got}",
            f"did not answer within {self.timeout:g} s",
        )


class _Retry(Exception):
    """A failure worth another request: a broken connection, a 5xx, or a 418/429 wait."""

    def __init__(self, message: str, wait_s: float | None = None, status: int | None = None):
        super().__init__(message)
        self.message, self.wait_s, self.status = message, wait_s, status

    def reason(self, wait: float) -> str:
        return (
            f"{self.message}: Retry-After {wait:g} s"
            if self.wait_s is not None
            else (f"{self.message}: retrying in {wait:.1f} s")
        )

    def final(self, retries: int) -> SeriesSkipped:
        message = f"{self.message} (after {retries} retries)"
        if self.status is not None:
            return BadStatus(message, self.status)
        return Unreachable(message, "dropped every connection")


def _not_connected(e: requests.ConnectionError) -> bool:
    """Whether `e` stopped the request before a connection existed: the name did not
    resolve, the connection was refused or unroutable, or not accepted in time."""
    reason = getattr(e.args[0], "reason", None) if e.args else None
    return isinstance(e, requests.ConnectTimeout) or isinstance(
        reason,
        urllib3.exceptions.NewConnectionError,  # NameResolutionError included
    )


def _short(e: requests.ConnectionError) -> str:
    """The cause of a connection error without urllib3's wrapping (pool, retry count):
    e.g. "Failed to resolve 'x.invalid' ([Errno -2] Name or service not known)"."""
    reason = getattr(e.args[0], "reason", None) if e.args else None
    text = str(reason if reason is not None else e)
    return text.split("): ", 1)[-1][:200]


def _backoff_s(failures: int) -> float:
    """The backoff before retry n: capped exponential plus jitter."""
    delay = BACKOFF_FACTOR * 2 ** (failures - 1)
    return min(delay + random.uniform(0, BACKOFF_JITTER_S), BACKOFF_MAX_S)


def _retry_after_s(resp: requests.Response) -> float:
    """Retry-After in seconds; a missing or date-form value waits the backoff cap."""
    value = resp.headers.get("Retry-After", "").strip()
    return float(value) if value.isdigit() else BACKOFF_MAX_S


def _error_detail(body: bytes) -> str:
    """Binance's {"code", "msg"} error body as ": msg (code c)", else ""."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return ""
    if isinstance(parsed, dict) and "msg" in parsed:
        return f": {str(parsed['msg'])[:200]} (code {parsed.get('code')})"
    return ""
