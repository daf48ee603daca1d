"""The newest closed candles from Binance's public REST klines endpoint (no API key).

Binance Vision's monthly files end at the last complete month; this module tops a
series up to now from `GET {api_url}/api/v3/klines`, paging forward by startTime
(PAGE_LIMIT candles a page) until a page comes back short or reaches now. The
candle still open at `now_ms` is never returned.

Rate limits: requests go through `binance.make_session`, the downloader's urllib3
`Retry` (429 and 5xx retried with capped backoff, Retry-After honoured). Binance
answers 418 (an IP ban after ignored 429s) and, once urllib3's retries are spent,
429 with a Retry-After in seconds; `_get` waits that out itself, within a per-call
budget of requests (the pages the span needs + EXTRA_REQUESTS) and of waiting
(MAX_WAIT_S). A longer wait, a spent budget, an HTML page, malformed JSON, a
non-list body or short rows raise `SeriesSkipped` naming the URL, so one bad
series is skipped and the run goes on.

Consider ccxt (the exchange library freqtrade uses) as the backend? We decided
against it. ccxt 4.5.90 is a 6.8 MB wheel (726 files, 40 MB unpacked) that
requires about 20 packages, several pinned to exact versions (urllib3==2.8.0,
attrs, typing_extensions, aiohttp and its stack, cryptography, coincurve, uvloop),
which would pin this project's environment for the sake of one unauthenticated GET.
Its retry and rate-limit handling would also differ from the downloader's. The
endpoint is a stable, documented JSON array, read here in about 200 lines with
requests, which cpbjax already uses. Either way the fresh candles stay behind the
source registry (`top_up`, called from a source in sources.py), so another
exchange, through ccxt or not, can be added as another source without changing
any caller.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.parse

import numpy as np
import requests
from absl import logging

from cpbjax.data import binance, parsing
from cpbjax.data.series import INTERVAL_MS, Series, SeriesSkipped

KLINES_PATH = "/api/v3/klines"
PAGE_LIMIT = 1000  # Binance's maximum klines per request.
MIN_COLUMNS = 7  # open_time, open, high, low, close, volume, close_time (Binance sends 12).
WAIT_STATUSES = (418, 429)  # Statuses whose Retry-After this module waits out itself.
EXTRA_REQUESTS = 10  # Requests allowed beyond the pages the span needs (retries, waits).
MAX_PAGES = 200  # 200k candles: 1m back about 4.6 months; older history is Vision's job.
MAX_WAIT_S = 120.0  # Total Retry-After waiting one fetch_recent call may do.


@dataclasses.dataclass
class _Budget:
    """Requests made (urllib3's own retries included) and seconds waited, with limits."""

    max_requests: int
    max_wait_s: float
    requests: int = 0
    waited_s: float = 0.0

    def spend_request(self, url: str) -> None:
        if self.requests >= self.max_requests:
            raise SeriesSkipped(
                f"gave up after {self.requests} requests (limit {self.max_requests}); "
                f"the next would have been {url}"
            )
        self.requests += 1

    def wait(self, seconds: float, status: int, url: str) -> None:
        if self.waited_s + seconds > self.max_wait_s:
            raise SeriesSkipped(
                f"HTTP {status} for {url}: Retry-After {seconds:g} s would exceed the "
                f"{self.max_wait_s:g} s wait budget ({self.waited_s:g} s already waited)"
            )
        time.sleep(seconds)
        self.waited_s += seconds


@dataclasses.dataclass(frozen=True)
class Seam:
    """Where the history meets the fresh candles (see `merge_with_history`).

    Attributes:
      overlap: fresh candles whose open time the history already had (history kept).
      differing: of those, how many had different values in the two sources.
      missing: candles missing between the history's last candle and the first
        fresh one after it; 0 when they touch or nothing fresh lies beyond it.
      history_last_ms, fresh_first_ms: the two candles either side of the seam
        (None when there is no such candle).
    """

    overlap: int
    differing: int
    missing: int
    history_last_ms: int | None
    fresh_first_ms: int | None


def clock_ms() -> int:
    """The real clock as epoch milliseconds (UTC)."""
    return int(time.time() * 1000)


def _retry_after_s(resp: requests.Response) -> float:
    """Retry-After in seconds; a missing or date-form value waits the backoff cap."""
    value = resp.headers.get("Retry-After", "").strip()
    return float(value) if value.isdigit() else binance.BACKOFF_MAX_S


def _error_detail(resp: requests.Response) -> str:
    """Binance's {"code", "msg"} error body as ": msg (code c)", else ""."""
    try:
        body = resp.json()
    except ValueError:
        return ""
    if isinstance(body, dict) and "msg" in body:
        return f": {str(body['msg'])[:200]} (code {body.get('code')})"
    return ""


def _get(session, url: str, timeout: float, budget: _Budget) -> bytes:
    """The body of a 200 reply to GET url; 418/429 waited out within the budget.

    Raises:
      SeriesSkipped: a connection failure, another status, or a spent budget.
    """
    while True:
        budget.spend_request(url)
        try:
            resp = session.get(url, timeout=timeout)
        except requests.RequestException as e:
            raise SeriesSkipped(
                f"request failed for {url} ({type(e).__name__}: {str(e)[:200]})"
            ) from e
        retries = getattr(resp.raw, "retries", None)  # urllib3's Retry after its retries
        budget.requests += len(retries.history) if retries is not None else 0
        if resp.status_code == 200:
            return resp.content
        if resp.status_code not in WAIT_STATUSES:
            raise SeriesSkipped(f"HTTP {resp.status_code} for {url}{_error_detail(resp)}")
        budget.wait(_retry_after_s(resp), resp.status_code, url)


def _json_rows(body: bytes, url: str) -> list:
    """The JSON array of kline rows in `body`; anything else raises SeriesSkipped."""
    if body.lstrip()[:1] == b"<":
        raise SeriesSkipped(f"got an HTML page instead of JSON klines from {url}")
    try:
        rows = json.loads(body)
    except ValueError as e:
        raise SeriesSkipped(f"malformed JSON from {url} ({e})") from e
    if not isinstance(rows, list):
        raise SeriesSkipped(
            f"expected a JSON list of klines from {url}, got {type(rows).__name__}: "
            f"{str(rows)[:200]}"
        )
    short = [i for i, row in enumerate(rows) if not isinstance(row, list) or len(row) < MIN_COLUMNS]
    if short:
        row = rows[short[0]]
        found = f"{len(row)} columns" if isinstance(row, list) else type(row).__name__
        raise SeriesSkipped(
            f"{len(short)} kline rows without the {MIN_COLUMNS} leading columns from {url}; "
            f"row {short[0]} has {found}"
        )
    return rows


def _parse_page(body: bytes, url: str):
    """One page as (open_ms int64 [N], ohlcv float64 [N, 5], close_ms int64 [N]), as sent."""
    rows = _json_rows(body, url)
    try:
        open_ms = parsing.epoch_to_ms(np.array([r[0] for r in rows], np.int64), url)
        close_ms = parsing.epoch_to_ms(np.array([r[6] for r in rows], np.int64), url)
        # Binance sends prices and volume as decimal strings; numpy parses them.
        ohlcv = np.array([r[1:6] for r in rows], np.float64).reshape(-1, 5)
    except (TypeError, ValueError, OverflowError) as e:
        raise SeriesSkipped(f"non-numeric kline values from {url} ({e})") from e
    return open_ms, ohlcv, close_ms


def _page_url(api_url: str, symbol: str, interval: str, start_ms: int, end_ms: int) -> str:
    query = urllib.parse.urlencode(
        dict(symbol=symbol, interval=interval, startTime=start_ms, endTime=end_ms, limit=PAGE_LIMIT)
    )
    return f"{api_url.rstrip('/')}{KLINES_PATH}?{query}"


def _request_limit(start_ms: int, now: int, step: int) -> int:
    """Requests allowed for the span: the pages it needs plus EXTRA_REQUESTS."""
    pages = math.ceil(max(now - start_ms, 0) / step / PAGE_LIMIT) + 1  # + a short last page
    if pages > MAX_PAGES:
        raise SeriesSkipped(
            f"start {parsing.iso(start_ms)} is {pages} pages of {PAGE_LIMIT} candles before "
            f"now; the REST source fetches at most {MAX_PAGES} (older candles come from Vision)"
        )
    return pages + EXTRA_REQUESTS


def _pages(get_page, start_ms: int, now: int, step: int):
    """Yields (open_ms [N], ohlcv [N, 5], close_ms [N]) pages from start_ms towards now.

    Stops after a short page or one that reaches now; a page that does not move
    the cursor forward (a server ignoring startTime) raises SeriesSkipped.
    """
    cursor = start_ms
    while cursor + step <= now:  # A candle opening at `cursor` could have closed by now.
        open_ms, ohlcv, close_ms, url = get_page(cursor)
        yield open_ms, ohlcv, close_ms
        if len(open_ms) < PAGE_LIMIT:
            return
        following = int(open_ms[-1]) + step
        if following <= cursor:
            raise SeriesSkipped(
                f"{url} returned a full page ending at {parsing.iso(int(open_ms[-1]))}, "
                f"not after startTime {parsing.iso(cursor)}: paging would not advance"
            )
        cursor = following


def _closed_rows(pages: list, start_ms: int, now: int, name: str):
    """The pages' closed candles from start_ms on: (int64 [N], float64 [N, 5]), sorted."""
    open_ms = np.concatenate([p[0] for p in pages] or [np.zeros(0, np.int64)])
    ohlcv = np.concatenate([p[1] for p in pages] or [np.zeros((0, 5))])
    close_ms = np.concatenate([p[2] for p in pages] or [np.zeros(0, np.int64)])
    keep = (close_ms < now) & (open_ms >= start_ms)  # Closed, and what was asked for.
    try:
        return parsing.sort_dedupe(open_ms[keep], ohlcv[keep], name)
    except parsing.KlineError as e:  # Two different candles at one open time.
        raise SeriesSkipped(str(e)) from e


def fetch_recent(
    symbol,
    interval,
    start_ms,
    api_url,
    session,
    timeout,
    now_ms=None,
    *,
    max_requests=None,
    max_wait_s=MAX_WAIT_S,
):
    """The closed candles of one series from `start_ms` to now, from the REST API.

    Args:
      symbol, interval: e.g. "BTCUSDT", "1h" (a key of config.INTERVAL_MS).
      start_ms: the first open time wanted (epoch ms), e.g. history's last + step.
      api_url: the host (config data.api_url); the path /api/v3/klines is appended.
      session: a requests Session from `binance.make_session(workers, retries)`.
      timeout: seconds per request.
      now_ms: the clock (epoch ms); None = the real one. Candles whose
        close_time_ms >= now_ms are still open and dropped.
      max_requests: the most HTTP requests, urllib3's retries included; None = the
        pages the span needs + EXTRA_REQUESTS.
      max_wait_s: the most seconds of Retry-After waiting.
    Returns:
      (open_time_ms int64 [N], ohlcv float64 [N, 5]), sorted, deduplicated, gaps
      left as they are (logged): one part for `parsing.build_series`.
    Raises:
      SeriesSkipped: the API failed, sent something that is not klines, or the
        request or wait budget ran out; the message names the URL.
    """
    step = INTERVAL_MS[interval]
    now = clock_ms() if now_ms is None else int(now_ms)
    budget = _Budget(max_requests or _request_limit(start_ms, now, step), max_wait_s)

    def get_page(cursor: int):
        url = _page_url(api_url, symbol, interval, cursor, now)
        return (*_parse_page(_get(session, url, timeout, budget), url), url)

    name = f"{symbol}-{interval} from {api_url}"
    pages = list(_pages(get_page, start_ms, now, step))
    times, ohlcv = _closed_rows(pages, start_ms, now, name)
    missing, longest = parsing.gap_stats(times, step) if len(times) else (0, 0)
    if missing:
        logging.warning(
            "%s: %d candles missing (longest run %d), not filled", name, missing, longest
        )
    return times, ohlcv


def merge_with_history(history_times, history_ohlcv, recent_times, recent_ohlcv, step_ms):
    """History (Vision files) plus fresh candles, one row per open time.

    The history wins where both have a candle: its files are checksum-verified and
    are what the saved models were trained on, so adding fresh data never changes
    a candle a model has already seen, and the merge of a given history is the
    same whatever the API returned. Differing values are counted, not hidden.

    Args:
      history_times, history_ohlcv: int64 [T], float64 [T, 5], sorted, unique.
      recent_times, recent_ohlcv: int64 [N], float64 [N, 5] from `fetch_recent`.
      step_ms: the interval in ms.
    Returns:
      (times int64 [M], ohlcv float64 [M, 5], Seam), sorted; gaps never filled.
    """
    shared = np.isin(recent_times, history_times)  # [N]
    at = np.searchsorted(history_times, recent_times[shared])
    # Compare bit patterns, as parsing.sort_dedupe does, so equal NaNs count as equal.
    differs = history_ohlcv[at].view(np.int64) != recent_ohlcv[shared].view(np.int64)
    times, ohlcv = parsing.sort_dedupe(
        np.concatenate([history_times, recent_times[~shared]]),
        np.concatenate([history_ohlcv, recent_ohlcv[~shared]]),
        "history + fresh candles",
    )
    last = int(history_times[-1]) if len(history_times) else None
    beyond = recent_times[recent_times > last] if last is not None else recent_times[:0]
    first = int(beyond.min()) if len(beyond) else None
    missing = (first - last) // step_ms - 1 if first is not None else 0
    seam = Seam(int(shared.sum()), int(differs.any(1).sum()), int(missing), last, first)
    return times, ohlcv, seam


def newest_closed_age(times_ms, step_ms: int, now_ms: int) -> int:
    """Whole intervals from the newest closed candle's open time to now_ms.

    1 means up to date (the newest candle closed within the last interval); 2 or
    more means closed candles are missing, and a forecast from it is stale.
    A candle is closed when open + step_ms <= now_ms.

    Raises:
      ValueError: no candle in times_ms has closed by now_ms.
    """
    times_ms = np.asarray(times_ms, np.int64)
    closed = times_ms[times_ms + step_ms <= now_ms]
    if not len(closed):
        raise ValueError(f"no candle closed by {parsing.iso(now_ms)}")
    return int((now_ms - closed.max()) // step_ms)


def _top_up_one(s: Series, data_cfg, api_url: str, session, now: int | None) -> Series:
    """One history Series extended with the fresh closed candles after its last one."""
    step = INTERVAL_MS[s.interval]
    start = int(s.open_time_ms[-1]) + step
    fresh = fetch_recent(
        s.symbol, s.interval, start, api_url, session, data_cfg.timeout_seconds, now
    )
    times, ohlcv, seam = merge_with_history(s.open_time_ms, s.ohlcv, *fresh, step)
    if seam.missing:
        logging.warning(
            "%s: %d candles missing at the seam between the history (last %s) and the "
            "fresh candles (first %s), not filled",
            s.name,
            seam.missing,
            parsing.iso(seam.history_last_ms),
            parsing.iso(seam.fresh_first_ms),
        )
    notes = dict(s.notes, fresh_source=api_url, fresh_candles=len(fresh[0]))
    notes.update(seam_missing=seam.missing, seam_differing=seam.differing)
    return parsing.build_series(s.symbol, s.interval, [(times, ohlcv)], data_cfg, notes)


def top_up(loaded: dict, skipped: dict, data_cfg, now_ms: int | None = None):
    """Extends every loaded series with its newest closed candles from the REST API.

    Args:
      loaded, skipped: a source's (name -> Series, name -> reason), e.g. binance.load's.
      data_cfg: the `data` group (api_url, retries, timeout_seconds, bad_rows,
        min_candles).
      now_ms: the clock (epoch ms); None = the real one.
    Returns:
      (name -> extended Series, name -> reason). A series whose fetch fails is
      skipped with the reason: stale candles are never passed off as fresh. Once the
      API does not connect (after the session's retries), the series after it are
      skipped unasked: each would wait out the same retries (minutes offline).
    """
    api_url = data_cfg.api_url
    session = binance.make_session(1, data_cfg.retries)
    extended, skipped = {}, dict(skipped)
    unreachable = ""  # why the API is taken to be down, once a connection has failed
    for name, s in loaded.items():
        if unreachable:
            skipped[name] = f"fresh candles: not requested: {unreachable}"
            continue
        try:
            extended[name] = _top_up_one(s, data_cfg, api_url, session, now_ms)
        except (SeriesSkipped, parsing.KlineError) as e:
            skipped[name] = f"fresh candles: {e}"
            if isinstance(e.__cause__, requests.ConnectionError):
                unreachable = f"{api_url} did not connect for {name}"
    return extended, skipped
