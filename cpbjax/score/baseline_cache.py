"""The baseline-score cache: the scores a series gets from its candles alone, kept on disk,
so that a rerun on the same data fits no baseline again.

Of one series' scores, two blocks never read the model:
  - the fitted baselines of a split (ridge, vol_band, HAR: baselines.fitted_baselines),
    which read the naive forecasts' errors and nothing else of the model's columns;
  - the pinball losses of the bands an interval is compared with (intervals: "band",
    and with a blended scale "scaled_band").
On the global run they are about half of the evaluate stage (docs/performance.md
"Evaluation"). A new model, another learning rate, a sweep's next point, an ablate
setting, `--mode evaluate` or a rerun in a new workdir scores the same candles and
windows again: those blocks are read back here instead (`eval.baseline_cache`, default
$XDG_CACHE_HOME/cpbjax/baselines beside the parsed arrays; "off" for none).

Each block is kept as `<root>/v<FORMAT>/<key>.json`, key the sha256 of all it is
computed from: the block's name and settings (window sizes, levels, scale), the series'
candles (ohlc, open times, interval), the window ends it is fitted on and scores, the
source of the whole cpbjax package and numpy's version. So other data, windows or code
miss and are computed afresh; nothing is ever evicted (an entry is a few KB).
An entry is one line `MAGIC key sha256\\n`, then the block as JSON, the sha256 being
that JSON's bytes': a damaged entry (a flipped byte, a cut file, one copied under another
name) is named in one warning, recomputed and rewritten. Entries are written atomically
without fsync (writers.atomic_write, durable=False; the digest is the check); a folder
that cannot be written is warned about once per root, and the run goes on.

JSON gives floats back exactly (their repr), and a computed block is handed out as its
JSON round trip too, so a block read back is the block computed, bit for bit
(tests/baseline_cache_test.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from pathlib import Path

import numpy as np
from absl import logging

from cpbjax import writers

# Bumped when an entry's layout changes: entries of an older FORMAT are never read.
FORMAT = 1
MAGIC = "cpbjax-scores-1"
FOLDER = "baselines"  # its workdir.user_cache name
_PACKAGE = Path(__file__).resolve().parents[1]


@functools.cache
def code_digest() -> str:
    """sha256 of every .py file of the cpbjax package (by relative path) and numpy's
    version: what the cached blocks are computed by."""
    h = hashlib.sha256(f"numpy {np.__version__}".encode())
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(f"\0{path.relative_to(_PACKAGE).as_posix()}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def series_digest(prep, arrays) -> str:
    """sha256 of the series' interval, open times and candles, once per SeriesArrays."""

    def digest():
        h = hashlib.sha256(prep.interval.encode())
        for a in (np.asarray(prep.open_time_ms, "<i8"), np.asarray(prep.ohlc, "<f8")):
            h.update(f"{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return np.frombuffer(h.digest(), np.uint8).copy()

    return arrays.once("series_digest", digest).tobytes().hex()


def entry_key(block: str, settings: dict, prep, arrays, ends: dict) -> str:
    """The key of one block: sha256 of its name, settings (JSON), the series' digest, the
    window ends (name -> int [N]) and code_digest()."""
    h = hashlib.sha256(f"{MAGIC}\0{block}\0{json.dumps(settings, sort_keys=True)}".encode())
    h.update(f"\0{series_digest(prep, arrays)}\0{code_digest()}".encode())
    for name in sorted(ends):
        h.update(f"\0{name}\0".encode())
        h.update(np.asarray(ends[name], "<i8").tobytes())
    return h.hexdigest()


def cached(root: str, block: str, settings: dict, prep, arrays, ends: dict, compute) -> dict:
    """compute()'s block (JSON-ready) of the series `prep` (its SeriesArrays `arrays`),
    read from the cache under `root` when an intact entry is there, else computed and
    stored; root "" caches nothing. What it returns is the JSON round trip either way.

    Args:
      block, settings: what is computed and with what (JSON-ready): part of the key.
      ends: name -> the window ends it reads (int [N]): part of the key.
    """
    if not root:
        return compute()
    cache = _cache(root)
    key = entry_key(block, settings, prep, arrays, ends)
    found = cache.load(key)
    cache.count(read=found is not None)
    if found is not None:
        return found
    text = json.dumps(compute(), default=_plain)
    cache.store(key, text)
    return json.loads(text)


def _plain(value):
    """json.dumps' fallback: a numpy scalar or array as the Python value it holds (NaN
    stays NaN, which the cache's JSON keeps, unlike results.json's)."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot cache {type(value).__name__} value {value!r} as JSON")


class _Cache:
    """The entries under one folder; `load` and `store` are safe from many threads."""

    def __init__(self, root: str):
        self.root = root
        self._lock = threading.Lock()
        self._store_failed = False  # one warning per root when the folder is unwritable
        self.read = self.computed = 0  # blocks read back, and computed (and stored)

    def count(self, read: bool) -> None:
        with self._lock:
            self.read, self.computed = self.read + read, self.computed + (not read)

    def path(self, key: str) -> str:
        return os.path.join(self.root, f"v{FORMAT}", f"{key}.json")

    def load(self, key: str):
        """The block of the entry `key`, or None: absent, unreadable or damaged (warned)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            logging.warning("Baseline cache entry %s cannot be read (%s); recomputing.", path, e)
            return None
        head, _, text = data.partition(b"\n")
        if head != f"{MAGIC} {key} {hashlib.sha256(text).hexdigest()}".encode():
            logging.warning(
                "Baseline cache entry %s is damaged (its header or digest does not match "
                "its contents); recomputing.",
                path,
            )
            return None
        return json.loads(text)

    def store(self, key: str, text: str) -> None:
        """Writes the entry atomically without fsync; a failure is warned about once."""
        body = text.encode()
        head = f"{MAGIC} {key} {hashlib.sha256(body).hexdigest()}\n".encode()
        try:
            writers.atomic_write(self.path(key), head + body, durable=False)
        except OSError as e:
            with self._lock:
                first, self._store_failed = not self._store_failed, True
            if first:
                logging.warning("Cannot write to the baseline cache %s (%s).", self.root, e)


def counts(root: str) -> tuple[int, int]:
    """(blocks read back, blocks computed) under `root` in this process so far; (0, 0)
    for "" (no cache)."""
    if not root:
        return 0, 0
    cache = _cache(root)
    with cache._lock:
        return cache.read, cache.computed


_caches: dict[str, _Cache] = {}
_caches_lock = threading.Lock()


def _cache(root: str) -> _Cache:
    """The one _Cache of `root` in this process (so an unwritable folder warns once)."""
    with _caches_lock:
        return _caches.setdefault(root, _Cache(root))
