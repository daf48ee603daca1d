"""Tests of cpbjax.train: the compiled group epoch and the resumable run driver.

The engine tests train the real GRU (tiny) on the synthetic source. The driver tests
run `train_and_evaluate` in subprocesses that share a persistent compilation cache, so
only the first of them pays for compiling.
"""

import functools
import logging as std_logging
import os
import signal
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import logging

from cpbjax import models, sharding, writers
from cpbjax.config import schema as config_lib
from cpbjax.modes import driver
from cpbjax.score import saved
from cpbjax.training import checkpoint, early_stopping, epoch_spec, step, validation
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers
from tests.helpers import (
    CROSS_PROGRAM,
    EPOCHS,
    NUM_COINS,
    ROOT,
    assert_trees_close,
    coin,
    comparable,
    finish,
    kill_once_checkpointed,
    make_trainer,
    tiny_config,
    tiny_preps,
)
from tests.references import plain_window_losses, reference_early_stopping

driver_env = helpers.driver_env  # the module's subprocess environment (a fixture)


@functools.cache
def group_trainer():
    """The shared K=4 one-device trainer; any retrace of its epoch raises (max_traces=1)."""
    return make_trainer(NUM_COINS, max_traces=1)


def run_group(trainer, group, indices, epochs=EPOCHS, poison=None):
    """Trains `group` (PreparedSeries) from fresh coin keys; returns (state, per-epoch metrics)."""
    arrays = trainer.stack(list(group))
    if poison is not None:
        arrays = arrays.replace(inputs=arrays.inputs.at[poison].set(jnp.inf))
    state = trainer.init_state(coin_keys(0, indices), arrays)
    history = []
    for _ in range(epochs):
        state, metrics = trainer.run_epoch(state, arrays)
        history.append(jax.device_get(metrics))
    return state, history


@functools.cache
def clean_group_run():
    state, history = run_group(group_trainer(), tiny_preps(), range(NUM_COINS))
    return jax.device_get(state), history


@functools.cache
def fresh_group_state():
    """The untrained state that clean_group_run starts from (same coin keys), on the host."""
    trainer = group_trainer()
    return jax.device_get(
        trainer.init_state(coin_keys(0, range(NUM_COINS)), trainer.stack(list(tiny_preps())))
    )


# ---------------------------------------------------------------------------------------
# The compiled group program.


def test_vmapped_group_equals_separate_one_coin_trainings():
    group, history = clean_group_run()
    fresh = fresh_group_state()
    single_trainer = make_trainer(1)
    for i, prep in enumerate(tiny_preps()):
        single, single_history = run_group(single_trainer, [prep], [i])
        single = jax.device_get(single)
        assert_trees_close(coin(group.params, i), coin(single.params, 0), **CROSS_PROGRAM)
        assert_trees_close(coin(group.best_params, i), coin(single.best_params, 0), **CROSS_PROGRAM)
        np.testing.assert_allclose(
            [m["val_loss"][i] for m in history],
            [m["val_loss"][0] for m in single_history],
            rtol=1e-4,
        )
        # Training moved the params, so the equality above is not init == init.
        moved = jax.tree.map(
            lambda a, b: np.abs(a - b).max(),
            coin(group.params, i),
            coin(fresh.params, i),
        )
        assert max(jax.tree.leaves(moved)) > 1e-3


def test_adam_counts_only_batches_with_windows_and_padded_coin_is_frozen():
    group, history = clean_group_run()
    batch = tiny_config().train.batch_size
    expected = [EPOCHS * -(-len(p.ends["train"]) // batch) for p in tiny_preps()] + [0]
    for _, count in optax.tree_utils.tree_get_all_with_path(group.opt_state, "count"):
        np.testing.assert_array_equal(count, expected)
    patience, best_before_K = tiny_config().train.patience, fresh_group_state().best_val
    expected_active = []
    for i in range(3):
        vals = [m["val_loss"][i] for m in history]
        _, _, active, _, _ = reference_early_stopping(vals, patience, best_before_K[i])
        expected_active.append(active)
    assert [bool(a) for a in history[-1]["active"]] == [*expected_active, False]
    assert np.isnan(history[-1]["train_loss"][3]) and np.isnan(history[-1]["val_loss"][3])
    assert_trees_close(coin(group.params, 3), coin(group.best_params, 3), rtol=0, atol=0)
    np.testing.assert_array_equal(group.epochs_run, [EPOCHS] * 3 + [0])


def test_epoch_runs_under_transfer_guard():
    trainer = group_trainer()
    arrays = trainer.stack(list(tiny_preps()))
    state = trainer.init_state(coin_keys(0, range(NUM_COINS)), arrays)
    with jax.transfer_guard("disallow"):
        state, metrics = trainer.run_epoch(state, arrays)
        jax.block_until_ready((state, metrics))
        with pytest.raises(Exception, match="[Dd]isallowed"):  # the guard is really on
            jax.block_until_ready(jnp.ones(3) + np.ones(3))
    assert int(metrics["epoch"]) == 1


def test_epochs_groups_and_restored_states_never_retrace(tmp_path):
    trainer = group_trainer()  # wraps the epoch in chex.assert_max_traces(n=1)
    group_a, group_b = trainer.stack(list(tiny_preps())), trainer.stack(list(tiny_preps()[:2]))
    state = trainer.init_state(coin_keys(0, range(4)), group_a)
    for _ in range(2):
        state, _ = trainer.run_epoch(state, group_a)
    ckpts = checkpoint.GroupCheckpoints(str(tmp_path / "group-000"), 1, 1)
    ckpts.maybe_save(2, state, force=True)
    restored, epoch = ckpts.restore_latest(trainer.abstract_state())
    ckpts.close()
    assert epoch == 2
    restored, metrics = trainer.run_epoch(restored, group_a)
    assert int(metrics["epoch"]) == 3
    other = trainer.init_state(coin_keys(0, [5, 6, 7, 8]), group_b)
    for _ in range(2):
        other, metrics = trainer.run_epoch(other, group_b)
    assert [bool(a) for a in metrics["active"]] == [True, True, False, False]


def test_diverging_coin_is_frozen_and_never_poisons_the_others():
    clean, _ = clean_group_run()
    state, history = run_group(group_trainer(), tiny_preps(), range(NUM_COINS), poison=1)
    state = jax.device_get(state)
    first = history[0]
    assert bool(first["diverged"][1]) and not bool(first["active"][1])
    assert not first["diverged"][[0, 2]].any()
    assert int(state.diverged_epoch[1]) == 1 and int(state.epochs_run[1]) == 1
    # Frozen with its best params: it never improved, so those are its initial params.
    assert_trees_close(coin(state.params, 1), coin(state.best_params, 1), rtol=0, atol=0)
    chex.assert_tree_all_finite(state.params)
    for i in (0, 2):  # bit for bit what they learn without the poisoned coin
        for x, y in zip(
            jax.tree.leaves(coin(state.params, i)),
            jax.tree.leaves(coin(clean.params, i)),
            strict=True,
        ):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(
            [m["val_loss"][i] for m in history], [m["val_loss"][i] for m in clean_group_run()[1]]
        )


def _baseline_trainer(min_delta: float) -> GroupTrainer:
    config = tiny_config()
    config.model.baseline = "vol_band"
    config.train.min_delta = min_delta
    config = config_lib.validate(config)
    module = models.build(models.make_config(config))
    return GroupTrainer(
        epoch_spec.make_spec(config, module), NUM_COINS, sharding.coin_mesh(jax.devices()[:1])
    )


# Per coin and epoch, the val losses the early-stopping bookkeeping test scripts, in units
# of the untrained model's val loss (the baseline's, which is the best to beat).
SCRIPTED_VAL_LOSSES = np.array(
    [
        [1.0, 0.9, 0.95, 0.97, 0.99, 0.5],  # stops after `patience` epochs without improving
        [1.0, np.nan, 0.1, 0.1, 0.1, 0.1],  # diverges at epoch 2
        [0.9, 0.8, 0.7, 0.5, 0.4, 0.3],  # improves every epoch
        [9.0] * 6,  # a padded coin (inactive from the start)
    ],
    np.float32,
)


def _run_scripted_epochs(trainer, state, vals, se_K, init_params):
    """Ends one epoch per column e of vals [K, E] with those val losses and gain standard
    errors se_K; coins still training take init_params + e + 1 as their params.

    Returns:
      (the final state on the host, each epoch's `improved` flags [K]).
    """
    improved_EK = []
    for e in range(vals.shape[1]):
        # The params "of epoch e+1" for coins still training; a frozen coin's stay put.
        trained = jax.tree.map(lambda p, e=e: p + e + 1.0, init_params)
        params = early_stopping.select(state.active, trained, state.params)
        val_K = jnp.asarray(vals[:, e])
        state, metrics = _end_epoch(trainer, state, params, val_K, jnp.asarray(se_K))
        improved_EK.append(np.asarray(metrics["improved"]))
    return jax.device_get(state), improved_EK


@pytest.mark.parametrize("min_delta", [0.0, 0.15])
def test_early_stopping_bookkeeping_matches_a_plain_reference(min_delta):
    # With a baseline, the untrained model's val loss is the one to beat before epoch 1.
    # Each epoch's gain has a standard error of its coin's untrained val loss, so with
    # min_delta 0.15 coin 0's 10% gain at epoch 2 no longer counts as an improvement.
    trainer = _baseline_trainer(min_delta)
    arrays = trainer.stack(list(tiny_preps()))
    patience = trainer.spec.patience
    state = trainer.init_state(coin_keys(0, range(NUM_COINS)), arrays)
    assert np.isinf(np.asarray(state.best_val)).all()  # no bar before the first epoch
    # The bar the first epoch's finish_epoch sets from its val pass of the kept params
    # (here the initial ones), before end_epoch judges it.
    val_sums = jax.jit(functools.partial(validation.val_sums, trainer.spec))
    bar_K = step.with_bar(state, *val_sums(state.params, arrays)).best_val
    state = step.first_bar(trainer.spec, state, bar_K)
    initial_best = np.asarray(state.best_val)
    assert np.isfinite(initial_best[:3]).all()  # the baseline's, not inf
    se_K = np.where(np.isfinite(initial_best), initial_best, 1.0).astype(np.float32)
    vals = SCRIPTED_VAL_LOSSES * se_K[:, None]
    init_params = jax.device_get(state.params)
    state, improved_EK = _run_scripted_epochs(trainer, state, vals, se_K, init_params)
    assert not np.stack(improved_EK)[:, 3].any()  # the padded coin never trains
    for i in range(3):
        improved_epochs = []
        best, best_epoch, active, diverged, diverged_epoch = reference_early_stopping(
            vals[i], patience, initial_best[i], min_delta, [se_K[i]] * len(vals[i]), improved_epochs
        )
        # metrics.jsonl's `improved`: exactly the epochs the plain reference improved on.
        assert [e + 1 for e, m in enumerate(improved_EK) if m[i]] == improved_epochs
        assert (state.best_val[i], state.best_epoch[i]) == (best, best_epoch)
        assert (state.active[i], state.diverged[i]) == (active, diverged)
        assert state.diverged_epoch[i] == diverged_epoch
        # best_params are the params of the best epoch: init + best_epoch.
        expected = jax.tree.map(lambda p, i=i, b=best_epoch: p[i] + b, init_params)
        assert_trees_close(coin(state.best_params, i), expected, rtol=1e-6, atol=1e-6)
    # min_delta is what decides coin 0: its epoch-2 gain of 10% only counts without it.
    assert state.best_epoch[0] == (2 if min_delta == 0.0 else 0)
    # The diverged coin is reset to its best params; the padded coin never changes.
    assert_trees_close(coin(state.params, 1), coin(state.best_params, 1), rtol=0, atol=0)
    assert state.epochs_run[3] == 0 and not state.active[3]


def _end_epoch(trainer, state, params, val_K, gain_se_K=None):
    """step.end_epoch after a train pass that left `params` and no non-finite loss; the
    gain's standard error is gain_se_K (float32 [K], default 0)."""
    zeros_K = jnp.zeros(val_K.shape, jnp.int32)
    trained = epoch_spec.TrainPass(params, state.opt_state, val_K, zeros_K, zeros_K.astype(bool))
    gain_se_K = jnp.zeros_like(val_K) if gain_se_K is None else gain_se_K
    return step.end_epoch(trainer.spec, state, trained, val_K, val_K, gain_se_K)


_SHARDED = """
import re, sys, jax, numpy as np
from jax.sharding import PartitionSpec as P
from cpbjax import sharding
from tests import helpers as h, train_test as t
assert jax.device_count() == 4, jax.devices()
trainer = h.make_trainer(h.NUM_COINS, mesh=sharding.coin_mesh())
state, history = t.run_group(trainer, h.tiny_preps(), range(h.NUM_COINS))
leaf = jax.tree.leaves(state.params)[0]
assert leaf.sharding.spec == P("coins") and len(leaf.sharding.device_set) == 4, leaf.sharding
assert {s.data.shape[0] for s in leaf.addressable_shards} == {1}
# Coins are independent: the compiled per-device program holds no cross-device collective.
hlo = trainer.lowered_epoch(state, trainer.stack(list(h.tiny_preps()))).compile().as_text()
assert not re.search("all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter", hlo)
np.savez(sys.argv[1], *jax.device_get(jax.tree.leaves(state.params)),
         val=np.stack([m["val_loss"] for m in history]))
"""


def test_sharded_over_four_devices_equals_one_device(tmp_path):
    out = str(tmp_path / "sharded.npz")
    helpers.run_on_host_devices(_SHARDED, out)
    clean, history = clean_group_run()
    with np.load(out) as z:
        leaves = [z[f"arr_{i}"] for i in range(len(jax.tree.leaves(clean.params)))]
        np.testing.assert_allclose(z["val"], np.stack([m["val_loss"] for m in history]), rtol=1e-5)
    assert_trees_close(leaves, jax.tree.leaves(clean.params), **CROSS_PROGRAM)


# ---------------------------------------------------------------------------------------
# The run driver, in real subprocesses.

# Enough epochs that a series keeps an earlier epoch than its last (the saved-model test
# needs one) and that group-001 trains on for 16 epochs after its first checkpoint (the
# kill test's window); every epoch more only adds checkpoints to each of the 4 runs.
DRIVER_EPOCHS = 20
_DRIVE = "import sys; from tests import train_test as t; t.drive(sys.argv[1])"


def driver_config():
    """Two series in two groups of one, trained for a fixed DRIVER_EPOCHS, checkpoint every 4."""
    c = tiny_config()
    c.data.symbols = ("BTCUSDT", "ETHUSDT")
    c.train.group_size, c.train.epochs, c.train.patience = 1, DRIVER_EPOCHS, DRIVER_EPOCHS
    c.ckpt.every_epochs, c.ckpt.keep = 4, 2
    return config_lib.validate(c)


def drive(workdir):
    logging.set_verbosity(logging.INFO)  # what launch.py shows; the resume test reads it
    driver.train_and_evaluate(driver_config(), workdir)


def _drive(workdir, env):
    """Starts a driver run; its output goes to <workdir>.log (a pipe could fill and block it)."""
    log = open(f"{workdir}.log", "w")  # noqa: SIM115 (closed by finish)
    cmd = [sys.executable, "-c", _DRIVE, str(workdir)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    return proc


@pytest.fixture(scope="module")
def full_run(driver_env, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("full")
    finish(_drive(workdir, driver_env))
    return workdir


def test_driver_writes_the_workdir_contract(full_run):
    results = writers.read_json(os.path.join(full_run, "results.json"))
    assert set(results) == {"run", "series", "skipped"}
    assert results["run"]["groups"] == 2 and results["run"]["group_size"] == 1
    assert set(results["series"]) == {"BTCUSDT-1h", "ETHUSDT-1h"}
    metrics = writers.MetricsLog(str(full_run)).records()
    for name, entry in results["series"].items():
        assert entry["epochs_run"] == DRIVER_EPOCHS
        lines = [r for r in metrics if r["series"] == [name]]
        assert [r["epoch"] for r in lines] == list(range(1, DRIVER_EPOCHS + 1))
        vals = [r["val_loss"][0] for r in lines]
        if entry["best_epoch"]:
            assert entry["best_val_loss"] == pytest.approx(min(vals))
            assert entry["best_epoch"] == 1 + int(np.argmin(vals))
        else:  # no epoch beat the untrained model, i.e. its baseline (patience = epochs)
            assert entry["best_val_loss"] <= min(vals)
        assert entry["status"] == ("trained" if entry["best_epoch"] else "stopped_early")
        assert {"val", "test", "data", "num_params"} <= set(entry)
        params, meta = checkpoint.load_series_model(os.path.join(full_run, "models", name))
        assert meta["series"] == name and meta["num_params"] == entry["num_params"]
        assert sum(np.size(x) for x in jax.tree.leaves(params)) == entry["num_params"]
    config = writers.read_json(os.path.join(full_run, "config.json"))
    assert config["train"]["epochs"] == DRIVER_EPOCHS
    assert os.path.exists(os.path.join(full_run, "report.md"))
    timings = writers.read_json(os.path.join(full_run, "timings.json"))
    stages = timings["stages"]
    expected = {"load", "prepare", "setup", "compile", "train", "host", "evaluate", "report"}
    # Not started by launch.py: no startup stage; the stages partition the driver's wall,
    # which its own clock (time.time from the mode's start) measures too.
    assert set(stages) == {*expected, "other"} and all(s >= 0 for s in stages.values())
    assert sum(stages.values()) == pytest.approx(timings["wall_seconds"], abs=0.005)
    assert sum(stages.values()) == pytest.approx(timings["driver_seconds"], abs=0.05)
    entries = os.listdir(os.path.join(full_run, "checkpoints", "group-001"))
    steps = sorted(int(d) for d in entries if d != checkpoint.DIGESTS_FILE)
    assert steps == [DRIVER_EPOCHS - 4, DRIVER_EPOCHS]  # every 4 epochs, keep 2
    digests = writers.read_json(os.path.join(full_run, "checkpoints", "group-001", "digests.json"))
    assert sorted(map(int, digests)) == steps  # a digest for each kept step, none for dropped


def test_saved_models_are_the_kept_epochs_by_an_independent_val_loss(full_run):
    """models/<SERIES>/ holds the kept epoch's params, not the last epoch's: their val loss,
    recomputed by a plain loop over the series' val windows (the saved model's forward
    pass, the run's MSE in numpy), is results.json's best_val_loss. Rescoring the saved
    model with cpbjax's evaluation would only compare that model with itself."""
    results = writers.read_json(os.path.join(full_run, "results.json"))["series"]
    records = writers.MetricsLog(str(full_run)).records()
    data = driver_config().data
    preps = {p.name: p for p in tiny_preps()}
    earlier = 0  # series whose kept epoch is not their last one
    for name, entry in results.items():
        assert entry["best_epoch"] is not None  # without a baseline epoch 1 always improves
        if entry["best_epoch"] < entry["epochs_run"]:
            earlier += 1
            last = [r["val_loss"][0] for r in records if r["series"] == [name]][-1]
            assert last > entry["best_val_loss"] * (1 + 1e-4)  # the two are told apart
        model = saved.load_model(os.path.join(full_run, "models", name))
        prep = preps[name]
        losses = plain_window_losses(
            model.module, model.params, prep, prep.ends["val"], data, "mse"
        )
        assert losses.mean() == pytest.approx(entry["best_val_loss"], rel=1e-5), name
    assert earlier, "every series kept its last epoch: the check could not fail"


def test_same_seed_twice_gives_identical_results(full_run, driver_env, tmp_path):
    finish(_drive(tmp_path / "again", driver_env))
    assert comparable(tmp_path / "again") == comparable(full_run)


def test_sigkilled_run_resumes_to_the_uninterrupted_result(full_run, driver_env, tmp_path):
    workdir = tmp_path / "killed"
    proc = _drive(workdir, driver_env)
    # Kill once the second group has a checkpoint: the first group is then finished.
    kill_once_checkpointed(proc, workdir / "checkpoints" / "group-001")
    assert proc.returncode == -signal.SIGKILL
    assert not (workdir / "results.json").exists()
    out = finish(_drive(workdir, driver_env))
    assert "group-000 already finished" in out and "group-001: resuming after epoch" in out
    assert comparable(workdir) == comparable(full_run)


def test_resume_refuses_a_different_config_but_not_a_different_fetch(full_run):
    before = comparable(full_run)
    config = driver_config()
    config.train.learning_rate = 0.5
    with pytest.raises(ValueError, match="train.learning_rate"):
        driver.train_and_evaluate(config, str(full_run))
    saved = writers.read_json(os.path.join(full_run, "config.json"))
    assert saved["train"]["learning_rate"] == driver_config().train.learning_rate
    # Fetch settings change where candles come from, not which: a finished run is reused.
    config = driver_config()
    config.data.retries, config.data.cache_dir = 1, "/nonexistent/cache"
    driver.train_and_evaluate(config, str(full_run))
    assert comparable(full_run)[0]["series"] == before[0]["series"]


def test_divergence_is_logged_once_per_series(caplog):
    names = ["A-1h", "B-1h", "C-1h"]
    before = np.array([False, True, False, False])  # B diverged earlier; slot 3 is padding
    m = {"epoch": 4, "diverged": np.array([True, True, False, True])}
    with caplog.at_level(std_logging.WARNING):
        now = driver._log_divergence(names, m, before)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == std_logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("A-1h diverged in epoch 4"), warnings
    np.testing.assert_array_equal(now, m["diverged"])
