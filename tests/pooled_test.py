"""Tests of train.share=pooled (cpbjax/training/pooled.py): one model trained on every series' windows.

The epoch is checked against a hand-written reference (a loop over coins and windows,
one gradient, one optax update per step); the driver in launch.py subprocesses that
share a persistent compilation cache (tests/helpers.py's driver_env).
"""

import dataclasses
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from cpbjax import models, sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import pooling, stacking
from cpbjax.models import heads
from cpbjax.modes import evaluate as evaluate_mode
from cpbjax.modes import plan
from cpbjax.score import saved
from cpbjax.training import batching, checkpoint, epoch_spec, memory, optimizer, pooled
from cpbjax.training.group import GroupTrainer, coin_keys
from tests import helpers, references
from tests.helpers import POOLED_NAMES, pooled_config

driver_env = helpers.driver_env  # the module's subprocess environment (a fixture)


EPOCHS, PATIENCE = 30, 3
# The launched run's early-stopping margin, in standard errors of the gain: below the
# default 1, so that on these 300 candles the one model leaves its untrained baseline, yet
# large enough to turn down its epoch-3 gain (its val loss is the lowest of the run).
MIN_DELTA = 0.6
# The winning levers' loss (MAE with the persistence scale); the epoch test adds vol_band.
LEVERS = {"train.loss": "mae", "train.loss_scale": "persistence"}


# ---------------------------------------------------------------------------------------
# The epoch against a plain reference.


def _persistence_mae(prep, horizon):
    """Each OHLC column's mean |target - last close| over the train windows, [C]."""
    ends = prep.ends["train"]
    err = [prep.targets[e + 1 : e + horizon + 1] - prep.targets[e, 3] for e in ends]
    return np.abs(np.stack(err)).mean(axis=(0, 1)).astype(np.float32)


def _reference_loss(config, module):
    """loss(params, batches): the scaled MAE of the shared params summed over the windows
    of every coin's (x, y, scale, keys) batch, over their count; aux: per-coin sums."""

    def loss(params, batches):
        per_coin = []
        for x, y, scale, keys in batches:
            y_hat = module.apply(
                {"params": params},
                x,
                y,
                train=True,
                teacher_forcing=config.train.teacher_forcing,
                rngs={"dropout": keys[0], "teacher": keys[1]},
            )
            per_coin.append(jnp.sum(jnp.mean(jnp.abs(y_hat - y) / scale, axis=(1, 2))))
        return sum(per_coin) / sum(len(b[0]) for b in batches), per_coin

    return loss


def _reference_batches(config, ends_KB, mask_KB, step_keys_K, s):
    """Step s's (x, y, scale, dropout and teacher keys) of every coin, in numpy."""
    d, batches = config.data, []
    for k, prep in enumerate(helpers.tiny_preps()):
        x, y = references.anchored_windows(prep, ends_KB[k][mask_KB[k]], d.lookback, d.horizon)
        keys = jax.random.split(jax.random.fold_in(step_keys_K[k], s))
        batches.append((x, y, _persistence_mae(prep, d.horizon), keys))
    return batches


def _reference_epoch(config, module, state0, arrays, spec):
    """One epoch by hand: per step, `_reference_loss` on the same shuffled windows, its
    gradient, one optax update. Returns (params, per-coin mean train loss [K])."""
    ends_SKB, mask_SKB = jax.device_get(batching.train_batches(spec, state0, arrays))
    step_keys_K = jax.device_get(batching.epoch_keys(state0)[1])
    tx = optimizer.make_optimizer(config.train)
    params = jax.tree.map(lambda a: a[0], jax.device_get(state0.params))  # coin 0's
    opt_state = tx.init(params)
    grad_fn = jax.jit(jax.value_and_grad(_reference_loss(config, module), has_aux=True))
    sums_K = np.zeros(len(POOLED_NAMES))
    for s in range(spec.train_steps):
        batches = _reference_batches(config, ends_SKB[s], mask_SKB[s], step_keys_K, s)
        (_, per_coin), grads = grad_fn(params, batches)
        sums_K += np.asarray(per_coin)
        lr = spec.schedule(s)  # epoch 0: global step s
        updates, opt_state = tx.update(grads, optimizer.with_learning_rate(opt_state, lr), params)
        params = optax.apply_updates(params, updates)
    return params, sums_K / mask_SKB.sum(axis=(0, 2))


@pytest.fixture(scope="module")
def one_epoch():
    """A pooled trainer's fresh state and its first epoch (3 series, one per coin)."""
    config = pooled_config()
    module = models.build(models.make_config(config))
    trainer = GroupTrainer(
        epoch_spec.make_spec(config, module),
        len(POOLED_NAMES),
        sharding.coin_mesh(jax.devices()[:1]),
    )
    arrays = trainer.stack(list(helpers.tiny_preps()))
    state0 = jax.device_get(trainer.init_state(coin_keys(0, range(len(POOLED_NAMES))), arrays))
    state, metrics = trainer.run_epoch(jax.device_put(state0), arrays)
    return config, module, trainer, arrays, state0, jax.device_get(state), jax.device_get(metrics)


def test_a_first_epoch_that_cannot_beat_the_untrained_model_keeps_its_pooled_val_loss():
    """With a baseline the bar is the untrained model's pooled val loss, which the first
    epoch measures (pooled.finish_epoch, step.first_bar): an epoch at a learning rate far
    too large keeps epoch 0 at that loss, the mean over every coin's val windows by a
    plain loop."""
    config = pooled_config()
    config.train.learning_rate = 5.0
    module = models.build(models.make_config(config))
    trainer = GroupTrainer(
        epoch_spec.make_spec(config, module),
        len(POOLED_NAMES),
        sharding.coin_mesh(jax.devices()[:1]),
    )
    preps = list(helpers.tiny_preps())
    arrays = trainer.stack(preps)
    state = trainer.init_state(coin_keys(0, range(len(POOLED_NAMES))), arrays)
    assert np.isinf(np.asarray(state.best_val)).all()  # no bar before the first epoch
    params = jax.device_get(jax.tree.map(lambda a: a[0], state.params))
    state, _ = trainer.run_epoch(state, arrays)
    assert (np.asarray(state.best_epoch) == 0).all(), "the epoch beat the bar: no bar checked"
    losses = []
    for prep in preps:
        scale_C = stacking.persistence_scale(prep, config.data.horizon)
        losses.extend(
            references.plain_window_losses(
                module, params, prep, prep.ends["val"], config.data, "mae", scale_C
            )
        )
    np.testing.assert_allclose(np.asarray(state.best_val), np.mean(losses), rtol=1e-5)


def test_every_coin_holds_the_same_params_starting_at_the_median_band(one_epoch):
    config, _, _, _, state0, state, _ = one_epoch
    fits = [
        stacking.band_factors(p, config.data.lookback, config.data.horizon)
        for p in helpers.tiny_preps()
    ]
    out = state0.params["output"]
    np.testing.assert_allclose(out["band_high"][0], np.median(np.stack(fits)[..., 0], axis=0))
    np.testing.assert_allclose(out["band_low"][0], np.median(np.stack(fits)[..., 1], axis=0))
    for tree in (state0.params, state.params, state.opt_state, state.best_params):
        for leaf in jax.tree.leaves(tree):
            for k in range(1, len(POOLED_NAMES)):
                np.testing.assert_array_equal(leaf[k], leaf[0])


def test_pooled_epoch_equals_a_hand_written_reference(one_epoch):
    config, module, trainer, arrays, state0, state, metrics = one_epoch
    ref_params, ref_train_K = _reference_epoch(config, module, state0, arrays, trainer.spec)
    pooled_params = jax.tree.map(lambda a: a[0], state.params)
    helpers.assert_trees_close(pooled_params, ref_params, **helpers.CROSS_PROGRAM)
    np.testing.assert_allclose(metrics["train_loss"], ref_train_K, rtol=1e-5)


@pytest.mark.parametrize("chunk", [0, 1, 2], ids=["one_vmap", "chunks_of_1", "chunks_of_2"])
def test_gradient_weighs_every_window_alike_not_every_coin(one_epoch, chunk):
    """Coins with 4, 12 and 32 windows in the batch: the pooled objective and its gradient
    are the mean over the 48 windows (a mean of coin means would weigh coin 0's 8x), also
    when train.pooled_chunk sums the gradient over chunks of coins (chunks of 2 of 3
    coins: the last chunk is coins 1-2, coin 1 masked out as the first chunk took it)."""
    config, module, trainer, arrays, state0, _, _ = one_epoch
    spec = dataclasses.replace(trainer.spec, pooled_chunk=chunk)
    ends_SKB, mask_SKB = batching.train_batches(spec, state0, arrays)
    step_keys_K = batching.epoch_keys(state0)[1]
    mask_KB = mask_SKB[0] & (jnp.arange(mask_SKB.shape[2]) < jnp.array([4, 12, 32])[:, None])
    params = pooled.first(state0.params)
    keys_K = jax.vmap(jax.random.fold_in, (0, None))(step_keys_K, 0)
    value_and_grad = functools.partial(pooled.pooled_value_and_grad, spec)
    windows = batching.SeriesWindows(batching.coin_data(arrays), ends_SKB[0])
    batch = pooled.Batch(windows, mask_KB, keys_K)
    (loss, err_K), grads = jax.jit(value_and_grad)(params, batch, jnp.sum(mask_KB))
    batches = _reference_batches(config, *jax.device_get((ends_SKB[0], mask_KB, step_keys_K)), 0)
    assert [len(b[0]) for b in batches] == [4, 12, 32]
    reference = jax.jit(jax.value_and_grad(_reference_loss(config, module), has_aux=True))
    (ref_loss, ref_err_K), ref_grads = reference(params, batches)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    np.testing.assert_allclose(err_K, np.asarray(ref_err_K), rtol=1e-6)
    helpers.assert_trees_close(grads, ref_grads, rtol=1e-4, atol=1e-7)


def test_a_chunked_epoch_trains_as_the_one_vmap_in_less_memory(one_epoch):
    """train.pooled_chunk=1: the same first epoch (up to float summation order) from a
    program whose step holds one coin's activations, so it needs less memory (XLA's
    buffer assignment, as the driver's memory check reads it)."""
    config, module, trainer, arrays, state0, state, metrics = one_epoch
    chunked_config = config.copy_and_resolve_references()
    chunked_config.train.pooled_chunk = 1
    mesh = sharding.coin_mesh(jax.devices()[:1])
    chunked = GroupTrainer(epoch_spec.make_spec(chunked_config, module), len(POOLED_NAMES), mesh)
    chunked_state, chunked_metrics = chunked.run_epoch(jax.device_put(state0), arrays)
    helpers.assert_trees_close(
        jax.device_get(chunked_state.params), state.params, **helpers.CROSS_PROGRAM
    )
    np.testing.assert_allclose(
        jax.device_get(chunked_metrics["train_loss"]), metrics["train_loss"], rtol=1e-5
    )
    needs = [
        memory.epoch_need(t.lowered_epoch(jax.device_put(state0), arrays).compile(), 1)
        for t in (trainer, chunked)
    ]
    assert needs[1].per_device < needs[0].per_device


# ---------------------------------------------------------------------------------------
# Config and plan.


def test_bad_share_and_conflicting_plans_are_config_errors():
    c = pooled_config()
    c.train.share = "shared"
    with pytest.raises(ConfigError, match=r"train.share='shared'.*series, pooled"):
        config_lib.validate(c)
    t = pooled_config().train
    assert plan.group_size(12, t, 1, "cpu") == 12  # all series, not 4 per CPU device
    t.group_size = 12
    assert plan.group_size(12, t, 1, "cpu") == 12
    t.group_size = 4
    with pytest.raises(ConfigError, match=r"train.group_size=4.*at least the run's 12"):
        plan.group_size(12, t, 1, "cpu")
    t.group_size = 0
    # Each device trains on its share of the coins: padded to a multiple of the devices.
    assert plan.group_size(12, t, 8, "cpu") == 16 and plan.group_size(3, t, 4, "gpu") == 4


@pytest.mark.parametrize(
    "share, chunk, words",
    [("series", 2, "unless train.share='pooled'"), ("pooled", -1, "integer >= 0")],
)
def test_bad_pooled_chunks_are_config_errors(share, chunk, words):
    c = pooled_config()
    c.train.share, c.train.pooled_chunk = share, chunk
    with pytest.raises(ConfigError, match=f"train.pooled_chunk={chunk}.*{words}"):
        config_lib.validate(c)


# ---------------------------------------------------------------------------------------
# launch.py end to end, and a killed run resumed.

FLAGS = [
    "--config.data.symbols=('BTCUSDT','ETHUSDT','SOLUSDT')",
    "--config.data.intervals=('1h',)",
    "--config.data.max_candles=300",
    "--config.data.min_candles=200",
    "--config.data.synthetic_candles=360",
    "--config.model.hidden=16",
    "--config.model.num_layers=1",
    f"--config.train.epochs={EPOCHS}",
    f"--config.train.patience={PATIENCE}",
    "--config.ckpt.every_epochs=1",
    "--config.eval.plots=False",
    "--config.train.share=pooled",
    # The reference below takes each epoch's standard error of the gain from
    # metrics.jsonl; early_stopping_test checks that standard error against a plain loop.
    f"--config.train.min_delta={MIN_DELTA}",
    *(f"--config.{field}={value}" for field, value in LEVERS.items()),
]


def _launch(workdir, env, *more):
    """Starts launch.py on the pooled tiny config (and `more` flags); its output goes to
    <workdir>.log."""
    log = open(f"{workdir}.log", "w")  # noqa: SIM115 (closed by helpers.finish)
    cmd = [
        sys.executable,
        "launch.py",
        "--config",
        "configs/gru.py:tiny",
        "--workdir",
        str(workdir),
    ]
    proc = subprocess.Popen(
        cmd + FLAGS + list(more), env=env, cwd=helpers.ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    proc.log = log
    return proc


@pytest.fixture(scope="module")
def pooled_run(driver_env, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("pooled") / "run"
    helpers.finish(_launch(workdir, driver_env))
    return workdir


def _without_band_refit(params, entry):
    """A saved series model's params less its test band refit (eval.refit_band shifts
    band_high and band_low by results.json's test band_refit) and its column fallback
    (eval.column_fallback, decided per series after training): the trained params."""
    params = heads.without_keep(params)
    out = dict(params["output"])
    for col in ("high", "low"):
        shift = np.asarray(entry["test"]["band_refit"][col], np.float32)
        out[f"band_{col}"] = out.pop(f"band_{col}") - shift
    return {**params, "output": out}


def test_launch_scores_every_series_with_one_saved_model(pooled_run):
    results = writers.read_json(os.path.join(pooled_run, "results.json"))
    assert results["run"]["share"] == "pooled" and results["run"]["groups"] == 1
    assert set(results["series"]) == set(POOLED_NAMES)
    params = {}
    for name, entry in results["series"].items():
        assert entry["val"] and entry["test"] and entry["group"] == "group-000"
        params[name], meta = checkpoint.load_series_model(os.path.join(pooled_run, "models", name))
        assert meta["series"] == name and meta["best_epoch"] == entry["best_epoch"]
    # One pooled model; only its band factors differ per series, by each series' own
    # refit on train+val (eval.refit_band), so less that shift the bands are all one.
    unshifted = {
        name: _without_band_refit(params[name], results["series"][name]) for name in POOLED_NAMES
    }
    for name in POOLED_NAMES[1:]:
        helpers.assert_trees_close(unshifted[name], unshifted[POOLED_NAMES[0]], rtol=0, atol=1e-6)
    # --mode evaluate loads every saved series model and scores it as training did.
    config = config_lib.load(f"configs/workdir.py:{pooled_run}")
    rescored = evaluate_mode.run_evaluate(config, str(pooled_run))["series"]
    for name in POOLED_NAMES:
        for split in ("val", "test"):
            got, want = rescored[name][split]["columns"], results["series"][name][split]["columns"]
            for col in ("close", "high", "low"):
                assert got[col]["mae"] == pytest.approx(want[col]["mae"], rel=1e-6)


def test_early_stopping_follows_the_pooled_val_loss(pooled_run):
    """metrics.jsonl's pooled_val_loss is the window-weighted mean of the per-series val
    losses over the val windows the purge keeps, and best_epoch, epochs_run and the
    status follow it, not any series' own."""
    results = writers.read_json(os.path.join(pooled_run, "results.json"))
    records = writers.MetricsLog(str(pooled_run)).records()
    data = helpers.tiny_config().data
    kept, _ = pooling.pool_ends(helpers.tiny_preps(), data.lookback, data.horizon)
    n_val = np.array([len(kept[name]["val"]) for name in records[0]["series"]])
    per_series = np.array([r["val_loss"] for r in records])  # [epochs, series]
    pooled = np.array([r["pooled_val_loss"] for r in records])
    np.testing.assert_allclose(pooled, per_series @ n_val / n_val.sum(), rtol=1e-5)
    improved_epochs = []
    gain_se = [r["val_gain_se"][0] for r in records]  # one model: the same on every series
    best, best_epoch, active, _, _ = references.reference_early_stopping(
        pooled, PATIENCE, min_delta=MIN_DELTA, gain_se=gain_se, improved_epochs=improved_epochs
    )
    improved = np.array([r["improved"] for r in records])  # [epochs, series]
    assert improved_epochs, "no epoch improved: the flag is not tested"
    assert (improved == improved[:, :1]).all()  # one model: every series improves together
    assert [
        r["epoch"] for r, m in zip(records, improved[:, 0], strict=True) if m
    ] == improved_epochs
    entries = [results["series"][name] for name in POOLED_NAMES]
    for entry in entries:
        assert entry["best_epoch"] == best_epoch
        assert entry["best_val_loss"] == pytest.approx(best, rel=1e-5)
        assert entry["epochs_run"] == len(records)
        assert entry["status"] == ("trained" if active else "stopped_early")
    assert not active, "the run should stop early, or the test checks no stopping"
    own_best = [1 + int(np.argmin(per_series[:, i])) for i in range(len(POOLED_NAMES))]
    assert any(b != best_epoch for b in own_best), "series' own minima coincide: a weak test"


def test_saved_models_hold_the_kept_epoch_by_an_independent_val_loss(pooled_run):
    """The saved models are the kept epoch's pooled model, not the last epoch's: less each
    series' band refit, their val loss over every series' pooled val windows, recomputed
    by a plain loop (the saved model's forward pass, the run's MAE over each column's
    persistence MAE on its pooled train windows, in numpy), is results.json's
    best_val_loss. Rescoring with cpbjax's evaluation would compare the model with itself."""
    results = writers.read_json(os.path.join(pooled_run, "results.json"))["series"]
    data = helpers.tiny_config().data
    kept, _ = pooling.pool_ends(helpers.tiny_preps(), data.lookback, data.horizon)
    best = results[POOLED_NAMES[0]]
    assert 0 < best["best_epoch"] < best["epochs_run"], "the last epoch is kept: a weak test"
    losses = []
    for prep in helpers.tiny_preps():
        pooled_prep = dataclasses.replace(prep, ends={**prep.ends, **kept[prep.name]})
        model = saved.load_model(os.path.join(pooled_run, "models", prep.name))
        params = _without_band_refit(model.params, results[prep.name])
        scale_C = _persistence_mae(pooled_prep, data.horizon)
        losses.extend(
            references.plain_window_losses(
                model.module, params, pooled_prep, pooled_prep.ends["val"], data, "mae", scale_C
            )
        )
    assert np.mean(losses) == pytest.approx(best["best_val_loss"], rel=1e-5)


def test_killed_pooled_run_resumes_to_the_uninterrupted_result(pooled_run, driver_env, tmp_path):
    workdir = tmp_path / "killed"
    proc = _launch(workdir, driver_env)
    helpers.kill_once_checkpointed(proc, workdir / "checkpoints" / "group-000")
    helpers.finish(proc, check=False)
    assert not (workdir / "results.json").exists()
    out = helpers.finish(_launch(workdir, driver_env))
    assert "group-000: resuming after epoch" in out
    assert helpers.comparable(workdir) == helpers.comparable(pooled_run)


def test_pooled_backtest_trains_one_model_per_fold_its_last_the_train_run(
    pooled_run, driver_env, tmp_path
):
    """Each fold is one group (one pooled model over that fold's series only), and with the
    default step the last fold's split is the train run's: the same model, the same scores."""
    workdir = tmp_path / "bt"
    helpers.finish(_launch(workdir, driver_env, "--mode=backtest", "--config.backtest.folds=3"))
    out = writers.read_json(os.path.join(workdir, "backtest.json"))
    ledger = writers.read_json(workdir_lib.ledger(str(workdir / "backtest")))
    assert ledger["fingerprint"]["groups"] == [
        [f"{name}@fold{f}" for name in POOLED_NAMES] for f in range(3)
    ]
    trained = writers.read_json(os.path.join(pooled_run, "results.json"))["series"]
    for name in POOLED_NAMES:
        last = out["series"][name]["folds"][-1]
        assert last["name"] == f"{name}@fold2"
        assert last["best_epoch"] == trained[name]["best_epoch"]
        for col in ("close", "high", "low"):
            got, want = last["test"]["columns"][col], trained[name]["test"]["columns"][col]
            assert got["mae"] == pytest.approx(want["mae"], rel=1e-5)
    # The earlier folds are other models (trained on fewer, older windows).
    first = [out["series"][n]["folds"][0]["best_val_loss"] for n in POOLED_NAMES]
    assert first != [trained[n]["best_val_loss"] for n in POOLED_NAMES]
