"""The per-coin training math as pure functions of pytrees and one frozen epoch_spec.EpochSpec.

A group of K series ("coins") trains as one program: params and optimizer state carry a
leading coin axis [K, ...] and every per-coin function here is `jax.vmap`ped over it.
`run_epoch` is one whole epoch on device-resident data: shuffle each coin's training
windows, `lax.scan` over the batches (`train_steps`), validation loss
(cpbjax/training/validation.py), per-coin early stopping (`finish_epoch`). cpbjax/training/group.py jits
and shards it; a streamed epoch (cpbjax/training/streaming.py) runs the same `train_steps` and
`finish_epoch` over windows gathered on the host. Nothing here reads a config while
being traced.

Masking rules: a padded window or coin adds nothing to any loss, gradient or metric; a
coin whose batch has no valid window, or that has stopped or diverged, keeps its params
and optimizer state bit for bit (`jnp.where` on the whole update, so Adam's step count
and moments do not move). Every reduction is per coin, so a NaN in one coin can never
reach another.

Shape letters (docs/design.md): K coins, T candles, N windows of a split, S steps of an
epoch, B windows per step, L lookback, H horizon, F features, C OHLC targets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from cpbjax import columns
from cpbjax.data import stacking
from cpbjax.models import heads
from cpbjax.training import batching, early_stopping, epoch_spec, optimizer, validation
from cpbjax.training.epoch_spec import GroupState, StepResult, TrainPass

# What `run_epoch` returns; epoch and lr are scalars, the rest [K].
EPOCH_METRICS = (
    "epoch",
    "lr",
    "train_loss",
    "val_loss",
    "best_val_loss",
    "active",
    "diverged",
    "val_gain_se",  # the standard error of val_loss - best before it (early_stopping.bar)
    # The val loss early stopping compared with the best: val_loss per series; a pooled
    # model's window mean over every coin's (purged) val windows, the same on every coin.
    "stop_val_loss",
    # Whether the epoch cleared the early-stopping bar: its params became the kept ones.
    "improved",
)


# -- init -------------------------------------------------------------------------------


def init_coin(spec: epoch_spec.EpochSpec, key: jax.Array, band_H2: jax.Array):
    """(params, opt_state, train key) of one coin from its key.

    With model.baseline=vol_band the band starts at the coin's fitted factors band_H2.
    """
    init_key, train_key = jax.random.split(key)
    params_key, dropout_key, teacher_key = jax.random.split(init_key, 3)
    x_BLF = jnp.zeros((1, spec.lookback, spec.num_features), jnp.float32)
    y_BHC = jnp.zeros((1, spec.horizon, columns.NUM_TARGETS), jnp.float32)
    rngs = {"params": params_key, "dropout": dropout_key, "teacher": teacher_key}
    params = heads.init_params(spec.module, rngs, x_BLF, y_BHC)
    if spec.baseline == "vol_band":
        params = heads.with_band(params, band_H2)
    return params, spec.tx.init(params), train_key


def fresh_state(spec: epoch_spec.EpochSpec, keys_K2, arrays: stacking.GroupArrays) -> GroupState:
    """The fresh state of the coins given (all K, or one device's share of them): best_val
    is inf, no bar yet (with model.baseline, the first epoch sets it: `first_bar`)."""
    # lax.map, not vmap: a vmapped orthogonal init (GRU/LSTM recurrent kernels) is a
    # batched LAPACK QR, whose CPU kernel (jaxlib 0.10) fans out over the intra-op
    # pool and deadlocks when the pool is small (seen with K >= 3 on 2 cores). Init
    # runs once per group, so a sequential map costs nothing that matters.
    params, opt_state, train_keys = jax.lax.map(
        lambda kb: init_coin(spec, *kb), (keys_K2, arrays.band)
    )
    k = keys_K2.shape[0]
    zeros_K = jnp.zeros((k,), jnp.int32)
    # A coin without train or val windows (a padded one) never trains.
    active_K = arrays.train_mask.any(axis=1) & arrays.val_mask.any(axis=1)
    return GroupState(
        params=params,
        opt_state=opt_state,
        best_params=jax.tree.map(jnp.copy, params),
        best_val=jnp.full((k,), jnp.inf, jnp.float32),
        best_epoch=zeros_K,
        bad_epochs=zeros_K,
        active=active_K,
        diverged=jnp.zeros((k,), bool),
        diverged_epoch=zeros_K,
        epochs_run=zeros_K,
        key=train_keys,
        epoch=jnp.zeros((), jnp.int32),
    )


def first_bar(spec: epoch_spec.EpochSpec, state: GroupState, bar_K) -> GroupState:
    """`state` whose coins without a bar yet (best_val inf at the group's first epoch) take
    bar_K [K], the val loss of their kept params, when model.baseline is set.

    With a baseline an untrained model IS its baseline: an epoch replaces it as the kept
    model only if it beats the baseline's val loss (best_epoch 0 = never beaten). Until an
    epoch is kept the kept params are the initial ones, so the first epoch's val pass of
    them (`finish_epoch`'s `best`) is that loss, and the init program needs no val pass
    of its own: XLA compiles every inlined copy of the forward anew. A bar already set
    (train.init_from's start, `start_from`) stays."""
    if spec.baseline == "none":
        return state
    unset_K = (state.epoch == 0) & jnp.isinf(state.best_val)
    return state.replace(best_val=jnp.where(unset_K, bar_K, state.best_val))


def with_bar(state: GroupState, val_sum_K, val_n_K) -> GroupState:
    """`state` whose best val loss, the bar an epoch must clear to be kept, is each active
    coin's val loss of its current params (`validation.val_sums`; inf for the others)."""
    best_val_K = jnp.where(state.active, validation.mean_K(val_sum_K, val_n_K), jnp.inf)
    return state.replace(best_val=best_val_K.astype(jnp.float32))


def restart(spec: epoch_spec.EpochSpec, state: GroupState, params) -> GroupState:
    """A fresh `state` that starts from trained `params` [K, ...] (train.init_from,
    cpbjax/modes/init_from.py): the optimizer state anew for them and them the kept params.
    `start_from` then makes their val loss the bar."""
    return state.replace(
        params=params,
        opt_state=jax.vmap(spec.tx.init)(params),
        best_params=jax.tree.map(jnp.copy, params),
    )


def start_from(spec: epoch_spec.EpochSpec, state: GroupState, params, arrays) -> GroupState:
    """`restart` from `params`, their val loss the one to beat, as an untrained baseline's
    is: an epoch replaces them only if it beats the starting model (best_epoch 0 = never,
    the start is kept)."""
    return with_bar(restart(spec, state, params), *validation.val_sums(spec, params, arrays))


# -- one coin ---------------------------------------------------------------------------


def coin_loss_sums(spec: epoch_spec.EpochSpec, params, w: batching.StepWindows, mask_B, key):
    """The training objective of ONE coin's batch and its forecast part, summed over the
    valid windows (float32 scalars, 0 when none is valid).

    Per window: train.loss of the OHLC forecast. An ensemble's objective is the sum of
    its members' (each member's gradient is its own) and its forecast part their mean.
    """
    windows = w.gathered(spec)
    dropout_key, teacher_key = jax.random.split(key)
    members = {"member_outputs": True} if spec.members > 1 else {}
    y_hat = spec.module.apply(
        {"params": params},
        windows.x_BLF,
        windows.y_BHC,
        train=True,
        teacher_forcing=spec.teacher_forcing,
        rngs={"dropout": dropout_key, "teacher": teacher_key},
        **members,
    )
    window_loss = functools.partial(_window_loss, spec, windows, w.target_scale_C, mask_B)
    if spec.members == 1:
        err_B = window_loss(y_hat)
        return jnp.sum(err_B), jnp.sum(err_B)
    err_YB = jax.vmap(window_loss)(y_hat)  # [Y, B] per member
    return jnp.sum(jnp.sum(err_YB, axis=0)), jnp.sum(jnp.mean(err_YB, axis=0))


def _window_loss(
    spec: epoch_spec.EpochSpec, w: batching.Windows, target_scale_C: jax.Array, mask_B, y_hat
):
    """The forecast loss of each window of one model's forecasts y_hat [B, H, C], float32
    [B] (0 where mask_B is False)."""
    err_B = validation.forecast_loss(spec, y_hat, w.y_BHC, target_scale_C)
    return jnp.where(mask_B, err_B, 0.0)


def coin_loss(spec: epoch_spec.EpochSpec, params, w: batching.StepWindows, mask_B, key):
    """`coin_loss_sums` as means over the valid windows: (objective, forecast loss)."""
    n = jnp.maximum(jnp.sum(mask_B), 1)
    objective, err = coin_loss_sums(spec, params, w, mask_B, key)
    return objective / n, err / n


class CoinStep(NamedTuple):
    """What one train step of ONE coin takes besides its params and windows."""

    mask_B: jax.Array  # bool [B] valid windows
    key: jax.Array  # this step's key
    lr: jax.Array  # learning rate (schedule x a sweep coin's lr_mult)
    active: jax.Array  # bool: the coin still trains
    hparams: dict  # the coin's other injected optimizer hyperparameters ({} without a sweep)


def coin_train_step(
    spec: epoch_spec.EpochSpec, params, opt_state, w: batching.StepWindows, s: CoinStep
):
    """One masked update of ONE coin; returns a StepResult.

    The sums cover the windows actually trained on; the loss is train.loss of the OHLC
    forecast (for an ensemble the members' mean, the objective their sum).
    """
    n = jnp.sum(s.mask_B)
    loss_fn = functools.partial(coin_loss, spec)
    (objective, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, w, s.mask_B, s.key)
    updates, new_opt = spec.tx.update(
        grads, optimizer.with_learning_rate(opt_state, s.lr, **s.hparams), params
    )
    finite = jnp.isfinite(objective) & jnp.isfinite(optax.tree.norm(grads))
    take = s.active & (n > 0) & finite
    params = jax.tree.map(
        lambda a, b: jnp.where(take, a, b), optax.apply_updates(params, updates), params
    )
    opt_state = jax.tree.map(lambda a, b: jnp.where(take, a, b), new_opt, opt_state)
    n_taken = jnp.where(take, n, 0)
    return StepResult(params, opt_state, loss * n_taken, n_taken, s.active & (n > 0) & ~finite)


# -- the epoch --------------------------------------------------------------------------


def coin_hparams(arrays: stacking.GroupArrays, k: int):
    """A sweep's per-coin hyperparameters (cpbjax/config/sweep_grid.py) as the step takes them
    for its k coins: (the lr multipliers float32 [k], the injected optimizer ones: name ->
    [k]). Without a sweep, (ones, {}): the lr is the schedule's, times 1 (exact)."""
    hparams = dict(arrays.hparams)
    lr_mult_K = hparams.pop("lr_mult", None)
    if lr_mult_K is None:
        lr_mult_K = jnp.ones((k,), jnp.float32)
    return lr_mult_K, hparams


def fresh_pass(state: GroupState) -> TrainPass:
    """An epoch's train pass before its first step: the state's params, nothing summed."""
    k = state.active.shape[0]  # this device's coins
    return TrainPass(
        state.params,
        state.opt_state,
        jnp.zeros((k,), jnp.float32),
        jnp.zeros((k,), jnp.int32),
        jnp.zeros((k,), bool),
    )


def train_steps(
    spec: epoch_spec.EpochSpec,
    state: GroupState,
    arrays: stacking.GroupArrays,
    trained: TrainPass,
    xs,
    windows_of: Callable[[jax.Array], batching.StepWindows],
) -> TrainPass:
    """`trained` after the train steps `xs` of this epoch: all of them, or one streamed
    chunk of them (cpbjax/training/streaming.py).

    Args:
      arrays: read for the sweep's per-coin hyperparameters only.
      xs: (step numbers int32 [S], each step's part of the windows [S, K, ...], mask
        bool [S, K, B]): the step number sets the lr and the step's dropout keys.
      windows_of: a step's part [K, ...] -> that step's StepWindows of the K coins.
    """
    _, step_keys_K = batching.epoch_keys(state)
    lr_mult_K, hparams_K = coin_hparams(arrays, state.active.shape[0])

    def body(carry: TrainPass, xs):
        s, part, mask_KB = xs
        w = windows_of(part)
        lr = spec.schedule(state.epoch * spec.train_steps + s)
        keys_K = jax.vmap(jax.random.fold_in, (0, None))(step_keys_K, s)
        coin_steps = CoinStep(mask_KB, keys_K, lr * lr_mult_K, state.active, hparams_K)
        step = jax.vmap(
            lambda p, o, w, s: coin_train_step(spec, p, o, w, s), in_axes=(0, 0, w.coin_axes(), 0)
        )
        return carry.add(step(carry.params, carry.opt_state, w, coin_steps)), None

    trained, _ = jax.lax.scan(body, trained, xs)
    return trained


def train_pass(
    spec: epoch_spec.EpochSpec, state: GroupState, arrays: stacking.GroupArrays
) -> TrainPass:
    """This epoch's train steps, each batch sliced from the device-resident series."""
    ends_SKB, mask_SKB = batching.train_batches(spec, state, arrays)
    series = batching.coin_data(arrays)
    xs = (jnp.arange(spec.train_steps), ends_SKB, mask_SKB)
    windows_of = lambda ends_KB: batching.SeriesWindows(series, ends_KB)
    return train_steps(spec, state, arrays, fresh_pass(state), xs, windows_of)


def train_losses(state: GroupState, trained: TrainPass) -> jax.Array:
    """The epoch's mean train loss per coin, float32 [K] (NaN where it did not train)."""
    n_K = trained.num_windows_K
    return jnp.where(state.active & (n_K > 0), trained.loss_sum_K / jnp.maximum(n_K, 1), jnp.nan)


def run_epoch(spec: epoch_spec.EpochSpec, state: GroupState, arrays: stacking.GroupArrays):
    """One epoch of every active coin: (new GroupState, metrics dict of EPOCH_METRICS)."""
    trained = train_pass(spec, state, arrays)
    val = validation.val_pass(spec, trained.params, arrays)
    best = validation.val_pass(spec, state.best_params, arrays)
    return finish_epoch(spec, state, trained, val, best)


def finish_epoch(
    spec: epoch_spec.EpochSpec,
    state: GroupState,
    trained: TrainPass,
    val: validation.ValPass,
    best: validation.ValPass,
):
    """`end_epoch` after the train pass `trained`, given the val passes of its params
    (`val`) and of the best params before it (`best`): their paired window losses give
    the standard error of the gain (cpbjax/training/early_stopping.py). The best model's losses
    are recomputed rather than kept in the state: one more val pass per epoch, and a
    smaller checkpoint. At the first epoch `best` also gives a baseline's bar (`first_bar`)."""
    state = first_bar(spec, state, with_bar(state, best.sum_K, best.n_K).best_val)
    gain_se_K = early_stopping.gain_se(val.loss_KN, best.loss_KN, val.mask_KN, spec.horizon - 1)
    return end_epoch(spec, state, trained, train_losses(state, trained), val.mean_K(), gain_se_K)


def end_epoch(
    spec: epoch_spec.EpochSpec, state: GroupState, trained: TrainPass, train_K, val_K, gain_se_K
):
    """Per-coin early stopping (cpbjax/training/early_stopping.py) and divergence
    bookkeeping after one epoch.

    gain_se_K: float32 [K], the standard error of val_K - best_val (`gain_se`).
    """
    epoch = state.epoch + 1
    ran_K = state.active
    verdict = early_stopping.judge(spec, state, trained.nonfinite_K, val_K, gain_se_K)
    new_state = state.replace(
        opt_state=trained.opt_state,
        epochs_run=state.epochs_run + ran_K.astype(jnp.int32),
        epoch=epoch,
        **early_stopping.kept(state, verdict, trained.params, val_K, epoch),
    )
    metrics = {
        "epoch": epoch,
        "lr": spec.schedule(epoch * spec.train_steps - 1),
        "train_loss": train_K,
        "val_loss": jnp.where(ran_K, val_K, jnp.nan),
        "best_val_loss": new_state.best_val,
        "active": verdict.active_K,
        "diverged": new_state.diverged,
        "val_gain_se": jnp.where(ran_K, gain_se_K, jnp.nan),
        "stop_val_loss": jnp.where(ran_K, val_K, jnp.nan),
        "improved": verdict.improved_K,
    }
    return new_state, metrics
