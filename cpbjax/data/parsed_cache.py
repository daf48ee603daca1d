"""The parsed-array cache: each verified kline zip's parsed candles, keyed by its sha256.

Parsing a month's CSV costs far more than reading its arrays, so the first parse of a
zip is kept as `<root>/v<FORMAT>/<sha256>.npz` (`data.parsed_cache`, `resolve_root`) and
a rerun reads the arrays instead. An entry is trusted only through checksums: its name
is the zip's sha256 that the zip's CHECKSUM gave and its bytes matched, so a changed
zip simply misses; and the entry carries the sha256 of its own arrays (with the zip's
digest and FORMAT mixed in), so a flipped byte, a cut file or an entry copied under
another name is detected, named in one warning, and re-parsed and rewritten by the
caller. Entries are written with `writers.atomic_write`, without fsync (the digest is
the check): a killed run leaves no half entry. Only parsed klines are cached; an invalid
zip is parsed again on every run (its series is skipped anyway). The .npz holds plain
arrays, read with allow_pickle=False. A load with many zips to parse parses and writes
them in worker processes (parse_pool.py).
"""

from __future__ import annotations

import hashlib
import io
import os
import threading

import numpy as np
from absl import logging

from cpbjax import writers

# Bumped whenever parsing.read_kline_zip may return other arrays for the same bytes:
# entries of an older FORMAT sit in another folder and are never read.
FORMAT = 1
OFF = "off"
DEFAULT = ("", "auto")  # data.parsed_cache values that mean default_root()


def default_root() -> str:
    """$XDG_CACHE_HOME/cpbjax/parsed, ~/.cache/cpbjax/parsed when that is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cpbjax", "parsed")


def resolve_root(setting: str) -> str | None:
    """The folder that data.parsed_cache names: None for "off", default_root() for ""
    or "auto", else the path (~ expanded)."""
    if setting == OFF:
        return None
    if setting in DEFAULT:
        return default_root()
    return os.path.expanduser(setting)


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
        return os.path.join(self.root, f"v{FORMAT}", f"{zip_sha256}.npz")

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
        times, ohlcv = klines
        buffer = io.BytesIO()
        np.savez(buffer, open_time=times, ohlcv=ohlcv, digest=_digest(zip_sha256, times, ohlcv))
        writers.atomic_write(self.path(zip_sha256), buffer.getvalue(), durable=False)

    def warn_unwritable(self, error: str) -> None:
        """Warns that an entry could not be written (`error`), once per ParsedCache."""
        with self._lock:
            first, self._store_failed = not self._store_failed, True
        if first:
            logging.warning("Cannot write to the parsed cache %s (%s).", self.root, error)


def _decode(data: bytes, zip_sha256: str):
    """(klines, None) of an intact entry, (None, what is wrong) of a damaged one."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as entry:
            times, ohlcv, digest = entry["open_time"], entry["ohlcv"], str(entry["digest"])
    # A damaged .npz can fail in numpy's or zipfile's reader with many exception types;
    # whichever it is, nothing of the entry is used and the zip is parsed instead.
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    shapes_ok = times.ndim == 1 and ohlcv.shape == (times.size, 5)
    if times.dtype != np.int64 or ohlcv.dtype != np.float64 or not shapes_ok:
        return None, f"arrays {times.dtype}{times.shape} and {ohlcv.dtype}{ohlcv.shape}"
    if _digest(zip_sha256, times, ohlcv) != digest:
        return None, "its arrays do not match the digest it carries"
    return (times, ohlcv), None
