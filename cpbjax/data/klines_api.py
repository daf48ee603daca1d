"""The newest closed candles from Binance's public REST klines endpoint (no API key).

Binance Vision's monthly files end at the last complete month; this module tops a
series up to now from `GET {api_url}/api/v3/klines`, paging forward by startTime
(PAGE_LIMIT candles a page) until the pages reach now: by time, not by page length,
so a gap deep in the exchange's history (real history has outage holes) makes a page
short without ending the paging. Every gap is logged with its span; an empty page
ends the paging and is named ("the exchange returned nothing after ...") when the
newest candle is then stale. The candle still open at `now_ms` is never returned.

Every candle is checked before use (`_check_page`): close time = open time + the
interval - 1 ms, opening no later than now, on the interval's grid, prices positive
and low <= open, close <= high. A page with more rows than its limit, or a body over
http_client.MAX_BODY_BYTES, is refused. One bad page skips the series with a message
naming the URL or the candle (`SeriesSkipped`); the run goes on. So does a series whose
fresh candles open more than CONTINUITY_RATIO times away from its history's last close
(`_check_continues`): they are another symbol's or another scale's, not its newest.

Requests go through `http_client.Client`, as the Vision downloads do: each has a total
deadline (data.timeout_seconds, body included), each series' fetch a wall-clock budget
(http_client.SERIES_BUDGET_S), retries and Retry-After waits are bounded by it and
reported as waited.

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
from absl import logging

from cpbjax.data import binance, http_client, parsing
from cpbjax.data.series import INTERVAL_MS, Series, SeriesSkipped

KLINES_PATH = "/api/v3/klines"
PAGE_LIMIT = 1000  # Binance's maximum klines per request.
MIN_COLUMNS = 7  # open_time, open, high, low, close, volume, close_time (Binance sends 12).
EXTRA_REQUESTS = 10  # Requests allowed beyond the pages the span needs (retries, waits).
MAX_PAGES = 200  # 200k candles: 1m back about 4.6 months; older history is Vision's job.
GAPS_LOGGED = 10  # Gaps in the exchange's history logged one by one; the rest counted.
# The most the fresh candles' first open may differ from the history's last close, as a
# ratio either way. Across the seam (at most about a month and a day: Vision's files end
# at the last complete month) a listed pair rarely moves 10x, while another symbol's
# prices (BTC vs ETH ~20x, vs XRP ~10^5x) or another unit (1,000x) are far beyond it.
# A plain round bound, not tuned: pairs within 10x of each other are not caught.
CONTINUITY_RATIO = 10.0
# Rules of parsing.invalid_rows a REST candle must pass; the price-jump rule is left to
# data.bad_rows on the whole series (a page is too short a neighbourhood to judge it).
PAGE_RULES = (
    "non-positive or non-finite price",
    "negative or non-finite volume",
    "high below max(open, close)",
    "low above min(open, close)",
    "open_time off the interval grid",
)


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
    if len(rows) > PAGE_LIMIT:
        raise SeriesSkipped(
            f"{len(rows)} kline rows from {url}, beyond its limit={PAGE_LIMIT}: the server "
            "ignores the request's limit"
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


def _check_page(page, name: str, step: int, now: int, url: str) -> None:
    """Raises SeriesSkipped naming the first candle of `page` that breaks a rule.

    Binance's close time is the open time + the interval - 1 ms (as in Vision's files);
    another close time means another interval (or a made-up candle). A candle opening
    after `now` cannot exist yet, whatever close time it claims.
    """
    open_ms, ohlcv, close_ms = page
    checks = {
        "opens after now": open_ms > now,
        f"closes at the wrong time for {name.split()[0]} (close_time is not open_time + "
        f"{step} ms - 1; candles of another interval?)": close_ms != open_ms + step - 1,
    }
    invalid = parsing.invalid_rows(open_ms, ohlcv, step)
    checks.update({rule: invalid[rule] for rule in PAGE_RULES})
    for rule, bad in checks.items():
        if bad.any():
            i = int(np.argmax(bad))
            raise SeriesSkipped(
                f"{name}: the candle opening {parsing.iso(int(open_ms[i]))} "
                f"(close_time {parsing.iso(int(close_ms[i]) + 1)} - 1 ms) {rule}; "
                f"{int(bad.sum())} such in the page from {url}"
            )


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
    """Pages (open_ms [N], ohlcv [N, 5], close_ms [N]) from start_ms until one reaches now.

    Pages by time, not by page length: a gap in the exchange's history makes a page
    short without ending the history. Stops early only at an empty page.

    Returns:
      (pages, nothing_after_ms): the open time from which the exchange returned
      nothing, or None when the pages reached now.
    Raises:
      SeriesSkipped: a page that does not move the cursor forward (a server ignoring
        startTime).
    """
    pages, cursor = [], start_ms
    while cursor + step <= now:  # A candle opening at `cursor` could have closed by now.
        open_ms, ohlcv, close_ms, url = get_page(cursor)
        if not len(open_ms):
            return pages, cursor
        pages.append((open_ms, ohlcv, close_ms))
        following = int(open_ms.max()) + step
        if following <= cursor:
            raise SeriesSkipped(
                f"{url} returned a page ending at {parsing.iso(int(open_ms.max()))}, "
                f"not after startTime {parsing.iso(cursor)}: paging would not advance"
            )
        cursor = following
    return pages, None


def gap_spans(times: np.ndarray, step_ms: int) -> list[tuple[int, int, int]]:
    """(last open time before, first after, candles missing) of each gap in sorted times."""
    d = np.diff(times)
    return [
        (int(times[i]), int(times[i + 1]), int(d[i] // step_ms - 1))
        for i in np.nonzero(d > step_ms)[0]
    ]


def _log_gaps(name: str, gaps: list) -> None:
    for before, after, missing in gaps[:GAPS_LOGGED]:
        logging.warning(
            "%s: the exchange has no candles between %s and %s (%d missing), not filled",
            name,
            parsing.iso(before),
            parsing.iso(after),
            missing,
        )
    if len(gaps) > GAPS_LOGGED:
        logging.warning(
            "%s: and %d more gaps in the exchange's history", name, len(gaps) - GAPS_LOGGED
        )


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


def fetch_recent(symbol, interval, start_ms, client, now_ms=None, *, max_requests=None):
    """The closed candles of one series from `start_ms` to now, from the REST API.

    Args:
      symbol, interval: e.g. "BTCUSDT", "1h" (a key of series.INTERVAL_MS).
      start_ms: the first open time wanted (epoch ms), e.g. history's last + step.
      client: an `http_client.Client` of the API (data.api_url; the path /api/v3/klines is
        appended), with its per-request deadline, retries and this fetch's budget.
      now_ms: the clock (epoch ms); None = the real one. Candles whose
        close_time_ms >= now_ms are still open and dropped.
      max_requests: the most HTTP requests; None = the pages the span needs +
        EXTRA_REQUESTS.
    Returns:
      (open_time_ms int64 [N], ohlcv float64 [N, 5], report), sorted, deduplicated, gaps
      left as they are: the first two are one part for `parsing.build_series`; report
      is {"gaps": [(before_ms, after_ms, missing), ...], "nothing_after_ms": int | None}.
    Raises:
      SeriesSkipped: the API failed, sent something that is not valid klines, or the
        request, wait or time budget ran out; the message names the URL or the candle.
      http_client.Unreachable: (a SeriesSkipped) no connection, or no answer in time.
    """
    step = INTERVAL_MS[interval]
    now = clock_ms() if now_ms is None else int(now_ms)
    budget = client.budget(max_requests or _request_limit(start_ms, now, step))
    name = f"{symbol}-{interval} from {client.base_url}"

    def get_page(cursor: int):
        url = _page_url(client.base_url, symbol, interval, cursor, now)
        page = _parse_page(client.get(url, budget), url)
        _check_page(page, name, step, now, url)
        return (*page, url)

    pages, nothing_after = _pages(get_page, start_ms, now, step)
    times, ohlcv = _closed_rows(pages, start_ms, now, name)
    gaps = gap_spans(times, step)
    _log_gaps(name, gaps)
    return times, ohlcv, {"gaps": gaps, "nothing_after_ms": nothing_after}


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


def _why_stale(name: str, times, report: dict, step: int, now: int | None) -> None:
    """Logs why the newest candle after a top-up is older than one interval, if it is."""
    now = clock_ms() if now is None else now
    age = newest_closed_age(times, step, now) if len(times) else 0
    if age <= 1:
        return
    why = [f"the exchange returned nothing after {parsing.iso(report['nothing_after_ms'])}"]
    if report["nothing_after_ms"] is None:
        why = ["the exchange's newest closed candle is that one"]
    why += [f"a gap from {parsing.iso(b)} to {parsing.iso(a)}" for b, a, _ in report["gaps"][-1:]]
    logging.warning(
        "%s: the newest candle after the top-up (%s) is %d intervals old: %s",
        name,
        parsing.iso(int(times[-1])),
        age,
        "; ".join(why),
    )


def _check_continues(s: Series, fresh_times, fresh_ohlcv) -> None:
    """Refuses fresh candles whose first open is more than CONTINUITY_RATIO times away
    from the history's last close (either way): another symbol's candles or another
    price scale, which would give a forecast from a window that is half another market.

    Raises:
      SeriesSkipped: naming both candles and both prices.
    """
    beyond = np.flatnonzero(fresh_times > s.open_time_ms[-1])
    if not len(beyond):
        return
    last_close, first_open = float(s.ohlcv[-1, 3]), float(fresh_ohlcv[beyond[0], 0])
    ratio = first_open / last_close
    if 1 / CONTINUITY_RATIO <= ratio <= CONTINUITY_RATIO:
        return
    raise SeriesSkipped(
        f"they do not continue the history: the first fresh candle "
        f"({parsing.iso(int(fresh_times[beyond[0]]))}) opens at {first_open:.8g}, the "
        f"history's last close ({parsing.iso(int(s.open_time_ms[-1]))}) is {last_close:.8g}, "
        f"{max(ratio, 1 / ratio):.3g} times apart (over {CONTINUITY_RATIO:g}: another "
        "symbol or price scale?)"
    )


def _top_up_one(s: Series, data_cfg, client, now: int | None) -> Series:
    """One history Series extended with the fresh closed candles after its last one."""
    step = INTERVAL_MS[s.interval]
    start = int(s.open_time_ms[-1]) + step
    *fresh, report = fetch_recent(s.symbol, s.interval, start, client, now)
    _check_continues(s, *fresh)
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
    _why_stale(s.name, times, report, step, now)
    notes = dict(s.notes, fresh_source=client.base_url, fresh_candles=len(fresh[0]))
    notes.update(seam_missing=seam.missing, seam_differing=seam.differing)
    notes.update(fresh_gaps=len(report["gaps"]), fresh_nothing_after_ms=report["nothing_after_ms"])
    return parsing.build_series(s.symbol, s.interval, [(times, ohlcv)], data_cfg, notes)


def top_up(loaded: dict, skipped: dict, data_cfg, now_ms: int | None = None):
    """Extends every loaded series with its newest closed candles from the REST API.

    Args:
      loaded, skipped: a source's (name -> Series, name -> reason), e.g. binance.load's.
      data_cfg: the `data` group (api_url, retries, timeout_seconds: one request's
        deadline, body included; bad_rows, min_candles).
      now_ms: the clock (epoch ms); None = the real one.
    Returns:
      (name -> extended Series, name -> reason). A series whose fetch fails is
      skipped with the reason: stale candles are never passed off as fresh. Each
      series' fetch has http_client.SERIES_BUDGET_S of wall clock. Once the API does not
      connect or does not answer in time, the series after it are skipped unasked:
      each would wait out the same deadline.
    """
    api_url = data_cfg.api_url
    if api_url.startswith("http://"):
        binance.warn_plain_http(
            "data.api_url", api_url, "anyone on the path can change the fresh candles; use https://"
        )
    session = http_client.make_session()
    client = http_client.Client(api_url, session, data_cfg.timeout_seconds, data_cfg.retries)
    extended, skipped = {}, dict(skipped)
    unreachable = ""  # why the API is taken to be down, once it failed that way
    for name, s in loaded.items():
        if unreachable:
            skipped[name] = f"fresh candles: not requested: {unreachable}"
            continue
        try:
            extended[name] = _top_up_one(s, data_cfg, client, now_ms)
        except (SeriesSkipped, parsing.KlineError) as e:
            skipped[name] = f"fresh candles: {e}"
            if isinstance(e, http_client.Unreachable):
                unreachable = f"{api_url} {e.why} for {name}"
    return extended, skipped
