"""Tests that a run's helper processes do not outlive it: plot workers
(cpbjax/report/plot_workers.py) and parse workers (cpbjax/data/parse_pool.py) end once the
run's process is killed outright."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests import helpers

# Starts a pool of 2 plot workers, has each draw a series, prints their pids, then waits
# as a run does while its next group trains.
_POOL = """
import sys, time
from cpbjax.report import spec
from cpbjax.report.plot_workers import PlotWorkers
from tests.fake_data import forecast_record, report_config, report_history, report_results
names = ("BTCUSDT-1h", "ETHUSDT-1h")
records = {n: forecast_record(n, i) for i, n in enumerate(names)}
results = report_results(records)
workers = PlotWorkers(sys.argv[1], spec.make_spec(report_config()), 2)
for n in names:
    workers.submit({n: results["series"][n]}, report_history(names), {n: records[n]})
for future in workers._futures.values():
    future.result()
print(*sorted(workers._pool._processes), flush=True)
time.sleep(600)
"""

# Starts a load's 2 parse workers, waits until both can parse, prints their pids, then
# waits as a load does on its next file.
_PARSERS = """
import sys, time
from cpbjax import process_pool
from cpbjax.data import parse_pool
parse_pool.MIN_PARSES = 0
process_pool.idle_cores = lambda: 2.0  # however busy the test machine is
parser = parse_pool.Parser(None, workers=2)
parser._pool_for_a_miss()
for started in parser._started:
    started.result()
print(*sorted(parser._pool._processes), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
@pytest.mark.parametrize("script", [_POOL, _PARSERS], ids=["plot_workers", "parse_workers"])
def test_workers_end_when_their_run_is_killed(tmp_path, script):
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "plots")],
        env=helpers.subprocess_env(),
        cwd=helpers.ROOT,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    pids = []
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, (tmp_path / "log.txt").read_text()[-4000:]
        assert all(_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)  # no shutdown runs, as when a run is killed
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "workers outlived their run"
    finally:
        proc.kill()
        proc.wait()
        log.close()
        for p in pids:  # (only if the test failed) the workers it started
            if _alive(p):
                os.kill(p, signal.SIGKILL)


# Calls limit_malloc_arenas (unless argv[1] is "default"), has 4 threads per arena allowed
# churn malloc / free outside the GIL (ctypes releases it), then prints whether it capped,
# the cap and the arenas (heaps) glibc's malloc_info reports.
_ARENAS = """
import ctypes, os, re, sys, tempfile, threading
from cpbjax import process_pool
capped = sys.argv[1] != "default" and process_pool.limit_malloc_arenas()
cap = max(2, process_pool.cores())
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
def churn():
    for _ in range(20000):
        libc.free(libc.malloc(4096))
threads = [threading.Thread(target=churn) for _ in range(4 * cap)]
[t.start() for t in threads]
[t.join() for t in threads]
path = os.path.join(tempfile.mkdtemp(), "malloc.xml")
fp = ctypes.c_void_p(libc.fopen(path.encode(), b"w"))
libc.malloc_info(0, fp)
libc.fclose(fp)
print(capped, cap, len(re.findall(r'<heap nr="[0-9]+"', open(path).read())))
"""


def _arenas(*args, env=None) -> tuple[bool, int, int]:
    """(whether it capped, the cap, the arenas) of the _ARENAS script."""
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    proc = subprocess.run(
        [sys.executable, "-c", _ARENAS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=helpers.ROOT,
        env={**environ, "PYTHONPATH": helpers.ROOT, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    capped, cap, heaps = proc.stdout.split()
    return capped == "True", int(cap), int(heaps)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_malloc_arenas_are_one_per_core():
    """Threads that contend for malloc get up to 8 arenas per core from glibc, whose freed
    memory no other arena reuses; a run caps them at one per core. A user's own
    MALLOC_ARENA_MAX is left as it is."""
    capped, cap, heaps = _arenas("capped")
    assert capped and heaps <= cap, (cap, heaps)
    assert _arenas("default")[2] > cap  # the same churn, uncapped, takes more
    capped, _, heaps = _arenas("capped", env={"MALLOC_ARENA_MAX": "1"})
    assert not capped and heaps == 1
