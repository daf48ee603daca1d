"""Tests of group compaction (train.compact_groups): once most coins of a group have
stopped, the live ones move to a smaller program, and must train exactly as before.

The runs force the move whenever at most half the coins train (the cost rule would never
pay with patience 2) and are compared with the same run computed whole; the cost rule's
own runs (fake clocks) come first. They run in one subprocess at XLA optimisation level 0
(as train_test's driver runs), since compiling the program sizes dominates their time;
the two-device runs run beside it in another.
"""

import contextlib
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.modes import driver
from cpbjax.training import checkpoint, compaction, ledger
from tests import helpers

EPOCHS = 14
# What the forced runs' coins do (seen on this config): 8 coins stop at different epochs,
# so the program shrinks 8 -> 4 -> 2 -> 1 with the live coins at scattered slots.
SHRINKS = [8, 4, 2, 1]
_RUNS = "import sys; from tests import compaction_test as t; t.run_all(sys.argv[1])"
_TWO_DEVICES = """
import os, sys
from cpbjax.modes import driver
from cpbjax.training import compaction
from tests import compaction_test as t
driver.train_and_evaluate(t.compaction_config(False), os.path.join(sys.argv[1], "whole"))
compaction.compaction_pays = lambda *args: True
driver.train_and_evaluate(t.compaction_config(True), os.path.join(sys.argv[1], "compacted"))
"""

# A config the cost rule itself compacts (patience 8: coins stop at epochs 9-29, and at
# epoch 18 three live coins with patience to spare move 8 -> 3).
RULE_EPOCHS, RULE_PATIENCE, RULE_SHRINKS = 30, 8, [8, 3]


def compaction_config(compact: bool):
    """8 tiny series in one group of 8, patience 2 (they stop at different epochs)."""
    c = helpers.tiny_config()
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT"), ("15m", "1h")
    c.train.group_size, c.train.epochs, c.train.patience = 8, EPOCHS, 2
    c.train.compact_groups = compact
    c.ckpt.every_epochs = 1
    return config_lib.validate(c)


class _Killed(Exception):
    pass


def run_all(root: str) -> None:
    """<root>/clocks (`run_clocks`, first: its compactions are the cost rule's own), then
    <root>/whole, <root>/compacted, and <root>/resumed: the compacted run killed just
    after a checkpoint taken while compacted, then resumed (<root>/killed.json says where
    and what the checkpoint held). One process: the runs share their compiled programs."""
    run_clocks(os.path.join(root, "clocks"))
    driver.train_and_evaluate(compaction_config(False), os.path.join(root, "whole"))
    compaction.compaction_pays = lambda *args: True
    compacted = os.path.join(root, "compacted")
    driver.train_and_evaluate(compaction_config(True), compacted)
    kill_epoch = _coins_computed(compacted).index(2) + 2  # a checkpoint taken at K=2
    save = checkpoint.GroupCheckpoints.maybe_save

    def save_then_die(self, epoch, state, force=False):
        saved = save(self, epoch, state, force)
        if epoch == kill_epoch:
            self.close()  # the checkpoint is complete, as after a kill just past it
            raise _Killed
        return saved

    resumed = os.path.join(root, "resumed")
    checkpoint.GroupCheckpoints.maybe_save = save_then_die
    with contextlib.suppress(_Killed):  # (killed.json shows whether it was)
        driver.train_and_evaluate(compaction_config(True), resumed)
    checkpoint.GroupCheckpoints.maybe_save = save
    ckpts = checkpoint.GroupCheckpoints(os.path.join(resumed, "checkpoints", "group-000"), 1, 5)
    state, epoch = ckpts.restore_latest(helpers.make_trainer(8).abstract_state())
    ckpts.close()
    killed = {
        "kill_epoch": kill_epoch,
        "restored_epoch": epoch,
        "restored_active": np.asarray(state.active).tolist(),
    }
    writers.write_json(os.path.join(root, "killed.json"), killed)
    driver.train_and_evaluate(compaction_config(True), resumed)


class _FakeClock:
    """Stands in for compaction's `time`: each epoch (two monotonic() calls) lasts the next
    of `durations` seconds."""

    def __init__(self, durations):
        self.durations, self.now, self.calls = iter(durations), 0.0, 0

    def monotonic(self) -> float:
        self.calls += 1
        if self.calls % 2 == 0:  # an epoch's end
            self.now += next(self.durations)
        return self.now


def run_clocks(root: str) -> None:
    """<root>/whole, and two compacted runs of one seed whose epochs seem to take other
    times: <root>/cheap (every epoch 10 s, compiles free) and <root>/dear (the first epoch
    1000 s, the others 1 s: a compile worth 999 epochs)."""

    def config(compact):
        c = compaction_config(compact)
        c.train.epochs, c.train.patience = RULE_EPOCHS, RULE_PATIENCE
        return c

    driver.train_and_evaluate(config(False), os.path.join(root, "whole"))
    cheap, dear = itertools.repeat(10.0), itertools.chain([1000.0], itertools.repeat(1.0))
    clock = compaction.time
    for name, durations in (("cheap", cheap), ("dear", dear)):
        compaction.time = _FakeClock(durations)
        driver.train_and_evaluate(config(True), os.path.join(root, name))
    compaction.time = clock


def _metrics_without_times(workdir) -> list[dict]:
    """metrics.jsonl's records less `seconds`, its only wall-clock field."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        del r["seconds"]
    return records


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """The whole and the compacted run sharded over 2 devices, started before `runs` so
    that the two subprocesses run side by side: (root, its running Popen)."""
    root = tmp_path_factory.mktemp("two-devices")
    env = helpers.subprocess_env(
        XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
        JAX_COMPILATION_CACHE_DIR=str(root / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    log = open(root / "log.txt", "w")  # noqa: SIM115 (closed by helpers.finish)
    proc = subprocess.Popen(
        [sys.executable, "-c", _TWO_DEVICES, str(root)],
        env=env,
        cwd=helpers.ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    proc.log = log
    yield root, proc
    proc.kill()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, two_devices):
    del two_devices  # started first, to run beside these
    root = tmp_path_factory.mktemp("compaction")
    env = helpers.cached_env(root / "jax-cache")
    proc = subprocess.run(
        [sys.executable, "-c", _RUNS, str(root)],
        env=env,
        cwd=helpers.ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def _coins_computed(workdir) -> list[int]:
    return [r["coins_computed"] for r in writers.MetricsLog(str(workdir)).records()]


def _assert_same_training(a, b):
    """Both workdirs trained every coin alike: statuses, epochs and losses, and params."""
    ra, rb = (writers.read_json(os.path.join(w, "results.json"))["series"] for w in (a, b))
    assert ra.keys() == rb.keys()
    for name in ra:
        for field in ("status", "epochs_run", "best_epoch"):
            assert ra[name][field] == rb[name][field], (name, field)
        assert ra[name]["best_val_loss"] == pytest.approx(rb[name]["best_val_loss"], rel=1e-5)
        test_a, test_b = ra[name]["test"]["columns"]["close"], rb[name]["test"]["columns"]["close"]
        assert test_a["mae"] == pytest.approx(test_b["mae"], rel=1e-5)
        pa, _ = checkpoint.load_series_model(os.path.join(a, "models", name))
        pb, _ = checkpoint.load_series_model(os.path.join(b, "models", name))
        helpers.assert_trees_close(pa, pb, **helpers.CROSS_PROGRAM)
    ma, mb = (writers.MetricsLog(str(w)).records() for w in (a, b))
    assert [(r["epoch"], r["active"]) for r in ma] == [(r["epoch"], r["active"]) for r in mb]
    for field in ("train_loss", "val_loss", "best_val_loss"):
        # None (JSON null) marks a coin that did not train that epoch.
        va = np.array([[np.nan if v is None else v for v in r[field]] for r in ma])
        vb = np.array([[np.nan if v is None else v for v in r[field]] for r in mb])
        np.testing.assert_allclose(va, vb, rtol=1e-5, err_msg=field)


def test_cost_rule_weighs_the_compile_against_the_epochs_saved():
    pays = compaction.compaction_pays
    # CPU: a compile costs 3 epochs; 2 live coins of 8 save 3/4 of an epoch per epoch.
    assert not pays(8, 2, 4, "cpu") and pays(8, 2, 5, "cpu")
    assert not pays(8, 4, 6, "cpu") and pays(8, 4, 7, "cpu")
    # GPU transformer-like: 1 s epochs, 32 s compile, half the coins live, 10 epochs left.
    assert not pays(40, 20, 10, "gpu") and pays(40, 20, 65, "gpu")


def test_compaction_is_not_part_of_the_run_fingerprint():
    config = compaction_config(True)
    assert ledger.fingerprint(config, [[]]) == ledger.fingerprint(compaction_config(False), [[]])


def test_compacted_group_trains_exactly_as_the_whole_group(runs):
    whole = _coins_computed(runs / "whole")
    assert whole == [8] * len(whole)
    shrinks = _coins_computed(runs / "compacted")
    assert sorted(set(shrinks), reverse=True) == SHRINKS
    assert shrinks == sorted(shrinks, reverse=True)
    _assert_same_training(runs / "compacted", runs / "whole")


def test_run_killed_while_compacted_resumes_to_the_same_training(runs):
    killed = writers.read_json(os.path.join(runs, "killed.json"))
    # The checkpoint taken while compacted holds the whole group, live and stopped coins.
    assert killed["restored_epoch"] == killed["kill_epoch"]
    epochs = writers.MetricsLog(str(runs / "compacted")).records()
    active = epochs[killed["kill_epoch"] - 1]["active"]
    assert killed["restored_active"] == active and 0 < sum(active) < 8
    log = writers.MetricsLog(str(runs / "resumed")).records()
    assert [r["epoch"] for r in log] == list(range(1, len(log) + 1))
    _assert_same_training(runs / "resumed", runs / "compacted")


def test_two_devices_round_the_program_up_and_train_the_same(two_devices):
    """Sharded over 2 devices the program stays a multiple of 2 (8 -> 4 -> 2)."""
    root, proc = two_devices
    helpers.finish(proc)
    assert sorted(set(_coins_computed(root / "compacted")), reverse=True) == [8, 4, 2]
    results = writers.read_json(os.path.join(root, "compacted", "results.json"))
    assert results["run"]["device_count"] == 2
    _assert_same_training(root / "compacted", root / "whole")


def test_same_seed_compacts_alike_whatever_its_epochs_take(runs):
    """Compaction decides from coins and epochs, never wall time: runs whose epochs seem
    to take different times write the same metrics.jsonl, and train as the whole group."""
    clocks = runs / "clocks"
    assert _metrics_without_times(clocks / "cheap") == _metrics_without_times(clocks / "dear")
    shrinks = _coins_computed(clocks / "cheap")
    assert sorted(set(shrinks), reverse=True) == RULE_SHRINKS
    _assert_same_training(clocks / "cheap", clocks / "whole")
