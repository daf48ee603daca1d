"""Issue #55 items 3 and 5: a month's file holding other months' candles, and a full disk.

A monthly kline file whose candles fall outside its month is skipped like a file that
fails verification (its month under failed_months, naming the file and the span), on
parsed and on cached arrays alike. A write that fails with ENOSPC ends the run in one
`error:` line naming the file, exit 2, and a failing rerun leaves config.json as it was.
"""

import datetime
import errno
import os
import pathlib
import subprocess

import numpy as np
import pytest

from cpbjax import writers
from cpbjax.config import cli_errors
from cpbjax.config import schema as config_lib
from cpbjax.data import binance, parsed_cache, parsing, sources, synthetic
from tests import helpers

MONTHS = ["2024-12", "2025-01", "2025-02"]
BAD = "BTCUSDT-1h-2025-01.zip"
OUTSIDE = f"{BAD} holds candles from 2019-01-01 to 2019-01-31, outside 2025-01: skipped"


def _ms(day: str) -> int:
    return int(np.datetime64(day, "ms").astype(np.int64))


def _mirror_with_2019_in_january(root) -> None:
    """A mirror of BTCUSDT and ETHUSDT whose BTCUSDT 2025-01 zip (with a matching CHECKSUM)
    holds January 2019's candles."""
    synthetic.write_vision_mirror(str(root), ["BTCUSDT", "ETHUSDT"], ["1h"], MONTHS, seed=7)
    old = synthetic.generate("BTCUSDT", "1h", 744, 7, _ms("2019-02-01") - 1)
    path = os.path.join(root, "data/spot/monthly/klines/BTCUSDT/1h", BAD)
    synthetic.write_zip(path, synthetic.kline_csv(old.open_time_ms, old.ohlcv, "1h", False))


def _data_cfg(root, parsed_cache="off"):
    d = config_lib.base_config().data
    d.update(
        base_url=str(root),
        symbols=("BTCUSDT", "ETHUSDT"),
        intervals=("1h",),
        months=3,
        end="2025-02",
        min_candles=24,
        parsed_cache=str(parsed_cache),
    )
    return d


def _load(d):
    pairs = [(s, i) for s in d.symbols for i in d.intervals]
    return binance.load(d, pairs, today=datetime.date(2025, 3, 3))


def _assert_month_skipped(loaded, skipped) -> None:
    assert skipped == {}
    btc = loaded["BTCUSDT-1h"]
    assert btc.notes["months"] == ["2024-12", "2025-02"]
    assert btc.notes["failed_months"] == {"2025-01": OUTSIDE}
    assert btc.open_time_ms.min() >= _ms("2024-12-01")
    assert loaded["ETHUSDT-1h"].notes["failed_months"] == {}  # the other series untouched
    lines = sources.summary_lines(list(loaded.values()), skipped)
    assert lines == [f"BTCUSDT-1h: partly loaded: 2025-01 {OUTSIDE}"]


def test_a_month_holding_2019_candles_is_skipped_naming_file_and_span(tmp_path):
    _mirror_with_2019_in_january(tmp_path / "mirror")
    _assert_month_skipped(*_load(_data_cfg(tmp_path / "mirror")))


def test_the_month_check_also_runs_on_cached_arrays(tmp_path, monkeypatch):
    _mirror_with_2019_in_january(tmp_path / "mirror")
    d = _data_cfg(tmp_path / "mirror", parsed_cache=tmp_path / "parsed")
    _assert_month_skipped(*_load(d))  # parses, and caches what each zip holds
    entries = tmp_path / "parsed" / f"v{parsed_cache.FORMAT}"
    assert len(os.listdir(entries)) == 6  # the bad month's arrays too

    def no_parse(*args, **kwargs):
        raise AssertionError("a cached zip was parsed again")

    monkeypatch.setattr(parsing, "read_kline_zip", no_parse)
    _assert_month_skipped(*_load(d))


def test_a_day_file_holding_another_day_is_skipped(tmp_path):
    from cpbjax.data import mirrors

    ref = mirrors.FileRef("BTCUSDT", "1h", "2025-03-02")
    day = _ms("2025-03-02")
    inside = np.arange(day, day + 86_400_000, 3_600_000)
    assert mirrors._outside_period(ref, inside) is None
    assert mirrors._outside_period(ref, inside + 3_600_000) == (
        "BTCUSDT-1h-2025-03-02.zip holds candles from 2025-03-02 to 2025-03-03, "
        "outside 2025-03-02: skipped"
    )


# What TensorStore (under Orbax 0.12) raised when a checkpoint hit a full 256 KiB tmpfs.
ORBAX_FULL = (
    'RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database at local file '
    '"/mnt/full/ck/1.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp/ocdbt.process_0/": '
    'Failed writing: "/mnt/full/ck/1.orbax-checkpoint-tmp/d/ddcb": Failed to write 470325 '
    "bytes to file 11: No space left on device [os_error_code='28']"
)


def _launch_module(monkeypatch):
    """launch.py imported in-process, its environment defaults undone afterwards."""
    for name in ("XLA_FLAGS", "OPENBLAS_NUM_THREADS"):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    import launch

    return launch


def _full_disk_fsync(monkeypatch, under: str = "") -> None:
    """Every fsync of a file whose path holds `under` fails as on a full disk; like a real
    failed write, the error names no file."""
    real_write = writers._replace_atomically

    def write(path, data, durable):
        if under in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, data, durable)

    monkeypatch.setattr(writers, "_replace_atomically", write)


def _one_error_line(capsys, exit_info) -> str:
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_disk_full_names_the_file_through_every_wrapper(tmp_path):
    err = OSError(errno.ENOSPC, "No space left on device")
    assert cli_errors.disk_full(err, "w") == "cannot write to w: no space left on device"
    with pytest.raises(OSError) as named, writers.naming("w/results.json"):
        raise err
    assert named.value.filename == "w/results.json"
    assert cli_errors.disk_full(named.value, "w") == (
        "cannot write w/results.json: no space left on device"
    )
    wrapped = RuntimeError("a save failed")
    wrapped.__cause__ = ValueError(ORBAX_FULL)
    assert cli_errors.disk_full(wrapped, "w") == (
        "cannot write /mnt/full/ck/1.orbax-checkpoint-tmp/d/ddcb: no space left on device"
    )
    assert cli_errors.disk_full(OSError(errno.EACCES, "Permission denied", "x"), "w") is None
    assert cli_errors.disk_full(ValueError("RESOURCE_EXHAUSTED: out of memory"), "w") is None


@pytest.mark.parametrize("mode", ["train", "backtest"])
def test_full_disk_in_a_training_mode_is_one_line_and_exit_2(mode, tmp_path, monkeypatch, capsys):
    launch = _launch_module(monkeypatch)
    _full_disk_fsync(monkeypatch)
    config = helpers.tiny_config()
    with pytest.raises(SystemExit) as exit_info:
        launch.run_mode(mode, config, str(tmp_path / "run"))
    line = _one_error_line(capsys, exit_info)
    assert line.startswith(f"error: cannot write {tmp_path / 'run'}"), line
    assert line.endswith(": no space left on device"), line
    assert not (tmp_path / "run" / "config.json").exists()


def _tmpfs(path) -> None:
    """Mounts a 256 KiB tmpfs at `path`, or skips the test saying why it cannot."""
    os.makedirs(path)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {proc.stderr.strip()}")


def test_a_real_full_disk_under_orbax_names_the_file(tmp_path):
    from cpbjax.training import checkpoint

    full = tmp_path / "full"
    _tmpfs(full)
    try:
        params = {"w": np.random.default_rng(0).random((200, 1000)).astype(np.float32)}
        with pytest.raises(Exception) as raised:
            checkpoint.save_series_model(str(full / "BTCUSDT-1h"), params, {"series": "x"})
        line = cli_errors.disk_full(raised.value, str(full))
        assert line and line.startswith(f"cannot write {full}/BTCUSDT-1h.tmp/"), line
        assert line.endswith(": no space left on device"), line
    finally:
        subprocess.run(["umount", str(full)], check=False)


FINISHED = ("results.json", "config.json", "models", "checkpoints")


def _snapshot(workdir) -> dict:
    """The bytes of every file under a workdir's finished paths."""
    root = pathlib.Path(workdir)
    paths = [p for top in FINISHED for p in [root / top, *(root / top).rglob("*")]]
    return {str(p): p.read_bytes() for p in paths if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run of one series, one epoch."""
    from cpbjax.modes import driver

    config = helpers.tiny_config()
    config.data.symbols, config.train.epochs = ("BTCUSDT",), 1
    workdir = str(tmp_path_factory.mktemp("finished") / "run")
    driver.train_and_evaluate(config_lib.validate(config), workdir)
    return config, workdir


def test_a_rerun_failing_on_a_full_disk_leaves_config_json_as_it_was(
    finished, tmp_path, monkeypatch, capsys
):
    launch = _launch_module(monkeypatch)
    config, workdir = finished
    before = _snapshot(workdir)
    rerun = config_lib.validate(config.copy_and_resolve_references())
    rerun.eval.save_forecasts = True  # outside the ledger's fingerprint: config.json changes
    _full_disk_fsync(monkeypatch, under=os.path.join(workdir, "forecasts"))
    with pytest.raises(SystemExit) as exit_info:
        launch.run_mode("train", rerun, workdir)
    line = _one_error_line(capsys, exit_info)
    assert line == (
        f"error: cannot write {workdir}/forecasts/BTCUSDT-1h.npz: no space left on device"
    )
    assert _snapshot(workdir) == before


@pytest.mark.parametrize("mode", ["predict", "export"])
def test_full_disk_in_predict_and_export_is_one_line_and_exit_2(
    mode, finished, monkeypatch, capsys
):
    launch = _launch_module(monkeypatch)
    config, workdir = finished
    before = _snapshot(workdir)
    _full_disk_fsync(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        launch.run_mode(mode, config, workdir)
    line = _one_error_line(capsys, exit_info)
    assert line.startswith(f"error: cannot write {workdir}/"), line
    assert line.endswith(": no space left on device"), line
    assert _snapshot(workdir) == before


def test_orbax_and_asyncio_tracebacks_of_a_full_disk_are_not_logged(monkeypatch):
    import logging

    launch = _launch_module(monkeypatch)

    def record(path, level, msg, error=None):
        exc_info = (type(error), error, None) if error else None
        return logging.LogRecord("absl", level, path, 1, msg, None, exc_info)

    thread = "/site-packages/orbax/checkpoint/_src/futures/signaling.py"
    loop = "/lib/python3.11/asyncio/base_events.py"
    assert not launch._shown(record(thread, logging.ERROR, f"run() raised: {ORBAX_FULL}"))
    never = "Task exception was never retrieved"
    assert not launch._shown(record(loop, logging.ERROR, never, ValueError(ORBAX_FULL)))
    assert launch._shown(record(loop, logging.ERROR, never, ValueError("another failure")))
    assert launch._shown(record(thread, logging.WARNING, "a slow save"))
    assert not launch._shown(record(thread, logging.INFO, "saved step 3"))
    assert launch._shown(record("/cpbjax/modes/driver.py", logging.INFO, ORBAX_FULL))
