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
