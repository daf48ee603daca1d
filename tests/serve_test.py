"""Tests of --mode serve (cpbjax/modes/serve.py) over real HTTP on 127.0.0.1.

A module fixture trains one tiny series once (launch.py, 1 epoch) and starts
`launch.py --mode serve` on a free loopback port as a subprocess; the tests talk to
it with urllib and the last one stops it with SIGTERM. Every wait is bounded.
"""

import concurrent.futures
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import ml_collections
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import synthetic
from cpbjax.modes import serve
from tests import fake_data, http_helpers
from tests.fake_vision import FakeVision, running

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES = "BTCUSDT-1h"
TINY = [
    "--config=configs/gru.py:tiny",
    "--config.data.symbols=('BTCUSDT',)",
    "--config.data.intervals=('1h',)",
    "--config.train.epochs=1",
]
START_TIMEOUT_S = 180  # imports, model loading and a loaded 2-core machine
# A forecast's reason when its mirror's zips trickle in past a 1 s request deadline.
DRIPPED = re.compile(r"within its deadline of 1 s|did not answer within 1 s")


def _serve(workdir, port: int, log, flags=()):
    """`python launch.py --mode serve --workdir W --config.serve.port=P` (the run's config)."""
    cmd = [sys.executable, "launch.py", "--mode", "serve", "--workdir", workdir]
    cmd += [f"--config.serve.port={port}", *flags]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _wait_healthy(proc, port: int, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited {proc.returncode}:\n{_read(log_path)[-3000:]}")
        try:
            if http_helpers.request(port, "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)  # a refused connect costs nothing; the server is up sooner seen
    pytest.fail(f"no /health within {START_TIMEOUT_S}s:\n{_read(log_path)[-3000:]}")


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("serve") / "run")
    done = subprocess.run(
        [sys.executable, "launch.py", *TINY, f"--workdir={workdir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    """(process, port, log path) of a server on the trained workdir; stopped at the end."""
    port = http_helpers.free_port()
    log_path = str(tmp_path_factory.mktemp("serve-log") / "serve.log")
    with open(log_path, "wb") as log:
        proc = _serve(trained, port, log)
    try:
        _wait_healthy(proc, port, log_path)
        yield proc, port, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_health_and_series(server, trained):
    _, port, log_path = server
    assert f"Uvicorn running on http://127.0.0.1:{port}" in _read(log_path)  # loopback only
    status, body, _ = http_helpers.request(port, "/health")
    assert status == 200
    assert body["status"] == "ok" and body["model"] == "gru" and body["series"] == 1
    assert body["workdir"] == os.path.basename(trained)  # its name, never an absolute path
    status, body, _ = http_helpers.request(port, "/series")
    assert status == 200
    (entry,) = body["series"]
    assert entry["name"] == SERIES and entry["symbol"] == "BTCUSDT" and entry["interval"] == "1h"
    with open(os.path.join(trained, "results.json")) as f:
        recorded = json.load(f)["series"][SERIES]
    # With the default baseline a 1-epoch run may keep its untrained model (best_epoch null).
    assert (entry["status"], entry["best_epoch"]) == (recorded["status"], recorded["best_epoch"])
    assert entry["status"] in ("trained", "stopped_early") and entry["best_epoch"] in (None, 1)


def test_forecast_is_fresh_and_in_prices(server, trained):
    _, port, _ = server
    status, body, _ = http_helpers.request(port, f"/forecast/{SERIES}")
    assert status == 200, body
    assert body["series"] == SERIES and body["model"] == "gru" and body["horizon"] == 10
    candles = body["forecast"]
    assert [c["step"] for c in candles] == list(range(1, 11))
    times = [c["open_time_ms"] for c in candles]
    assert times[0] == body["last_open_time_ms"] + 3_600_000
    assert all(b - a == 3_600_000 for a, b in zip(times, times[1:], strict=False))
    # Its age, from the clock: the synthetic history ends long before now, so it is stale.
    after_ms = int(time.time() * 1000)  # the server's clock read came before this one
    expected_age = (after_ms - body["last_open_time_ms"]) // 3_600_000
    assert expected_age > 2 and body["age_intervals"] in (expected_age - 1, expected_age)
    last_close = body["last_candle"]["close"]
    for c in candles:  # prices near the last close, not the normalised space
        assert all(
            0.5 * last_close < c[k] < 2 * last_close for k in ("open", "high", "low", "close")
        )
        # The interval the model was saved with, as predict and the API give it.
        lower, upper = c["interval"]["lower"], c["interval"]["upper"]
        assert all(0.5 * last_close < lower[k] <= upper[k] < 2 * last_close for k in lower)
    assert body["interval_levels"] == [0.1, 0.9]
    # forecast.json's entry, as --mode predict writes it: prices at 8 significant digits,
    # and the test skill and kept flag of the run's results.json.
    prices = [c[k] for c in candles for k in ("open", "high", "low", "close")]
    assert all(float(f"{p:.8g}") == p for p in prices + [last_close])
    with open(os.path.join(trained, "results.json")) as f:
        recorded = json.load(f)["series"][SERIES]
    columns = recorded["test"]["columns"]
    assert body["test_skill"]["vs_naive"] == {c: columns[c]["skill"] for c in columns}
    assert body["kept_baseline"] is (recorded["best_epoch"] is None)


@pytest.mark.parametrize(
    "path, method, code, words",
    [
        ("/forecast/DOGEUSDT-1h", "GET", 404, "unknown series 'DOGEUSDT-1h'"),
        ("/forecast/BTCUSDT-4h", "GET", 404, "unknown series"),
        ("/forecast/btc%20usdt", "GET", 400, "malformed series name 'btc usdt'"),
        ("/forecast/%3Cscript%3E", "GET", 400, "malformed series name"),
        ("/forecast/..%2F..%2Fetc%2Fpasswd", "GET", 404, "no such path"),
        ("/forecast/", "GET", 404, "no such path"),
        ("/nothing-here", "GET", 404, "no such path"),
        ("/health", "POST", 405, "Method Not Allowed"),
        ("/forecast/" + "A" * 5000, "GET", 400, "'" + "A" * 64 + "'... (5000 characters)"),
    ],
)
def test_bad_requests_get_a_json_message(server, path, method, code, words):
    _, port, _ = server
    status, body, ctype = http_helpers.request(port, path, method)
    assert status == code
    assert ctype.startswith("application/json"), body
    assert words in body["error"] and body["status"] == code
    assert "Traceback" not in json.dumps(body) and len(body["error"]) < 300


def test_unknown_series_lists_the_known_ones(server):
    _, port, _ = server
    _, body, _ = http_helpers.request(port, "/forecast/DOGEUSDT-1h")
    assert body["series"] == [SERIES]


def test_malformed_http_gets_400_without_traceback(server):
    _, port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400") and b"Traceback" not in reply


def test_report_is_served(server, trained):
    """The training run wrote report.html (every run does); GET / serves exactly that."""
    _, port, _ = server
    with open(os.path.join(trained, "report.html"), encoding="utf-8") as f:
        page = f.read()
    status, body, ctype = http_helpers.request(port, "/")
    assert status == 200 and ctype.startswith("text/html")
    assert body == page and "<html" in body.lower() and SERIES in body


def test_sigterm_stops_cleanly(server):
    """Last in this file: stops the module's server."""
    proc, port, log_path = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    log = _read(log_path)
    assert "Traceback" not in log and "stopped" in log
    with pytest.raises(OSError):
        http_helpers.request(port, "/health")


def test_a_forecast_hung_on_the_network_blocks_neither_health_nor_sigterm(trained, tmp_path):
    """The data location accepts connections and never answers (a tarpit): /health and
    /series still answer, and SIGTERM ends the server within 10 s, the forecast 503."""
    with socket.socket() as tarpit:
        tarpit.bind(("127.0.0.1", 0))
        tarpit.listen(8)  # never accepted: the kernel completes the handshake, nothing more
        port, log_path = http_helpers.free_port(), str(tmp_path / "serve.log")
        hostile = [
            "--config.data.source=binance",
            f"--config.data.base_url=http://127.0.0.1:{tarpit.getsockname()[1]}",
            "--config.data.timeout_seconds=300",
            "--config.data.retries=0",
        ]
        with open(log_path, "wb") as log:
            proc = _serve(trained, port, log, hostile)
        try:
            _wait_healthy(proc, port, log_path)
            answers = {}
            asking = threading.Thread(
                target=lambda: answers.update(
                    forecast=http_helpers.request(port, f"/forecast/{SERIES}")
                ),
                daemon=True,
            )
            asking.start()
            assert select.select([tarpit], [], [], 60)[0], "the forecast never reached the tarpit"
            started = time.monotonic()
            assert (
                http_helpers.request(port, "/health")[0] == 200
                and http_helpers.request(port, "/series")[0] == 200
            )
            assert time.monotonic() - started < 5 and asking.is_alive()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
            asking.join(10)
            status, body, _ = answers["forecast"]
            assert status == 503 and "shutting down" in body["error"]
            assert "Traceback" not in _read(log_path)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_forecasts_from_a_dripping_mirror_free_their_slots_at_the_deadline(trained, tmp_path):
    """A mirror whose zips trickle in a byte at a time: every forecast in flight is
    answered by its download deadline (1 s a request, 3 s a file), so the slots are
    free again for the next forecast instead of held until a restart."""
    root = str(tmp_path / "mirror")
    synthetic.write_vision_mirror(root, ("BTCUSDT",), ("1h",), fake_data.last_complete_months(2))
    vision = FakeVision(root, mode="drip")
    port, log_path = http_helpers.free_port(), str(tmp_path / "serve.log")
    with running(vision) as base_url, open(log_path, "wb") as log:
        hostile = ["--config.data.source=binance", f"--config.data.base_url={base_url}"]
        hostile += [f"--config.data.cache_dir={tmp_path / 'cache'}"]
        hostile += ["--config.data.timeout_seconds=1", "--config.data.download_deadline_s=3"]
        proc = _serve(trained, port, log, hostile)
        try:
            _wait_healthy(proc, port, log_path)
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(serve.MAX_FORECASTS) as pool:
                asked = [f"/forecast/{SERIES}"] * serve.MAX_FORECASTS
                answers = list(pool.map(lambda path: http_helpers.request(port, path), asked))
            assert time.monotonic() - started < 30
            for status, body, _ in answers:  # skipped at the deadline, or gave up waiting
                waited = status == 503 and "another forecast has loaded data" in body["error"]
                assert waited or (status == 422 and DRIPPED.search(body["error"])), body
            status, body, _ = http_helpers.request(
                port, f"/forecast/{SERIES}"
            )  # a slot is free again
            assert status == 422 and DRIPPED.search(body["error"]), body
            assert "Traceback" not in _read(log_path)
        finally:
            proc.kill()
            proc.wait(timeout=30)


def test_port_in_use_exits_2(trained, tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        log_path = str(tmp_path / "busy.log")
        with open(log_path, "wb") as log:
            proc = _serve(trained, port, log)
        assert proc.wait(timeout=START_TIMEOUT_S) == 2
    log = _read(log_path)
    assert f"error: cannot serve on 127.0.0.1:{port}" in log and "Traceback" not in log


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("port", 0, "config.serve.port=0 is not allowed"),
        ("port", 65536, "<= 65535"),
        ("port", "80", "an integer"),
        ("host", "", "config.serve.host=''"),
        ("host", 127, "a host name or IP"),
    ],
)
def test_serve_config_is_checked(field, value, words):
    c = config_lib.load("configs/gru.py:tiny")
    assert (c.serve.host, c.serve.port) == ("127.0.0.1", 8000)
    # ConfigDict fields keep their type: replace the group to put a value of another type.
    c.serve = ml_collections.ConfigDict({**c.serve.to_dict(), field: value})
    with pytest.raises(ConfigError, match="serve") as e:
        config_lib.validate(c)
    assert words in str(e.value)


def test_serve_needs_a_trained_workdir(tmp_path):
    def launch(*args):
        cmd = [sys.executable, "launch.py", "--mode=serve", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)

    done = launch(*TINY)
    assert done.returncode == 2 and "--mode serve needs --workdir" in done.stderr
    done = launch(*TINY, f"--workdir={tmp_path}")
    assert done.returncode == 2 and "error: no saved model under" in done.stderr
    done = launch(f"--workdir={tmp_path}")  # no --config: the run's own, which is missing
    assert done.returncode == 2 and "cannot read the run's config" in done.stderr
    assert "Traceback" not in done.stderr


def test_run_config_reads_the_workdir(trained):
    """configs/workdir.py:W, what the server ran with, is the config the run trained with."""
    expected = config_lib.load("configs/gru.py:tiny")
    expected.data.symbols, expected.data.intervals = ("BTCUSDT",), ("1h",)
    expected.train.epochs = 1
    assert config_lib.load(f"configs/workdir.py:{trained}").to_dict() == expected.to_dict()
