"""Progress of a counted stage (evaluation, plots, export): a count and an ETA in the log.

Training logs each epoch and the download shows its files (cpbjax/data/progress.py); the
stages after training work through series one by one, and without this they would run
for minutes in silence. A line at most every LOG_EVERY_S, then one line when all are done.
"""

from __future__ import annotations

import threading
import time

from absl import logging

LOG_EVERY_S = 5.0  # at most one progress line this often


class Counted:
    """`total` items of a stage, advanced as each one finishes (thread-safe).

    `label` names the stage in the log ("evaluate"), `unit` its items ("series").
    A stage of fewer than two items logs nothing: it has no progress to show.
    """

    def __init__(self, label: str, total: int, unit: str = "series"):
        self.label, self.total, self.unit = label, total, unit
        self._done = 0
        self._lock = threading.Lock()
        self._start = self._last_log = time.monotonic()

    def advance(self, n: int = 1) -> None:
        """Counts `n` more items done; logs the count and the ETA when LOG_EVERY_S passed."""
        with self._lock:
            self._done += n
            now = time.monotonic()
            if self.total < 2 or self._done >= self.total or now - self._last_log < LOG_EVERY_S:
                return
            self._last_log = now
            done = self._done
        eta_s = (now - self._start) / done * (self.total - done)
        logging.info("%s: %d/%d %s, ETA %.0f s", self.label, done, self.total, self.unit, eta_s)

    def finish(self) -> None:
        """Logs how many items the stage did and how long it took."""
        if self.total >= 2:
            took_s = time.monotonic() - self._start
            logging.info("%s: %d %s in %.1f s", self.label, self._done, self.unit, took_s)
