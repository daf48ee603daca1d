"""The parsed-array cache: each verified kline zip's parsed candles, keyed by its sha256.

Parsing a month's CSV costs far more than reading its arrays, so the first parse of a
zip is kept as `<root>/v<FORMAT>/<sha256>.klines` (`data.parsed_cache`, whose folder
`workdir.cache_setting` names)
and a rerun reads the arrays instead. An entry is trusted only through checksums: its
name is the zip's sha256 that the zip's CHECKSUM gave and its bytes matched, so a changed
zip simply misses; and the entry carries the sha256 of its own arrays (with the zip's
digest and FORMAT mixed in), so a flipped byte, a cut file or an entry copied under
another name is detected, named in one warning, and re-parsed and rewritten by the
caller. Entries are written with `writers.atomic_write`, without fsync (the digest is
the check): a killed run leaves no half entry. Only parsed klines are cached; an invalid
zip is parsed again on every run (its series is skipped anyway). A load with many zips
to parse parses and writes them in worker processes (parse_pool.py).

An entry is one flat record, no pickle and no archive: a fixed header (MAGIC, the digest
as 64 hex characters, the candle count N, little-endian uint64), then open_time as
little-endian int64 [N] and ohlcv as little-endian float64 [N, 5]. Reading one is a
length check, two views of its bytes and one sha256 (an .npz, FORMAT 1, took a zip
reader and three array headers per month: most of a warm load).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading

import numpy as np
from absl import logging

from cpbjax import writers

# Bumped whenever parsing.read_kline_zip may return other arrays for the same bytes, or
# the entry's layout changes: entries of an older FORMAT sit in another folder and are
# never read.
FORMAT = 2
MAGIC = b"cpbjax-klines-2\n"
_HEADER = struct.Struct(f"<{len(MAGIC)}s64sQ")  # MAGIC, digest (hex), N
_TIMES, _OHLCV = np.dtype("<i8"), np.dtype("<f8")  # little-endian on every machine
FOLDER = "parsed"  # its workdir.user_cache name


def _digest(zip_sha256: str, times: np.ndarray, ohlcv: np.ndarray) -> str:
    """What an entry's arrays must hash to: FORMAT, the zip's digest, dtypes, shapes, bytes."""
    h = hashlib.sha256(f"cpbjax-parsed-v{FORMAT}:{zip_sha256}".encode())
    for a in (times, ohlcv):
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class ParsedCache:
    """The entries under one folder; `load` and `store` are safe from many threads."""

    def __init__(self, root: str):
        self.root = root
        self._lock = threading.Lock()
        self._store_failed = False  # One warning per run when the folder is unwritable.

    def path(self, zip_sha256: str) -> str:
        return os.path.join(self.root, f"v{FORMAT}", f"{zip_sha256}.klines")

    def load(self, zip_sha256: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The cached (open_time_ms, ohlcv) of the zip, or None: absent, or damaged (warned)."""
        path = self.path(zip_sha256)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):  # no entry, or no folder to hold one
            return None
        except OSError as e:
            logging.warning("Parsed cache entry %s cannot be read (%s); parsing the zip.", path, e)
            return None
        klines, problem = _decode(data, zip_sha256)
        if problem:
            logging.warning(
                "Parsed cache entry %s is damaged (%s); parsing the zip.", path, problem
            )
        return klines

    def store(self, zip_sha256: str, klines: tuple[np.ndarray, np.ndarray]) -> None:
        """Writes the entry (`write`); a failure is warned about once and never stops the run."""
        try:
            self.write(zip_sha256, klines)
        except OSError as e:
            self.warn_unwritable(str(e))

    def write(self, zip_sha256: str, klines: tuple[np.ndarray, np.ndarray]) -> None:
        """Writes the entry atomically, without fsync: its digest catches what a power cut
        may leave (`writers.atomic_write`, durable=False).

        Raises:
          OSError: the folder or the entry cannot be written.
        """
        times, ohlcv = np.asarray(klines[0], _TIMES), np.asarray(klines[1], _OHLCV)
        header = _HEADER.pack(MAGIC, _digest(zip_sha256, times, ohlcv).encode(), len(times))
        entry = b"".join((header, times.tobytes(), ohlcv.tobytes()))
        writers.atomic_write(self.path(zip_sha256), entry, durable=False)

    def warn_unwritable(self, error: str) -> None:
        """Warns that an entry could not be written (`error`), once per ParsedCache."""
        with self._lock:
            first, self._store_failed = not self._store_failed, True
        if first:
            logging.warning("Cannot write to the parsed cache %s (%s).", self.root, error)


def _decode(data: bytes, zip_sha256: str):
    """(klines, None) of an intact entry, (None, what is wrong) of a damaged one."""
    if len(data) < _HEADER.size:
        return None, f"{len(data)} bytes, shorter than its header"
    magic, digest, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        return None, f"it does not start with {MAGIC!r}"
    size = _HEADER.size + n * (_TIMES.itemsize + 5 * _OHLCV.itemsize)
    if len(data) != size:
        return None, f"{len(data)} bytes where its {n} candles take {size}"
    times = np.frombuffer(data, _TIMES, n, _HEADER.size)
    ohlcv = np.frombuffer(data, _OHLCV, 5 * n, _HEADER.size + times.nbytes).reshape(n, 5)
    if _digest(zip_sha256, times, ohlcv).encode() != digest:
        return None, "its arrays do not match the digest it carries"
    return (times.astype(np.int64), ohlcv.astype(np.float64)), None
