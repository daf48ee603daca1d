"""A verified zip's parsed candles: from the parsed cache, or parsed, in worker processes
once a load has many zips to parse and the machine has a core to spare.

Inflating a month and pyarrow's CSV reader run without the GIL, but the rest of a parse
(zipfile's reading, the kline checks, encoding the cache entry) is Python that holds it,
so binance._fetch_rounds' threads may not scale to many cores (unmeasured). `Parser`
reads the cache in the calling thread (a hit costs a file read and a sha256) and parses
a miss in that thread for the first MIN_PARSES of a load; then, if the load average
leaves a core idle, in a pool of spawned processes, one per core (cpbjax/process_pool.py), while the
threads go on reading and verifying, and parsing themselves until the workers are up.
The worker writes the cache entry too. Worker and thread call the same
`parsing.read_kline_zip` on the same bytes, so the arrays are the same either way.

The pool costs: a spawned worker imports the run's main module (about 1 s of CPU), and
each zip and its arrays are pickled through a pipe (a cold load of the default run's
3,881 months took about 4 s more CPU in all). So a small load (a test's mirror, a few
days of top-up) never starts it, nor does a busy machine: with every core taken by other
programs the pool made the cold load slower, not faster.
"""

from __future__ import annotations

import concurrent.futures
import threading

import numpy as np
from absl import logging

from cpbjax import process_pool
from cpbjax.data import parsing
from cpbjax.data.parsed_cache import ParsedCache

# Misses parsed in the calling thread before a load starts its pool (about 0.3 s of
# parsing): a load of fewer never pays the workers' start (about 1 s of CPU each, while
# the threads parse on); the default run's cold load has 3,881 months to parse.
MIN_PARSES = 256
# Workers start only while the load average leaves this many cores idle: where other
# programs use every core, workers add their start and their pickling and parse no faster
# (measured on the shared 2-core machine: a cold load of the default run took longer).
MIN_IDLE_CORES = 1.0
# At most this many workers: a parse waits in a fetch thread (data.download_workers,
# default 8), so more workers than that would be spawned to idle.
MAX_WORKERS = 8

Klines = tuple[np.ndarray, np.ndarray]  # (open_time_ms int64 [N], ohlcv float64 [N, 5])


class Parser:
    """The parsed candles of verified zips for one load; safe from many threads. Use it as
    a context manager (or `close` it): the end stops its workers.

    A pool that cannot start, or whose worker dies (killed, out of memory), is named in
    one warning and the load goes on parsing in its threads: nothing is lost.
    """

    def __init__(self, cache: ParsedCache | None, workers: int | None = None):
        """cache: the parsed cache, or None (data.parsed_cache="off"); workers: processes
        of the pool, default one per core up to MAX_WORKERS (one core starts none)."""
        self.cache = cache
        self.workers = workers or min(process_pool.cores(), MAX_WORKERS)
        self._lock = threading.Lock()
        self._misses = 0
        self._pool = None
        self._started = []  # one future per worker, done once it can parse

    def klines(self, name: str, data: bytes, sha256: str, max_bytes: int) -> Klines:
        """The candles of the verified zip `data` (file `name`, bytes hashing to `sha256`)
        whose CSV may unpack to `max_bytes`: the cache's intact entry, else parsed and stored.

        Raises:
          parsing.KlineError: the zip or its CSV is not valid klines (nothing is stored).
        """
        cached = self.cache.load(sha256) if self.cache else None
        if cached is not None:
            return cached
        args = (data, name, max_bytes, sha256, self.cache.root if self.cache else None)
        klines, unwritten = self._parse(args)
        if unwritten:
            self.cache.warn_unwritable(unwritten)
        return klines

    def _parse(self, args: tuple):
        """`parse(*args)` in a worker when the pool is up, else in this thread."""
        pool = self._pool_for_a_miss()
        if pool is None:
            return parse(*args)
        try:
            return pool.submit(parse, *args).result()
        except concurrent.futures.BrokenExecutor as e:
            self._stop_broken(e)
            return parse(*args)

    def _pool_for_a_miss(self):
        """Counts a miss; the pool to parse it in, or None: before the MIN_PARSES-th miss
        (which starts the pool), and while its workers start (they parse nothing until
        each has imported the parsing modules, so the threads go on parsing meanwhile)."""
        with self._lock:
            self._misses += 1
            if self._pool is None and self.workers > 1 and self._misses > MIN_PARSES:
                self._start_pool()
            if self._pool is None or not all(f.done() for f in self._started):
                return None
            return self._pool

    def _start_pool(self) -> None:
        """Spawns the workers (under the lock), unless other programs keep every core busy
        (the load parses on in its threads); a system that cannot spawn is warned about."""
        idle = process_pool.idle_cores()
        if idle < MIN_IDLE_CORES:
            logging.info("Zips parsed in this process: %.1f cores idle.", max(idle, 0.0))
            self.workers = 1
            return
        try:
            self._pool = process_pool.spawn(self.workers)
            self._started = [self._pool.submit(_imported) for _ in range(self.workers)]
        except (OSError, ImportError, NotImplementedError) as e:  # no processes, no semaphores
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self.workers = None, 1
            logging.warning("Cannot start parse workers (%s); parsing in this process.", e)

    def _stop_broken(self, error: Exception) -> None:
        """Stops a pool whose worker died, once: the load's later misses parse in their
        threads."""
        with self._lock:
            pool, self._pool, self.workers = self._pool, None, 1
        if pool is not None:
            logging.warning(
                "A parse worker died (%s); parsing the remaining zips in this process.", error
            )
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Waits for the parses under way and stops the workers (a later miss parses in its
        thread: the pool is not restarted)."""
        with self._lock:
            pool, self._pool, self.workers = self._pool, None, 1
        if pool:
            pool.shutdown()

    def __enter__(self) -> Parser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse(data: bytes, name: str, max_bytes: int, sha256: str, root: str | None):
    """The zip's candles and, when `root` names a parsed cache, their entry written there:
    (klines, None), or (klines, why the entry could not be written). Runs in a worker
    process or in the caller's thread.

    Raises:
      parsing.KlineError: the zip is not valid klines.
    """
    klines = parsing.read_kline_zip(data, name, max_bytes)
    if root is None:
        return klines, None
    try:
        ParsedCache(root).write(sha256, klines)
    except OSError as e:
        return klines, str(e)
    return klines, None


def _imported() -> None:
    """A worker's first task: unpickling it imports this module and the parsing modules."""
