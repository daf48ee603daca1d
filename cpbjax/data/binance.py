"""Binance Vision spot klines: month selection, parallel fetches, one Series per pair.

`data.base_url` is either an http(s) host laid out like data.binance.vision, or a
directory (plain path or file:// URL) with the same layout (`mirrors` reads and
verifies the files). For each series the `data.months` newest monthly files that
exist up to `data.end` are used (data.months=0: every one):
  - a directory: "exist" means present; files are read and verified in place;
  - HTTP: months are probed newest first, at most data.months +
    mirrors.PROBE_EXTRA_MONTHS of them, and a 404 means the month does not exist.
A file that fails verification twice, or holds candles outside its month, leaves its
month in the series' failed_months.
A plain http:// base_url works but logs one warning per run: its CHECKSUM files
travel over the same unencrypted channel as the zips they verify.

Over HTTP every request goes through `http_client.Client`, the REST source's policy:
one request's total deadline is data.timeout_seconds (connect, headers and body), one
file's (its CHECKSUM and zip, retries and Retry-After waits included)
data.download_deadline_s. A host that does not connect ends the run (ConfigError) at
its first failure; one that does not answer in time has the remaining files skipped.
"""

from __future__ import annotations

import calendar
import concurrent.futures
import datetime
import itertools
import os
import urllib.parse
import urllib.request

from absl import logging

from cpbjax import config_rules as rules
from cpbjax import workdir as workdir_lib
from cpbjax.data import http_client, parsed_cache, parsing
from cpbjax.data.mirrors import DirMirror, FileRef, HttpMirror, months_back
from cpbjax.data.progress import Progress
from cpbjax.data.series import SeriesSkipped

# (field, URL) of plain http:// URLs warned about in this process: one warning per run,
# however many times the run loads data.
_WARNED_PLAIN_HTTP: set[tuple[str, str]] = set()


def resolve_end(end: str, today: datetime.date) -> str:
    """data.end as "YYYY-MM"; "" means the last complete month before `today` (UTC)."""
    if end:
        return end
    first = today.replace(day=1) - datetime.timedelta(days=1)
    return first.strftime("%Y-%m")


def _next_month(month: str) -> str:
    year, mon = int(month[:4]), int(month[5:7])
    return f"{year + mon // 12:04d}-{mon % 12 + 1:02d}"


def _daily_periods(end: str, today: datetime.date) -> list[str]:
    """Days of the month after `end` up to yesterday (UTC), newest first."""
    month = _next_month(end)
    year, mon = int(month[:4]), int(month[5:7])
    days = [datetime.date(year, mon, d) for d in range(1, calendar.monthrange(year, mon)[1] + 1)]
    return [d.isoformat() for d in reversed(days) if d < today]


def _periods_between(first: str, last: str) -> list[str]:
    """Every month (or day) from `first` to `last` inclusive."""
    if len(first) == 7:
        span = (int(last[:4]) - int(first[:4])) * 12 + int(last[5:7]) - int(first[5:7])
        return months_back(last, span + 1)
    lo, hi = datetime.date.fromisoformat(first), datetime.date.fromisoformat(last)
    return [(lo + datetime.timedelta(days=i)).isoformat() for i in range((hi - lo).days + 1)]


def open_mirror(data_cfg):
    """The DirMirror or HttpMirror that data.base_url names.

    Raises:
      ConfigError: base_url is neither http(s) nor an existing directory.
    """
    url = data_cfg.base_url
    parsed = urllib.parse.urlparse(url)
    setting = data_cfg.get("parsed_cache", workdir_lib.CACHE_OFF)
    root = workdir_lib.cache_setting(setting, parsed_cache.FOLDER)
    cache = parsed_cache.ParsedCache(root) if root else None
    if parsed.scheme == "http":
        # The CHECKSUM comes over the same channel as the zip: both can be replaced.
        warn_plain_http(
            "data.base_url",
            url,
            "the zips and the CHECKSUM files that verify them come over one channel that "
            "anyone on the path can alter. Use https:// or a local mirror.",
        )
    if parsed.scheme in ("http", "https"):
        session = http_client.make_session(data_cfg.download_workers)
        client = http_client.Client(
            url.rstrip("/"),
            session,
            data_cfg.timeout_seconds,
            data_cfg.retries,
            budget_s=data_cfg.download_deadline_s,
        )
        progress = Progress("rich" if os.isatty(2) else "plain")
        return HttpMirror(url, data_cfg.cache_dir, client, progress, cache)
    path = urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else url
    path = os.path.expanduser(path)
    if not os.path.isdir(path):
        rules.fail(
            "data.base_url",
            url,
            f"an http(s):// URL, a file:// URL or an existing directory ({path} is not a directory)",
        )
    return DirMirror(path, cache)


def warn_plain_http(field: str, url: str, why: str) -> None:
    """Warns, once per field and URL, that `field`'s plain http:// `url` cannot be trusted
    (`why`: what anyone on the path can change)."""
    if (field, url) in _WARNED_PLAIN_HTTP:
        return
    _WARNED_PLAIN_HTTP.add((field, url))
    logging.warning("%s %s is plain http://, not encrypted: %s", field, url, why)


def _fetch_rounds(mirror, cursors: dict, need: int | None, pool) -> dict:
    """Fetches candidates newest first until `need` files exist per series (None: all).

    Each round fetches, for every series still short, as many further candidates
    as it still needs, all series in parallel. A missing file does not count.
    """
    results = {key: [] for key in cursors}
    while True:
        batch = []
        for key, cursor in cursors.items():
            have = sum(f.status != "missing" for f in results[key])
            take = None if need is None else max(need - have, 0)
            batch += [(key, ref) for ref in itertools.islice(cursor, take)]
        if not batch:
            return results
        mirror.progress.add_files(len(batch))
        outcomes = pool.map(mirror.fetch, [ref for _, ref in batch])
        for (key, _), fetched in zip(batch, outcomes, strict=True):
            results[key].append(fetched)


def _cursors(pairs, candidates) -> dict:
    """pair -> iterator of FileRefs over `candidates(symbol, interval)` (newest first)."""
    return {(s, i): iter([FileRef(s, i, p) for p in candidates(s, i)]) for s, i in pairs}


def _fetch_all(mirror, pairs, data_cfg, end: str, today: datetime.date, pool) -> dict:
    """pair -> list of Fetched (monthly, then daily when data.include_daily)."""
    months = _cursors(pairs, lambda s, i: mirror.monthly_candidates(s, i, end, data_cfg.months))
    results = _fetch_rounds(mirror, months, data_cfg.months or None, pool)  # 0: all months
    if data_cfg.include_daily:
        days = _daily_periods(end, today)
        cursors = _cursors(pairs, lambda s, i: mirror.daily_candidates(s, i, days))
        for key, fetched in _fetch_rounds(mirror, cursors, None, pool).items():
            results[key] += fetched
    return results


def _assemble(symbol: str, interval: str, fetched: list, data_cfg, mirror, end: str):
    """Builds one Series from its files; failures and holes go into notes."""
    invalid = [f for f in fetched if f.status == "invalid"]
    if invalid:
        raise SeriesSkipped(invalid[0].reason)
    ok = sorted((f for f in fetched if f.status == "ok"), key=lambda f: f.ref.period)
    failed = {f.ref.period: f.reason for f in fetched if f.status == "failed"}
    existing = {f.ref.period for f in fetched if f.status != "missing"}
    for length in (7, 10):  # Holes between the first and last existing month, then day.
        periods = sorted(p for p in existing if len(p) == length)
        for period in _periods_between(periods[0], periods[-1]) if periods else ():
            if period not in existing:
                failed[period] = mirror.missing_reason
    if not ok:
        detail = "".join(f"; {p}: {r}" for p, r in sorted(failed.items())[:3])
        raise SeriesSkipped(f"no usable kline file up to {end} in {mirror.where}{detail}")
    notes = {
        "months": [f.ref.period for f in ok if len(f.ref.period) == 7],
        "failed_months": dict(sorted(failed.items())),
    }
    if data_cfg.include_daily:
        notes["days"] = [f.ref.period for f in ok if len(f.ref.period) == 10]
    return parsing.build_series(symbol, interval, [f.klines for f in ok], data_cfg, notes)


def load(data_cfg, pairs, today: datetime.date | None = None):
    """Loads (symbol, interval) pairs from Binance Vision or a mirror of it.

    Args:
      data_cfg: the `data` config group.
      pairs: (symbol, interval) tuples.
      today: the UTC date that sets the default end month; None = now.
    Returns:
      (name -> Series, name -> skip reason); names like "BTCUSDT-1h".
    Raises:
      ConfigError: data.base_url is neither http(s) nor an existing directory, or its
        host did not connect.
    """
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    end = resolve_end(data_cfg.end, today)
    mirror = open_mirror(data_cfg)
    threads = concurrent.futures.ThreadPoolExecutor(mirror.fetch_threads(data_cfg.download_workers))
    with mirror.progress, mirror.parser, threads as pool:
        fetched = _fetch_all(mirror, pairs, data_cfg, end, today, pool)
    loaded, skipped = {}, {}
    for symbol, interval in pairs:
        name = f"{symbol}-{interval}"
        try:
            pair_files = fetched[symbol, interval]
            loaded[name] = _assemble(symbol, interval, pair_files, data_cfg, mirror, end)
        except (SeriesSkipped, parsing.KlineError) as e:
            skipped[name] = str(e)
    return loaded, skipped
