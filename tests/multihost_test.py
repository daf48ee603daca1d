"""A multi-host run (two processes joined by jax.distributed) equals a one-process run.

Two real processes, one CPU device each, train one group of two coins: the coin axis
is sharded across the processes, both save their shards of the group checkpoints, and
process 0 writes the workdir (TensorBoard files included). A single process with two devices runs the same
per-device programs, so results.json and metrics.jsonl must match it exactly. So must a
pooled model's (train.share=pooled), data-parallel over the two processes: its steps'
all-reduces (gloo between processes) add two partial sums, which is exact in either order.
Each process trains both runs, one after the other (one join, one start-up), and the
reference runs beside the pair: the module's processes start once, for both tests.
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.models import heads
from cpbjax.training import checkpoint
from tests import helpers

ROOT = helpers.ROOT
EPOCHS = 4
NAMES = ("BTCUSDT-1h", "ETHUSDT-1h")
SHARES = ("series", "pooled")  # each process trains both runs, one after the other
_DRIVE = (
    "import sys; from tests import multihost_test as t; "
    "t.drive(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))"
)


def run_config(port: int, process_id: int, num_processes: int, share: str = "series"):
    """Two series in one group of two (one coin per device), checkpoints every 2 epochs;
    with share="pooled", one model of both, without plots or TensorBoard."""
    c = helpers.pooled_config() if share == "pooled" else helpers.tiny_config()
    c.data.symbols = ("BTCUSDT", "ETHUSDT")
    c.train.group_size, c.train.epochs, c.train.patience = 2, EPOCHS, EPOCHS
    c.ckpt.every_epochs = 2
    c.logging.tensorboard = share == "series"
    if share == "pooled":
        c.eval.plots = False
    if num_processes > 1:
        c.distributed.enabled = True
        c.distributed.coordinator_address = f"127.0.0.1:{port}"
        c.distributed.num_processes, c.distributed.process_id = num_processes, process_id
    return config_lib.validate(c)


def drive(workdir: str, port: int, process_id: int, num_processes: int) -> None:
    """<workdir>/<share> of each of SHARES, trained in this one process (and its one join)."""
    from cpbjax import runtime  # noqa: PLC0415 (after the subprocess's env is set)
    from cpbjax.modes import driver

    for share in SHARES:
        config = run_config(port, process_id, num_processes, share)
        if share == SHARES[0]:
            runtime.configure(config)  # joins the other process, once
        driver.train_and_evaluate(config, os.path.join(workdir, share))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(workdir, port, process_id, num_processes, devices_per_process):
    env = helpers.subprocess_env(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}"
    )
    log = open(f"{workdir}-{process_id}.log", "w")  # noqa: SIM115 (closed in _wait)
    cmd = [
        sys.executable,
        "-c",
        _DRIVE,
        str(workdir),
        str(port),
        str(process_id),
        str(num_processes),
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


def _wait(proc) -> None:
    try:
        proc.wait(timeout=420)
    finally:
        proc.kill()
        proc.log.close()
    with open(proc.log.name) as f:
        assert proc.returncode == 0, f.read()[-4000:]


def _comparable(workdir):
    (results, metrics) = helpers.comparable(workdir)
    run = results.pop("run")
    return results, metrics, run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """<root>/multi/<share> of two joined processes (one device each), and
    <root>/single/<share> of the reference, one process with two devices, run beside them
    (it joins no one: it fills the pair's waits)."""
    root, port = tmp_path_factory.mktemp("multihost"), _free_port()
    procs = [_start(root / "multi", port, i, 2, devices_per_process=1) for i in range(2)]
    procs.append(_start(root / "single", port, 0, 1, devices_per_process=2))
    for proc in procs:
        _wait(proc)
    return root


def test_two_processes_equal_one_process_with_two_devices(runs):
    multi, single = runs / "multi" / "series", runs / "single" / "series"

    multi_results, multi_metrics, multi_run = _comparable(multi)
    single_results, single_metrics, single_run = _comparable(single)
    assert multi_run["process_count"] == 2 and single_run["process_count"] == 1
    assert multi_run["device_count"] == single_run["device_count"] == 2
    assert multi_results == single_results
    assert multi_metrics == single_metrics
    assert [r["epoch"] for r in multi_metrics] == list(range(1, EPOCHS + 1))
    # Both processes wrote their shard of each group checkpoint; it restores whole.
    entries = sorted(os.listdir(multi / "checkpoints" / "group-000"))
    assert entries == ["2", "4", checkpoint.DIGESTS_FILE]  # process 0 records the digests
    for name in ("BTCUSDT-1h", "ETHUSDT-1h"):
        assert multi_results["series"][name]["status"] == "trained"
        _, meta = checkpoint.load_series_model(str(multi / "models" / name))
        assert meta["series"] == name
    assert writers.read_json(str(multi / "config.json"))["distributed"]["num_processes"] == 2
    # Process 0 alone wrote the TensorBoard run of the group: one file, every epoch.
    tb_dir = multi / "tb" / "group-000"
    assert len(os.listdir(tb_dir)) == 1
    events = event_accumulator.EventAccumulator(str(tb_dir))
    events.Reload()
    val = [e.value for e in events.Scalars("val_loss/BTCUSDT-1h")]
    expected = [r["val_loss"][0] for r in multi_metrics]
    np.testing.assert_allclose(val, expected, rtol=1e-6)


def test_pooled_model_over_two_processes_equals_one_process_with_two_devices(runs):
    multi, single = runs / "multi" / "pooled", runs / "single" / "pooled"

    multi_results, multi_metrics, multi_run = _comparable(multi)
    single_results, single_metrics, single_run = _comparable(single)
    assert multi_run["process_count"] == 2 and multi_run["device_count"] == 2
    assert multi_run["share"] == single_run["share"] == "pooled"
    assert multi_results == single_results
    assert multi_metrics == single_metrics
    assert [r["epoch"] for r in multi_metrics] == list(range(1, EPOCHS + 1))
    # One model: both series' saved models hold the same params, but for the band that
    # eval.refit_band fits to each series (and the column fallback each decides on its
    # own val windows, taken off here).
    saved_params = [checkpoint.load_series_model(str(multi / "models" / n))[0] for n in NAMES]
    models = [heads.without_keep(p) for p in saved_params]
    leaves = [jax.tree_util.tree_flatten_with_path(m)[0] for m in models]
    shared = 0
    for (path, a), (_, b) in zip(*leaves, strict=True):
        if "band" not in jax.tree_util.keystr(path):
            np.testing.assert_array_equal(a, b)
            shared += 1
    assert shared == len(leaves[0]) - 2  # all but band_high and band_low
