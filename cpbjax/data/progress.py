"""Download progress of the kline files: a rich bar on a terminal, log lines elsewhere."""

from __future__ import annotations

import threading
import time

from absl import logging
from rich import progress as rich_progress

LOG_EVERY_S = 5.0  # Progress log interval when stderr is not a terminal.


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
