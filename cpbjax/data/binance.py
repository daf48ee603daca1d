"""Binance Vision spot klines: month selection, verified cached downloads, local mirrors.

`data.base_url` is either an http(s) host laid out like data.binance.vision, or a
directory (plain path or file:// URL) with the same layout. For each series the
`data.months` newest monthly files that exist up to `data.end` are used:
  - a directory: "exist" means present; files are read and verified in place;
  - HTTP: months are probed newest first, at most data.months + PROBE_EXTRA_MONTHS
    of them, and a 404 means the month does not exist.
Every zip is checked against its .zip.CHECKSUM (sha256). A download whose body is
truncated, whose checksum does not match, or which is not a zip (e.g. an HTML
error page) is fetched once more; if it fails again, the month is recorded as
failed. Verified downloads land in the cache through a temporary file and an
atomic rename, zip first and CHECKSUM last, so a cached zip counts as verified
only when its CHECKSUM sits beside it; it is never downloaded again.

Retries of connection errors, timeouts, 429 and 5xx are urllib3's `Retry`: at
most data.retries per request, exponential backoff with jitter capped at
BACKOFF_MAX_S, so one request takes at most about
(retries + 1) * timeout_seconds + retries * BACKOFF_MAX_S.
"""

from __future__ import annotations

import calendar
import concurrent.futures
import dataclasses
import datetime
import hashlib
import io
import itertools
import os
import re
import threading
import time
import urllib.parse
import urllib.request
import zipfile

import requests
import urllib3
from absl import logging
from requests.adapters import HTTPAdapter
from rich import progress as rich_progress

from cpbjax import __version__, writers
from cpbjax import config_rules as rules
from cpbjax.data import parsing
from cpbjax.data.series import SeriesSkipped

BACKOFF_FACTOR = 0.5  # urllib3 sleeps BACKOFF_FACTOR * 2**(n - 1) s before retry n...
BACKOFF_JITTER_S = 0.5  # ...plus uniform(0, BACKOFF_JITTER_S) s...
BACKOFF_MAX_S = 30.0  # ...but never longer than this (Retry-After included).
RETRY_STATUSES = (429, 500, 502, 503, 504)
PROBE_EXTRA_MONTHS = 24  # Over HTTP, months probed beyond data.months before giving up.
LOG_EVERY_S = 5.0  # Progress log interval when stderr is not a terminal.
_CHUNK_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class FileRef:
    """One kline zip: a month "YYYY-MM" (monthly file) or a day "YYYY-MM-DD" (daily)."""

    symbol: str
    interval: str
    period: str

    @property
    def name(self) -> str:
        return f"{self.symbol}-{self.interval}-{self.period}.zip"

    @property
    def relpath(self) -> str:
        kind = "monthly" if len(self.period) == 7 else "daily"
        return f"data/spot/{kind}/klines/{self.symbol}/{self.interval}/{self.name}"


@dataclasses.dataclass
class Fetched:
    """The outcome for one file: ok (with its parsed klines), missing, failed or invalid."""

    ref: FileRef
    status: str  # ok | missing | failed (unverifiable download) | invalid (bad content)
    reason: str = ""
    klines: tuple | None = None  # (open_time_ms [N], ohlcv [N, 5]) when ok


def resolve_end(end: str, today: datetime.date) -> str:
    """data.end as "YYYY-MM"; "" means the last complete month before `today` (UTC)."""
    if end:
        return end
    first = today.replace(day=1) - datetime.timedelta(days=1)
    return first.strftime("%Y-%m")


def months_back(end: str, count: int) -> list[str]:
    """`count` months from `end` backwards, newest first."""
    index = int(end[:4]) * 12 + int(end[5:7]) - 1
    return [f"{i // 12:04d}-{i % 12 + 1:02d}" for i in range(index, index - count, -1)]


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


def _checksum_problem(data: bytes, expected: str) -> str | None:
    """Why `data` is not the verified zip, or None if it is."""
    if not data.startswith(b"PK"):
        head = data[:1024].lstrip().lower()
        if head.startswith(b"<!doctype html") or b"<html" in head:
            return "got an HTML page instead of a zip"
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        return f"checksum mismatch (sha256 {digest[:12]}..., CHECKSUM says {expected[:12]}...)"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            z.namelist()
    except zipfile.BadZipFile as e:
        return f"not a valid zip ({e})"
    return None


def _parse_checksum(text: str, name: str) -> str:
    """The sha256 hex digest of a "<sha256>  <zipname>" CHECKSUM file.

    Raises:
      ValueError: malformed content.
    """
    digest = text.split()[0].lower() if text.split() else ""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"malformed {name}.CHECKSUM: {text[:60]!r}")
    return digest


def _parsed(ref: FileRef, data: bytes) -> Fetched:
    try:
        return Fetched(ref, "ok", klines=parsing.read_kline_zip(data, ref.name))
    except parsing.KlineError as e:
        return Fetched(ref, "invalid", reason=str(e))


class DirMirror:
    """A local directory (or file:// URL) in the Binance Vision layout, read in place."""

    missing_reason = "missing from the mirror"

    def __init__(self, root: str):
        self.root = self.where = root
        self.progress = Progress("off")  # Reading local files needs no progress bar.

    def monthly_candidates(self, symbol: str, interval: str, end: str, count: int) -> list:
        """Every month present up to `end`, newest first (a listing costs nothing)."""
        return sorted(
            (p for p in self._present(symbol, interval, "monthly") if p <= end), reverse=True
        )

    def daily_candidates(self, symbol: str, interval: str, days: list[str]) -> list[str]:
        """The days among `days` (newest first) that are present."""
        present = self._present(symbol, interval, "daily")
        return [d for d in days if d in present]

    def _present(self, symbol: str, interval: str, kind: str) -> set[str]:
        folder = os.path.join(self.root, "data", "spot", kind, "klines", symbol, interval)
        pattern = re.compile(rf"{re.escape(symbol)}-{re.escape(interval)}-([0-9-]+)\.zip")
        names = os.listdir(folder) if os.path.isdir(folder) else []
        return {m.group(1) for m in map(pattern.fullmatch, names) if m}

    def fetch(self, ref: FileRef) -> Fetched:
        """Reads one zip and its CHECKSUM, verifies and parses it."""
        path = os.path.join(self.root, ref.relpath)
        try:
            with open(path, "rb") as f:
                data = f.read()
            with open(path + ".CHECKSUM") as f:
                expected = _parse_checksum(f.read(), ref.name)
        except FileNotFoundError as e:
            return Fetched(ref, "failed", reason=f"no {os.path.basename(e.filename)}")
        except (OSError, ValueError) as e:
            return Fetched(ref, "failed", reason=str(e))
        problem = _checksum_problem(data, expected)
        if problem:
            return Fetched(ref, "failed", reason=f"{problem} in {path}")
        return _parsed(ref, data)


def make_session(workers: int, retries: int) -> requests.Session:
    """A requests Session whose adapter retries with urllib3 `Retry` (module constants)."""
    retry = urllib3.Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,
        backoff_factor=BACKOFF_FACTOR,
        backoff_jitter=BACKOFF_JITTER_S,
        backoff_max=BACKOFF_MAX_S,
        retry_after_max=max(1, int(BACKOFF_MAX_S)),
        status_forcelist=RETRY_STATUSES,
        allowed_methods=frozenset({"GET"}),
        raise_on_status=False,
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=workers)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = f"cpbjax/{__version__}"
    return session


class HttpMirror:
    """An http(s) host in the Binance Vision layout, downloaded into a verified cache."""

    missing_reason = "missing (HTTP 404)"

    def __init__(self, base_url: str, cache_dir: str, session, timeout: float, progress):
        self.base_url = self.where = base_url.rstrip("/")
        parsed = urllib.parse.urlparse(self.base_url)
        # One cache folder per mirror: different mirrors may publish different bytes.
        host = re.sub(r"[^A-Za-z0-9._-]+", "_", parsed.netloc + parsed.path).strip("_")
        self.cache_root = os.path.join(os.path.expanduser(cache_dir), host)
        self.session, self.timeout, self.progress = session, timeout, progress

    def monthly_candidates(self, symbol: str, interval: str, end: str, count: int) -> list:
        """Months to probe, newest first: a bounded look back from `end`."""
        return months_back(end, count + PROBE_EXTRA_MONTHS)

    def daily_candidates(self, symbol: str, interval: str, days: list[str]) -> list[str]:
        return days

    def fetch(self, ref: FileRef) -> Fetched:
        """The cached verified zip, or a verified download of it; parsed."""
        try:
            return self._fetch(ref)
        finally:
            self.progress.file_done()

    def _fetch(self, ref: FileRef) -> Fetched:
        path = os.path.join(self.cache_root, ref.relpath)
        cached = self._read_cache(path, ref.name)
        if cached is not None:
            return _parsed(ref, cached)
        url = f"{self.base_url}/{ref.relpath}"
        text, status, reason = self._get(url + ".CHECKSUM")
        if text is None:
            return Fetched(ref, "missing" if status == 404 else "failed", reason=reason)
        try:
            expected = _parse_checksum(text.decode(errors="replace"), ref.name)
        except ValueError as e:
            return Fetched(ref, "failed", reason=str(e))
        problems = []
        for _ in range(2):  # A bad or cut body is fetched once more, then the month fails.
            data, status, reason = self._get(url)
            problem = reason if data is None else _checksum_problem(data, expected)
            if problem is None:
                return self._store(ref, path, data, text)
            problems.append(problem)
            if status != 200:  # No body came: urllib3 has already retried the request.
                break
        return Fetched(ref, "failed", reason=" / then ".join(problems))

    def _store(self, ref: FileRef, path: str, data: bytes, checksum: bytes) -> Fetched:
        """Caches a verified zip, then its CHECKSUM (which marks it verified); parses it."""
        try:
            writers.atomic_write(path, data)
            writers.atomic_write(path + ".CHECKSUM", checksum)
        except OSError as e:
            return Fetched(ref, "failed", reason=f"cannot write to the cache ({e})")
        return _parsed(ref, data)

    def _read_cache(self, path: str, name: str) -> bytes | None:
        """A cached zip whose cached CHECKSUM still matches; a corrupt pair is deleted."""
        try:
            with open(path + ".CHECKSUM") as f:
                expected = _parse_checksum(f.read(), name)
            with open(path, "rb") as f:
                data = f.read()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(data).hexdigest() == expected:
            return data
        logging.warning("Cached %s fails its checksum; downloading it again.", path)
        for stale in (path + ".CHECKSUM", path):
            os.remove(stale)
        return None

    def _get(self, url: str) -> tuple[bytes | None, int | None, str]:
        """(body, status, reason): body is None on failure; urllib3 retries in `get`."""
        status = None
        try:
            with self.session.get(url, timeout=self.timeout, stream=True) as resp:
                status = resp.status_code
                if status != 200:
                    return None, status, f"HTTP {status} for {url}"
                chunks = []
                for chunk in resp.iter_content(_CHUNK_BYTES):
                    chunks.append(chunk)
                    self.progress.add_bytes(len(chunk))
                return b"".join(chunks), status, ""
        except requests.RequestException as e:
            return None, status, f"download failed ({type(e).__name__}: {str(e)[:200]})"


class Progress:
    """Files, bytes and ETA of downloads: a rich bar on a terminal, log lines elsewhere."""

    def __init__(self, mode: str):
        """`mode`: rich (a live bar), plain (log lines every LOG_EVERY_S) or off."""
        self.mode = mode
        self._lock = threading.Lock()
        self._files = self._done = self._bytes = 0
        self._start = self._last_log = time.monotonic()
        self._bar = None
        if mode == "rich":
            self._bar = rich_progress.Progress(
                rich_progress.TextColumn("klines"),
                rich_progress.BarColumn(),
                rich_progress.MofNCompleteColumn(),
                rich_progress.TextColumn("files"),
                rich_progress.TextColumn("{task.fields[mb]:.1f} MB"),
                rich_progress.TimeRemainingColumn(),
                transient=True,
            )
            self._task = self._bar.add_task("klines", total=0, mb=0.0)

    def __enter__(self):
        if self._bar:
            self._bar.start()
        return self

    def __exit__(self, *exc):
        if self._bar:
            self._bar.stop()
        self._log(force=True)

    def add_files(self, n: int) -> None:
        with self._lock:
            self._files += n
        if self._bar:
            self._bar.update(self._task, total=self._files)

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes += n
        if self._bar:
            self._bar.update(self._task, mb=self._bytes / 1e6)

    def file_done(self) -> None:
        with self._lock:
            self._done += 1
        if self._bar:
            self._bar.update(self._task, advance=1)
        else:
            self._log()

    def _log(self, force: bool = False) -> None:
        now = time.monotonic()
        quiet = self.mode != "plain" or not self._done
        if quiet or (not force and now - self._last_log < LOG_EVERY_S):
            return
        self._last_log = now
        eta = (now - self._start) / self._done * (self._files - self._done)
        logging.info(
            "klines: %d/%d files, %.1f MB, ETA %.0f s",
            self._done,
            self._files,
            self._bytes / 1e6,
            eta,
        )


def open_mirror(data_cfg):
    """The DirMirror or HttpMirror that data.base_url names.

    Raises:
      ConfigError: base_url is neither http(s) nor an existing directory.
    """
    url = data_cfg.base_url
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("http", "https"):
        session = make_session(data_cfg.download_workers, data_cfg.retries)
        progress = Progress("rich" if os.isatty(2) else "plain")
        return HttpMirror(url, data_cfg.cache_dir, session, data_cfg.timeout_seconds, progress)
    path = urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else url
    path = os.path.expanduser(path)
    if not os.path.isdir(path):
        rules.fail(
            "data.base_url",
            url,
            f"an http(s):// URL, a file:// URL or an existing directory ({path} is not a directory)",
        )
    return DirMirror(path)


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
    results = _fetch_rounds(mirror, months, data_cfg.months, pool)
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
      ConfigError: data.base_url is neither http(s) nor an existing directory.
    """
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    end = resolve_end(data_cfg.end, today)
    mirror = open_mirror(data_cfg)
    with mirror.progress, concurrent.futures.ThreadPoolExecutor(data_cfg.download_workers) as pool:
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
