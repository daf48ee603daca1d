"""Where kline zips come from: a Binance Vision directory mirror or an http(s) host, verified.

`DirMirror` reads a directory (plain path or file:// URL) in the data.binance.vision
layout in place; `HttpMirror` downloads from an http(s) host into a cache. Every zip
is checked against its .zip.CHECKSUM (sha256). A download whose body is truncated,
whose checksum does not match, or which is not a zip (e.g. an HTML error page) is
fetched once more; if it fails again, the month is recorded as failed. Verified
downloads land in the cache through a temporary file and an atomic rename, zip first
and CHECKSUM last, so a cached zip counts as verified only when its CHECKSUM sits
beside it; it is never downloaded again. Over HTTP, months are probed newest first,
at most data.months + PROBE_EXTRA_MONTHS of them (data.months=0: all back to
FIRST_MONTH), and a 404 means the month does not exist. A verified zip whose CSV is damaged, unpacks to more than
`parsing.csv_byte_cap` of its interval and period, or is not valid klines is
"invalid": its series is skipped with the reason, naming the file. A verified zip holding
a candle outside its month (or day) has that period failed, naming the file and the
span it holds (checked on the arrays whether parsed or cached). A verified zip's
parsed arrays are kept in, and read back from, the `parsed_cache` folder under the
sha256 its bytes matched; a load with many zips to parse parses them in worker processes
(`parser`, parse_pool.py, closed by the load). Both mirrors answer `monthly_candidates`,
`daily_candidates` and `fetch`.

Downloads follow http_client's policy: each request has a total deadline and a body
cap (a zip over MAX_ZIP_BYTES is refused unread), each file a wall-clock budget, and
Retry-After is waited out only within it. A host that does not connect ends the run
with one line naming the URL and the fix (a local mirror); one that does not answer in
time (a tarpit, a body trickling in) is one warning, and the remaining downloads are
skipped unasked, each file recorded as failed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import re
import urllib.parse
import zipfile

import numpy as np
from absl import logging

from cpbjax import config_rules as rules
from cpbjax import process_pool, writers
from cpbjax.data import http_client, parsing
from cpbjax.data.parse_pool import Parser
from cpbjax.data.progress import Progress
from cpbjax.data.series import SeriesSkipped

PROBE_EXTRA_MONTHS = 24  # Over HTTP, months probed beyond data.months before giving up.
# data.months=0 over HTTP probes every month back to this one (Binance Vision's spot
# klines begin in 2017-08).
FIRST_MONTH = "2017-01"
# The largest real monthly zip (1m candles) is a few MB and its CSV at most
# parsing.DEFAULT_MAX_CSV_BYTES (about 22 MB): a zip far beyond is refused unread.
MAX_ZIP_BYTES = 64 << 20
CHECKSUM_MAX_BYTES = 4 << 10  # "<sha256>  <zipname>" is about 100 bytes.
REQUESTS_PER_FILE = 3  # Its CHECKSUM and its zip twice, each with data.retries retries.
OFFLINE_FIX = (
    "without network, point --config.data.base_url at a local mirror (a folder laid out "
    "like data.binance.vision); months already in data.cache_dir need no network"
)


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


def _month_index(month: str) -> int:
    return int(month[:4]) * 12 + int(month[5:7]) - 1


def months_back(end: str, count: int) -> list[str]:
    """`count` months from `end` backwards, newest first."""
    index = _month_index(end)
    return [f"{i // 12:04d}-{i % 12 + 1:02d}" for i in range(index, index - count, -1)]


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


def _parsed(ref: FileRef, data: bytes, sha256: str, parser) -> Fetched:
    """Parses a verified zip whose bytes hash to `sha256`; its CSV may unpack to at most
    the cap of its interval and period. `parser` (parse_pool.Parser) answers from its
    cache when that holds an intact entry of that digest, and keeps what a parse returns."""
    cap = parsing.csv_byte_cap(ref.interval, ref.period)
    try:
        klines = parser.klines(ref.name, data, sha256, cap)
    except parsing.KlineError as e:
        return Fetched(ref, "invalid", reason=str(e))
    # Checked after either source: a cache entry holds what the zip holds, whatever
    # period the zip is filed under.
    outside = _outside_period(ref, klines[0])
    if outside:
        return Fetched(ref, "failed", reason=outside)
    return Fetched(ref, "ok", klines=klines)


def _outside_period(ref: FileRef, times) -> str | None:
    """Why the file's candles are not its period's (one opens before the month, or day,
    starts or once the next has begun), or None. Such a file is a mirror's mistake (e.g.
    an old month published under a new name): trained on, it would be data from
    elsewhere in time, so its period is skipped like one that fails verification."""
    start = np.datetime64(ref.period)  # month or day precision, from the period's form
    lo, hi = (t.astype("datetime64[ms]").astype(np.int64) for t in (start, start + 1))
    if times.size == 0 or (times.min() >= lo and times.max() < hi):
        return None
    first, last = (parsing.iso(int(t))[:10] for t in (times.min(), times.max()))
    return f"{ref.name} holds candles from {first} to {last}, outside {ref.period}: skipped"


class DirMirror:
    """A local directory (or file:// URL) in the Binance Vision layout, read in place."""

    missing_reason = "missing from the mirror"

    def __init__(self, root: str, parsed_cache=None):
        self.root = self.where = root
        self.progress = Progress("off")  # Reading local files needs no progress bar.
        self.parser = Parser(parsed_cache)  # parsed_cache: a ParsedCache, or None.

    def fetch_threads(self, download_workers: int) -> int:
        """Threads that fetch at once: one per core at most. A local read has no latency to
        hide, and more threads only contend for the GIL (docs/performance.md "Data loading")."""
        return min(download_workers, process_pool.cores())

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
        return _parsed(ref, data, expected, self.parser)


class HttpMirror:
    """An http(s) host in the Binance Vision layout, downloaded into a verified cache.

    Every request goes through one `http_client.Client` (its per-request deadline, body
    cap, bounded waits and breaker); each file's requests share one Budget (the client's
    budget_s: data.download_deadline_s). A cached verified file needs no network.
    """

    missing_reason = "missing (HTTP 404)"

    def __init__(self, base_url: str, cache_dir: str, client, progress, parsed_cache=None):
        self.base_url = self.where = base_url.rstrip("/")
        parsed = urllib.parse.urlparse(self.base_url)
        # One cache folder per mirror: different mirrors may publish different bytes.
        # Stripping dots too keeps "." and ".." (base_url=http://..) from naming
        # cache_dir itself or its parent: the folder is always one level inside it.
        host = re.sub(r"[^A-Za-z0-9._-]+", "_", parsed.netloc + parsed.path).strip("._")
        host = host or "no-host"
        self.cache_root = os.path.join(os.path.expanduser(cache_dir), host)
        self.client, self.progress = client, progress  # client: an http_client.Client
        self.parser = Parser(parsed_cache)  # parsed_cache: a ParsedCache, or None.

    def fetch_threads(self, download_workers: int) -> int:
        """Threads that fetch at once: data.download_workers, to overlap the requests."""
        return download_workers

    def monthly_candidates(self, symbol: str, interval: str, end: str, count: int) -> list:
        """Months to probe, newest first: a bounded look back from `end` (count 0: every
        month back to FIRST_MONTH)."""
        if count == 0:
            return months_back(end, max(_month_index(end) - _month_index(FIRST_MONTH) + 1, 0))
        return months_back(end, count + PROBE_EXTRA_MONTHS)

    def daily_candidates(self, symbol: str, interval: str, days: list[str]) -> list[str]:
        return days

    def fetch(self, ref: FileRef) -> Fetched:
        """The cached verified zip, or a verified download of it; parsed.

        Raises:
          ConfigError: the host did not connect (no network, a wrong host name); the
            message names the URL and the fix.
        """
        try:
            return self._fetch(ref)
        finally:
            self.progress.file_done()

    def _fetch(self, ref: FileRef) -> Fetched:
        path = os.path.join(self.cache_root, ref.relpath)
        cached = self._read_cache(path, ref.name)
        if cached is not None:
            return _parsed(ref, *cached, self.parser)
        url = f"{self.base_url}/{ref.relpath}"
        budget = self.client.budget(REQUESTS_PER_FILE * (self.client.retries + 1))
        checksum = self._get_checksum(ref, url, budget)
        if isinstance(checksum, Fetched):
            return checksum
        text, expected = checksum
        problems = []
        for _ in range(2):  # A bad or cut body is fetched once more, then the month fails.
            try:
                data = self._get(url, budget, MAX_ZIP_BYTES)
            except http_client.CutShort as e:
                problems.append(f"download failed ({e})")
                continue
            except SeriesSkipped as e:  # a status, the cap, the deadline: not asked again
                problems.append(str(e))
                break
            problem = _checksum_problem(data, expected)
            if problem is None:
                return self._store(ref, path, data, text, expected)
            problems.append(problem)
        return Fetched(ref, "failed", reason=" / then ".join(problems))

    def _get_checksum(self, ref: FileRef, url: str, budget) -> tuple[bytes, str] | Fetched:
        """(the .CHECKSUM's bytes, its sha256 digest) of the zip at `url`, or the file's
        outcome without them: missing (404) or failed."""
        try:
            text = self._get(url + ".CHECKSUM", budget, CHECKSUM_MAX_BYTES)
        except http_client.BadStatus as e:
            return Fetched(ref, "missing" if e.status == 404 else "failed", reason=str(e))
        except SeriesSkipped as e:
            return Fetched(ref, "failed", reason=str(e))
        try:
            return text, _parse_checksum(text.decode(errors="replace"), ref.name)
        except ValueError as e:
            return Fetched(ref, "failed", reason=str(e))

    def _get(self, url: str, budget, cap: int) -> bytes:
        """The body of `url`, at most `cap` bytes (see `Client.get`).

        Raises:
          SeriesSkipped: from `Client.get`. ConfigError: `url` did not connect.
        """
        try:
            data = self.client.get(url, budget, cap)
        except http_client.Unreachable as e:
            if self.client.down is e:  # this request opened the breaker
                self._say_down(e)
            raise
        self.progress.add_bytes(len(data))
        return data

    def _say_down(self, error) -> None:
        """Says once for the whole download that the host is down: a host that did not
        connect ends the run (its other files would need it too); one that did not answer
        in time is one warning, and the files after it are skipped unasked."""
        if error.why == http_client.DID_NOT_CONNECT:
            allowed = f"a host to connect to ({error}); {OFFLINE_FIX}"
            rules.fail("data.base_url", self.base_url, allowed)
        logging.warning(
            "data.base_url %s %s: the remaining downloads are skipped (%s); a slow host may "
            "need a larger --config.data.timeout_seconds",
            self.base_url,
            error.why,
            error,
        )

    def _store(self, ref: FileRef, path: str, data: bytes, checksum: bytes, sha256: str):
        """Caches a verified zip, then its CHECKSUM (which marks it verified); parses it."""
        try:
            writers.atomic_write(path, data)
            writers.atomic_write(path + ".CHECKSUM", checksum)
        except OSError as e:
            return Fetched(ref, "failed", reason=f"cannot write to the cache ({e})")
        return _parsed(ref, data, sha256, self.parser)

    def _read_cache(self, path: str, name: str) -> tuple[bytes, str] | None:
        """(bytes, sha256) of a cached zip whose cached CHECKSUM still matches; a corrupt
        pair is deleted."""
        try:
            with open(path + ".CHECKSUM") as f:
                expected = _parse_checksum(f.read(), name)
            with open(path, "rb") as f:
                data = f.read()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(data).hexdigest() == expected:
            return data, expected
        logging.warning("Cached %s fails its checksum; downloading it again.", path)
        for stale in (path + ".CHECKSUM", path):
            os.remove(stale)
        return None
