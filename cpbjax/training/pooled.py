"""The pooled model's epoch (train.share=pooled): ONE model trained on every coin's windows.

It keeps cpbjax/training/step.py's data and state layout, so group.py, checkpoints, resume and the
per-series saving work unchanged: the GroupState still carries the coin axis K, but every
coin holds the same params and optimizer state (replicated), and the real coins
share one early-stopping record. Each step gathers B windows of every coin (each coin
shuffled with its own key, as `batching.train_batches` does), takes ONE gradient of the
shared params on the mean loss over all K·B valid windows and makes one update. Early
stopping and divergence watch the pooled val loss, the mean over every coin's val
windows; each coin's own train and val losses are still reported.

Both means weigh windows, not coins: the pooled model is fitted to all windows, and with
train.loss_scale=persistence a window's loss is comparable across series; a coin with fewer windows (a shorter series) counts for fewer of them.

Data-parallel over every device (docs/design.md): the coin axis is sharded over the `coins`
mesh as in a per-series run, and the epoch runs per device under group.py's shard_map on
its K / num_devices coins. Each device sums its coins' objective and gradient; one psum
(an all-reduce) per step makes the update of every device the same, so the params stay
replicated. Per epoch, the shared view (`shared`: coin 0's params, optimizer and sweep
setting) and the val losses the pooled val loss and its standard error read are
all-gathered; nothing else crosses devices. The init (`fresh_state`) is one global
program that XLA partitions (group.py). On one device every collective is the identity,
so a 1-device run computes what it computed before the mesh grew.

Shape letters (docs/design.md): K coins, Z coins of one gradient chunk, S steps, B windows
per step, H horizon.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from cpbjax import sharding
from cpbjax.data import stacking
from cpbjax.training import batching, early_stopping, epoch_spec, optimizer, step, validation


def first(tree):
    """The shared view of a [K, ...] pytree: coin 0's copy of every replicated leaf (coin 0
    is always a real series)."""
    return jax.tree.map(lambda a: a[0], tree)


def gather_coins(tree):
    """Inside the epoch's shard_map: every leaf's [K / num_devices, ...] shard -> all K coins,
    in coin order (an all-gather; on one device the leaf itself)."""
    return jax.tree.map(lambda a: jax.lax.all_gather(a, sharding.COIN_AXIS, tiled=True), tree)


def shared(tree):
    """Inside the epoch's shard_map: `first` of the whole coin axis on every device. A
    device's own first coin may be padding, whose sweep values are not the model's; so each device's first leaf is gathered and device 0's taken."""
    return jax.tree.map(lambda a: jax.lax.all_gather(a, sharding.COIN_AXIS)[0], first(tree))


def device_sum(tree):
    """Inside the epoch's shard_map: every leaf summed over the devices (an all-reduce)."""
    return jax.lax.psum(tree, sharding.COIN_AXIS)


def replicate(tree, k: int):
    """Back to [K, ...]: K copies of every shared leaf."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (k,) + a.shape), tree)


def real_coins(arrays: stacking.GroupArrays) -> jax.Array:
    """bool [K]: coins with train and val windows (the others, padding, never train)."""
    return arrays.train_mask.any(axis=1) & arrays.val_mask.any(axis=1)


def pooled_mean(sum_K: jax.Array, n_K: jax.Array, take_K: jax.Array) -> jax.Array:
    """Window-weighted mean of per-coin loss sums over the coins `take_K`; NaN if no window."""
    n = jnp.sum(jnp.where(take_K, n_K, 0))
    total = jnp.sum(jnp.where(take_K, sum_K, 0.0))
    return jnp.where(n > 0, total / jnp.maximum(n, 1), jnp.nan)


def pooled_band(arrays: stacking.GroupArrays) -> jax.Array:
    """float32 [H, 2]: where the ONE band of model.baseline=vol_band starts, the median
    over the real coins of their own fitted factors (GroupArrays.band [K, H, 2])."""
    band_KH2 = jnp.where(real_coins(arrays)[:, None, None], arrays.band, jnp.nan)
    return jnp.nanmedian(band_KH2, axis=0)


def fresh_state(
    spec: epoch_spec.EpochSpec, keys_K2, arrays: stacking.GroupArrays
) -> epoch_spec.GroupState:
    """The fresh state, no bar yet (with model.baseline the first epoch sets the untrained
    model's pooled val loss: `finish_epoch`): every coin holds the params that coin 0's
    key initialises (with the pooled band) and keeps its own train key (its shuffles and
    dropout)."""
    band_KH2 = jnp.broadcast_to(pooled_band(arrays), arrays.band.shape)
    shared_K2 = jnp.broadcast_to(keys_K2[0], keys_K2.shape)
    state = step.fresh_state(spec, shared_K2, arrays.replace(band=band_KH2))
    # step.init_coin's split: (init key, train key). Every coin with train windows trains,
    # a training-data-only series (data.split_dates) too: early stopping reads the pooled
    # val loss, so a coin needs no val windows of its own.
    return state.replace(
        key=jax.vmap(lambda key: jax.random.split(key)[1])(keys_K2),
        active=arrays.train_mask.any(axis=1),
    )


def with_bar(state: epoch_spec.GroupState, val_sum_K, val_n_K) -> epoch_spec.GroupState:
    """step.with_bar for the one pooled model: the bar of every training coin is the
    window mean of the val losses summed per coin (val_sum_K over val_n_K windows)."""
    val = pooled_mean(val_sum_K, val_n_K, state.active)
    return state.replace(best_val=jnp.where(state.active, val, jnp.inf).astype(jnp.float32))


def restart(
    spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, params
) -> epoch_spec.GroupState:
    """step.restart for the one pooled model (`params` [K, ...], every coin's the same)."""
    k = state.active.shape[0]
    return state.replace(
        params=params,
        opt_state=replicate(spec.tx.init(first(params)), k),
        best_params=jax.tree.map(jnp.copy, params),
    )


def start_from(
    spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, params, arrays: stacking.GroupArrays
) -> epoch_spec.GroupState:
    """step.start_from for the one pooled model: the starting model's pooled val loss is
    the one to beat."""
    return with_bar(restart(spec, state, params), *validation.val_sums(spec, params, arrays))


class Batch(NamedTuple):
    """One step's windows of the coins at hand (a device's, or a chunk of them)."""

    windows: batching.StepWindows  # each coin's B windows
    mask_KB: jax.Array  # bool [K, B] valid windows, False for coins that do not train
    keys_K: jax.Array  # each coin's key of this step

    def coin_axes(self) -> Batch:
        """vmap axes of the coins' batches."""
        return Batch(self.windows.coin_axes(), 0, 0)


def coin_sums(spec: epoch_spec.EpochSpec, params, batch: Batch):
    """(objective float32 [K], forecast loss float32 [K]): each coin's batch under the
    shared `params`, summed over its valid windows (step.coin_loss_sums, vmapped)."""
    sums = jax.vmap(
        functools.partial(step.coin_loss_sums, spec), in_axes=(None, *batch.coin_axes())
    )
    return sums(params, *batch)


def pooled_objective(spec: epoch_spec.EpochSpec, params, batch: Batch, n):
    """The training objective of the shared `params` summed over the valid windows of
    every coin's batch, over n (the step's valid windows on every device, int32 []), and
    (aux) each coin's summed forecast loss, float32 [K]."""
    objective_K, err_K = coin_sums(spec, params, batch)
    return jnp.sum(objective_K) / jnp.maximum(n, 1), err_K


def chunk_of(tree, axes, start, size: int):
    """Coins start..start+size of every leaf with a coin axis (`axes`: 0, or None for a
    leaf without one, as `Batch.coin_axes` gives them)."""
    return jax.tree.map(
        lambda ax, a: a if ax is None else jax.lax.dynamic_slice_in_dim(a, start, size, 0),
        axes,
        tree,
        is_leaf=lambda x: x is None,
    )


def chunked_value_and_grad(spec: epoch_spec.EpochSpec, params, batch: Batch, n):
    """pooled_objective's ((sum / n, err_K), gradient), taken over chunks of Z =
    train.pooled_chunk coins whose gradients are summed: a chunk's activations are freed
    before the next one runs. The last chunk ends at coin K (dynamic_slice clamps its
    start); its coins that an earlier chunk took are masked out."""
    k, z = batch.mask_KB.shape[0], spec.pooled_chunk

    def chunk_sums(p, j):
        first = j * z
        start = jnp.minimum(first, k - z)
        fresh_Z = start + jnp.arange(z) >= first
        batch_Z = chunk_of(batch, batch.coin_axes(), start, z)
        batch_Z = batch_Z._replace(mask_KB=batch_Z.mask_KB & fresh_Z[:, None])
        objective_Z, err_Z = coin_sums(spec, p, batch_Z)
        return jnp.sum(objective_Z), (start, err_Z)

    def body(carry, j):
        total, err_K, grads = carry
        (objective, (start, err_Z)), g = jax.value_and_grad(chunk_sums, has_aux=True)(params, j)
        err_K = jax.lax.dynamic_update_slice_in_dim(
            err_K, jax.lax.dynamic_slice_in_dim(err_K, start, z) + err_Z, start, 0
        )
        return (total + objective, err_K, jax.tree.map(jnp.add, grads, g)), None

    zeros = (jnp.zeros((), jnp.float32), jnp.zeros((k,), jnp.float32))
    carry = (*zeros, jax.tree.map(jnp.zeros_like, params))
    (total, err_K, grads), _ = jax.lax.scan(body, carry, jnp.arange(-(-k // z)))
    n = jnp.maximum(n, 1)
    return (total / n, err_K), jax.tree.map(lambda g: g / n, grads)


def pooled_value_and_grad(spec: epoch_spec.EpochSpec, params, batch: Batch, n):
    """((objective summed over these coins' valid windows / n, err_K), its gradient of the
    shared params): in one vmap over the K coins, or in chunks of train.pooled_chunk coins
    when that is smaller than K. With n the windows of every device, the devices' values
    and gradients sum to those of the mean over all of them."""
    if 0 < spec.pooled_chunk < batch.mask_KB.shape[0]:
        return chunked_value_and_grad(spec, params, batch, n)
    loss_fn = functools.partial(pooled_objective, spec)
    return jax.value_and_grad(loss_fn, has_aux=True)(params, batch, n)


class PooledStep(NamedTuple):
    """What one pooled update takes besides the shared params and the data."""

    batch: Batch  # this device's coins' windows of the step
    lr: jax.Array  # learning rate (schedule x a sweep setting's lr_mult)
    hparams: dict  # a sweep setting's other injected optimizer values ({} without one)


def pooled_train_step(spec: epoch_spec.EpochSpec, params, opt_state, s: PooledStep):
    """One update of the shared params from every coin's batch, the same on every device
    (the objective and gradient summed over them); a StepResult with this device's
    per-coin sums [K] and one nonfinite."""
    n_K = jnp.sum(s.batch.mask_KB, axis=1)
    n = device_sum(jnp.sum(n_K))
    (objective, err_K), grads = pooled_value_and_grad(spec, params, s.batch, n)
    objective, grads = device_sum((objective, grads))
    opt_state = optimizer.with_learning_rate(opt_state, s.lr, **s.hparams)
    updates, new_opt = spec.tx.update(grads, opt_state, params)
    finite = jnp.isfinite(objective) & jnp.isfinite(optax.tree.norm(grads))
    trains = n > 0
    take = trains & finite
    params = jax.tree.map(
        lambda a, b: jnp.where(take, a, b), optax.apply_updates(params, updates), params
    )
    opt_state = jax.tree.map(lambda a, b: jnp.where(take, a, b), new_opt, opt_state)
    n_taken_K = jnp.where(take, n_K, 0)
    return epoch_spec.StepResult(
        params, opt_state, jnp.where(take, err_K, 0.0), n_taken_K, trains & ~finite
    )


def train_steps(
    spec: epoch_spec.EpochSpec,
    state: epoch_spec.GroupState,
    arrays: stacking.GroupArrays,
    trained: epoch_spec.TrainPass,
    xs,
    windows_of,
) -> epoch_spec.TrainPass:
    """step.train_steps for the shared params: `trained` (in the state's layout, every
    coin's params the same) after the steps `xs`, replicated back to this device's
    [K, ...] with its per-coin sums."""
    _, step_keys_K = batching.epoch_keys(state)
    lr_mult, hparams = setting_hparams(arrays)

    def body(carry: epoch_spec.TrainPass, xs):
        s, part, mask_KB = xs
        lr = spec.schedule(state.epoch * spec.train_steps + s)
        keys_K = jax.vmap(jax.random.fold_in, (0, None))(step_keys_K, s)
        mask_KB = mask_KB & state.active[:, None]
        pooled_step = PooledStep(Batch(windows_of(part), mask_KB, keys_K), lr * lr_mult, hparams)
        r = pooled_train_step(spec, carry.params, carry.opt_state, pooled_step)
        return carry.add(r), None

    k = state.active.shape[0]
    carry = trained._replace(params=shared(trained.params), opt_state=shared(trained.opt_state))
    carry, _ = jax.lax.scan(body, carry, xs)
    return carry._replace(
        params=replicate(carry.params, k),
        opt_state=replicate(carry.opt_state, k),
        # A step's nonfinite is the shared update's (one bool, broadcast over the coins).
        nonfinite_K=state.active & carry.nonfinite_K,
    )


def train_pass(
    spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, arrays
) -> epoch_spec.TrainPass:
    """This epoch's train steps with the shared params, each batch sliced from the
    device-resident series; as step.train_pass."""
    ends_SKB, mask_SKB = batching.train_batches(spec, state, arrays)
    series = batching.coin_data(arrays)
    xs = (jnp.arange(spec.train_steps), ends_SKB, mask_SKB)
    windows_of = lambda ends_KB: batching.SeriesWindows(series, ends_KB)
    return train_steps(spec, state, arrays, step.fresh_pass(state), xs, windows_of)


def setting_hparams(arrays: stacking.GroupArrays):
    """The group's sweep setting as the pooled step takes it: (its lr_mult, the injected
    optimizer values: name -> []). A pooled sweep trains one setting per group
    (cpbjax/modes/sweep.py), so coin 0's values are every coin's; without a sweep, (1, {})."""
    return shared(step.coin_hparams(arrays, arrays.train_mask.shape[0]))


def run_epoch(spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, arrays):
    """One epoch of the pooled model: (new GroupState, metrics of step.EPOCH_METRICS)."""
    trained = train_pass(spec, state, arrays)
    val = validation.val_pass(spec, trained.params, arrays)
    best = validation.val_pass(spec, state.best_params, arrays)
    return finish_epoch(spec, state, trained, val, best)


def finish_epoch(
    spec: epoch_spec.EpochSpec,
    state: epoch_spec.GroupState,
    trained: epoch_spec.TrainPass,
    val: validation.ValPass,
    best: validation.ValPass,
):
    """step.finish_epoch for the pooled model: step.end_epoch gets the pooled val loss as
    every coin's, so the real coins improve, stop and diverge together; the metrics'
    val_loss is still each coin's own, and stop_val_loss and best_val_loss the pooled
    loss and its best. At the first epoch `best` also gives a baseline's bar, the pooled
    val loss of the untrained model (step.first_bar)."""
    pooled_best = pooled_mean(*gather_coins((best.sum_K, best.n_K, state.active)))
    state = step.first_bar(spec, state, jnp.where(state.active, pooled_best, jnp.inf))
    pooled_val = pooled_mean(*gather_coins((val.sum_K, val.n_K, state.active)))
    pooled_val_K = jnp.broadcast_to(pooled_val, val.n_K.shape)
    every_coin = gather_coins((val.loss_KN, best.loss_KN, val.mask_KN, state.active))
    gain_se = early_stopping.pooled_gain_se(*every_coin, spec.horizon - 1)
    gain_se_K = jnp.broadcast_to(gain_se, val.n_K.shape)
    train_K = step.train_losses(state, trained)
    new_state, metrics = step.end_epoch(spec, state, trained, train_K, pooled_val_K, gain_se_K)
    metrics["val_loss"] = jnp.where(state.active, val.mean_K(), jnp.nan)
    return new_state, metrics
