"""Worker processes that never outlive the run: spawned, and ended once their parent is gone;
and numpy work mapped over threads (`numpy_threads`).

The run's plots (report/plot_workers.py) and a large load's parses (data/parse_pool.py)
go to such a pool. Workers are spawned, never forked: the run's process holds JAX's
threads, and a fork of a multithreaded process can deadlock. A spawned worker imports
the run's main module and what its task needs, so starting one costs about a second.
Each worker ends itself once the run's process is gone (`_watch_parent`): a run killed
by SIGKILL runs no shutdown, and its idle workers would otherwise wait on their queue
for as long as the machine runs.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import sys
import threading
import time

import threadpoolctl

# How often a worker checks that the run's process is still its parent.
PARENT_POLL_S = 0.5
# glibc's mallopt parameter of the most malloc arenas (M_ARENA_MAX in malloc.h).
_M_ARENA_MAX = -8


def spawn(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of `workers` spawned processes that end with the process that made it."""
    return concurrent.futures.ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_watch_parent,
        initargs=(os.getpid(),),
    )


def cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# Threads of one map of numpy work (`numpy_threads`), where the cores allow.
MAX_THREADS = 8


def threads() -> int:
    """Threads for a map of numpy work: one per core this process may run on, at most
    MAX_THREADS."""
    return min(MAX_THREADS, cores())


def limit_malloc_arenas() -> bool:
    """Caps glibc's malloc at one arena per core (at least 2); whether it did.

    glibc gives a thread that finds its arena busy an arena of its own, up to 8 per core,
    and memory freed in one arena is not reused by another: the scoring, XLA and fetch
    threads kept faulting in fresh pages. Capped, the global run's `--mode evaluate` peaks
    at 2.0 instead of 3.2 GB and spends half the system time (docs/performance.md
    "Evaluation"). launch.py calls it before any thread starts. The user's own
    MALLOC_ARENA_MAX wins (glibc read it at the start), and other C libraries (macOS,
    musl) are left alone.
    """
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.mallopt(_M_ARENA_MAX, max(2, cores())) == 1
    except (OSError, AttributeError):  # no glibc, or one without mallopt
        return False


def idle_cores() -> float:
    """Cores that the 1-minute load average leaves idle (every core where it cannot be
    read): on a machine other programs keep busy, workers would only add their start."""
    try:
        return cores() - os.getloadavg()[0]
    except OSError:
        return cores()


def _watch_parent(parent: int) -> None:
    """Worker initializer: a daemon thread ends the worker once `parent` (the run's
    process) is gone, between tasks, while waiting for one, or in the middle of one.

    An orphan is adopted by another process, so os.getppid() stops being `parent`. This
    works on every POSIX system and, unlike Linux's PR_SET_PDEATHSIG, does not fire when
    merely the thread that happened to spawn the worker ends while the run goes on.
    """
    watch = threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True)
    watch.start()


def _exit_when_orphaned(parent: int) -> None:
    """Sleeps while `parent` is this process's parent, then ends the process at once."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)  # nothing of the worker's is worth finishing: its results have no reader


def numpy_threads(fn, items: list, threads: int) -> list:
    """[fn(item) for item in items], `threads` at a time (in order; the first error raises).

    For numpy work of independent items (the setup's per-series fits, the series' scores):
    numpy's sorts, dots and least squares release the GIL, so threads overlap them. BLAS
    keeps to one thread while they run, as launch.py starts it: a Python session that
    loaded numpy first (cpbjax.train, fit) has an OpenBLAS thread per core, which
    competed with these (the global run's scoring on 2 cores: 29 s, against 17 s held to
    one; docs/performance.md "Evaluation").
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with (
        threadpoolctl.threadpool_limits(limits=1, user_api="blas"),
        concurrent.futures.ThreadPoolExecutor(threads) as pool,
    ):
        return list(pool.map(fn, items))
