"""The compiled group program (one jitted call = one epoch of K coins) and the run driver.

A group of K series ("coins") trains as ONE program: params and optimizer state carry a
leading coin axis [K, ...], every per-coin function is `jax.vmap`ped over it, and a
single jitted, state-donating call runs a whole epoch on device-resident data:
shuffle each coin's training windows, `lax.scan` over the batches, validation loss,
per-coin early stopping. The host reads back only per-coin scalars once per epoch.

Masking rules: a padded window or coin adds nothing to any loss, gradient or metric; a
coin whose batch has no valid window, or that has stopped or diverged, keeps its params
and optimizer state bit for bit (`jnp.where` on the whole update, so Adam's step count
and moments do not move). Every reduction is per coin, so a NaN in one coin can never
reach another.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import itertools
import math
import os
import sys
import time
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import struct
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import cpbjax
from cpbjax import checkpoint, evaluate, models, optimizer, platform, report, tensorboard, writers
from cpbjax import config as config_lib
from cpbjax.data import sources, windows


class RunMismatch(ValueError):
    """--workdir holds a run of another config or series set, so it cannot resume."""


class NothingTrained(RuntimeError):
    """Every series was skipped; results.json lists each reason."""


COIN_AXIS = "coins"
# What `GroupTrainer.run_epoch` returns; epoch and lr are scalars, the rest [K].
EPOCH_METRICS = (
    "epoch",
    "lr",
    "train_loss",
    "val_loss",
    "best_val_loss",
    "lr_scale",
    "active",
    "diverged",
)


@struct.dataclass
class GroupState:
    """Everything a group needs to continue training; one Orbax checkpoint.

    All leaves except `epoch` carry the coin axis K first. Epoch numbers are 1-based;
    0 means "none yet".
    """

    params: Any  # Current Flax params [K, ...].
    opt_state: Any  # Optax state of `optimizer.make_optimizer` [K, ...].
    plateau: Any  # Reduce-on-plateau state [K, ...] (scale stays 1 when disabled).
    best_params: Any  # Params at each coin's best validation loss [K, ...].
    best_val: jax.Array  # float32 [K], inf before the first epoch.
    best_epoch: jax.Array  # int32 [K].
    bad_epochs: jax.Array  # int32 [K]: epochs since the last improvement.
    active: jax.Array  # bool [K]: still training (False for padded coins).
    diverged: jax.Array  # bool [K].
    diverged_epoch: jax.Array  # int32 [K].
    epochs_run: jax.Array  # int32 [K]: epochs this coin trained.
    key: jax.Array  # uint32 [K, 2]: per-coin training key; epoch keys fold in the epoch.
    epoch: jax.Array  # int32 []: epochs completed by the group.


def coin_mesh(devices=None) -> Mesh:
    """A 1-D mesh named `coins` over all (or the given) devices."""
    return Mesh(np.array(devices if devices is not None else jax.devices()), (COIN_AXIS,))


def coin_keys(seed: int, series_indices) -> np.ndarray:
    """uint32 [K, 2] keys fold_in(PRNGKey(seed), index): a coin's stream is its own.

    The index is the series' position in the run, so a coin trains the same
    whichever group or slot it lands in.
    """
    root = jax.random.PRNGKey(seed)
    return np.stack([np.asarray(jax.random.fold_in(root, int(i))) for i in series_indices])


def _coin_specs(tree):
    """PartitionSpecs of a pytree whose non-scalar leaves carry the coin axis first."""
    return jax.tree.map(lambda leaf: P(COIN_AXIS) if leaf.ndim else P(), tree)


def _select(take_K: jax.Array, new, old):
    """Per-coin choice between two [K, ...] pytrees (take_K: bool [K])."""

    def pick(n, o):
        return jnp.where(take_K.reshape(take_K.shape + (1,) * (n.ndim - 1)), n, o)

    return jax.tree.map(pick, new, old)


def _window_sq_err(y_hat_B: jax.Array, y_B: jax.Array) -> jax.Array:
    """Mean squared error of each window over its other axes ([B, H, C] or [B, A]), float32 [B]."""
    err = jnp.square(y_hat_B.astype(jnp.float32) - y_B)
    return jnp.mean(err, axis=tuple(range(1, err.ndim)))


# vmap axes of `_coin_data` over the coins: price_mask is shared.
_DATA_AXES = (0, 0, 0, None, 0)


def _coin_data(arrays: windows.GroupArrays) -> tuple:
    """What the per-coin functions read: (inputs, targets, anchor, price_mask, aux)."""
    return arrays.inputs, arrays.targets, arrays.anchor, arrays.price_mask, arrays.aux


class GroupTrainer:
    """Builds the jitted one-epoch program for groups of `num_coins` coins.

    The program depends only on the config, the module and K, so every group of a
    run (same padded shapes) reuses one compilation.

    Attributes:
      train_steps: batches per epoch (ceil of the padded train windows / batch size).
      val_steps: validation batches per epoch.
      schedule: global step -> base learning rate.
      state_sharding: NamedShardings of GroupState (coin axis over the mesh).
      arrays_sharding: NamedShardings of GroupArrays (see `stack`).
      coin_sharding: NamedSharding of one [K, ...] array.

    Init and epoch are `shard_map`ped over the coin axis: each device runs the program
    for its own K / num_devices coins, so no collective can ever appear between devices
    (coins are independent; a collective on XLA:CPU's host devices can also deadlock).
    """

    def __init__(
        self,
        config,
        module,
        num_coins: int,
        mesh: Mesh | None = None,
        max_traces: int | None = None,
    ):
        """Args:
        config: the run config (data, train and matmul_precision are read).
        module: the Flax Linen model (see cpbjax.models).
        num_coins: K, a multiple of the mesh size.
        mesh: a 1-D `coins` mesh; default `coin_mesh()`.
        max_traces: if set, the epoch function is wrapped in
          `chex.assert_max_traces(n=max_traces)` (tests use it to prove no recompiles).
        """
        self.config, self.module, self.num_coins = config, module, num_coins
        self.mesh = mesh if mesh is not None else coin_mesh()
        if num_coins % self.mesh.size:
            raise ValueError(
                f"num_coins={num_coins} is not a multiple of the {self.mesh.size} devices"
            )
        sizes = windows.padded_sizes(config.data)
        batch = config.train.batch_size
        self.train_steps = math.ceil(sizes["train"] / batch)
        self.val_steps = math.ceil(sizes["val"] / batch)
        self.tx = optimizer.make_optimizer(config.train)
        self.schedule = optimizer.make_schedule(
            config.train, optimizer.total_steps(config.train, self.train_steps)
        )
        self.plateau = optimizer.make_plateau(config.train)
        self.coin_sharding = NamedSharding(self.mesh, P(COIN_AXIS))
        self._build_programs(max_traces)

    def _build_programs(self, max_traces: int | None) -> None:
        """Jits the shard_mapped init and epoch."""
        state_specs = _coin_specs(self._state_shapes())
        arrays_specs = _coin_specs(self._abstract_arrays()).replace(price_mask=P())
        metrics_specs = {
            name: P() if name in ("epoch", "lr") else P(COIN_AXIS) for name in EPOCH_METRICS
        }
        self.state_sharding = jax.tree.map(lambda p: NamedSharding(self.mesh, p), state_specs)
        self.arrays_sharding = jax.tree.map(lambda p: NamedSharding(self.mesh, p), arrays_specs)
        epoch_fn = self._epoch
        if max_traces is not None:
            epoch_fn = chex.assert_max_traces(epoch_fn, n=max_traces)
        # check_vma=False: the scalar outputs (epoch, lr) are computed from replicated
        # inputs only, so they are the same on every device by construction.
        per_device = functools.partial(jax.shard_map, mesh=self.mesh, check_vma=False)
        self._epoch_jit = jax.jit(
            per_device(
                epoch_fn,
                in_specs=(state_specs, arrays_specs),
                out_specs=(state_specs, metrics_specs),
            ),
            donate_argnums=0,
        )
        init_specs = (P(COIN_AXIS), P(COIN_AXIS), P(COIN_AXIS))
        self._init_jit = jax.jit(per_device(self._init, in_specs=init_specs, out_specs=state_specs))

    def _state_shapes(self) -> GroupState:
        arrays = self._abstract_arrays()
        keys = jax.ShapeDtypeStruct((self.num_coins, 2), jnp.uint32)
        return jax.eval_shape(self._init, keys, arrays.train_mask, arrays.val_mask)

    def _abstract_arrays(self) -> windows.GroupArrays:
        """GroupArrays of ShapeDtypeStructs: the fixed padded shapes of this config."""
        d, k = self.config.data, self.num_coins
        sizes = windows.padded_sizes(d)
        t, f = sizes["T"], len(d.features)
        sds = jax.ShapeDtypeStruct
        ends = {}
        for split in windows.SPLITS:
            ends[f"{split}_ends"] = sds((k, sizes[split]), jnp.int32)
            ends[f"{split}_mask"] = sds((k, sizes[split]), jnp.bool_)
        num_aux = len(self.config.model.aux_targets)
        return windows.GroupArrays(
            inputs=sds((k, t, f), jnp.float32),
            targets=sds((k, t, windows.NUM_TARGETS), jnp.float32),
            anchor=sds((k, t), jnp.float32),
            aux=sds((k, t, num_aux), jnp.float32),
            price_mask=sds((f,), jnp.float32),
            **ends,
        )

    # -- public API ---------------------------------------------------------------------

    def stack(self, preps: list) -> windows.GroupArrays:
        """`windows.stack_group` padded to K coins and placed with this trainer's shardings."""
        return windows.stack_group(preps, self.num_coins, self.config.data, self.arrays_sharding)

    def init_state(self, keys_K2, arrays: windows.GroupArrays) -> GroupState:
        """A fresh GroupState: `module.init` of each coin with its own key.

        Args:
          keys_K2: uint32 [K, 2] coin keys (see `coin_keys`).
          arrays: the group's data; a coin without train or val windows starts inactive.
        """
        with jax.default_matmul_precision(self.config.matmul_precision):
            keys_K2 = np.asarray(keys_K2, np.uint32)
            keys = jax.make_array_from_callback(
                keys_K2.shape, self.coin_sharding, lambda i: keys_K2[i]
            )
            return self._init_jit(keys, arrays.train_mask, arrays.val_mask)

    def abstract_state(self) -> GroupState:
        """GroupState of jax.ShapeDtypeStruct with shardings, the target of a restore."""
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            self._state_shapes(),
            self.state_sharding,
        )

    def run_epoch(self, state: GroupState, arrays: windows.GroupArrays):
        """Runs one epoch of every active coin; `state` is donated (do not reuse it).

        Returns:
          (new state, metrics): device arrays; metrics holds float32 [K] train_loss,
          val_loss, best_val_loss, lr_scale, bool [K] active, diverged, and scalars
          epoch (1-based, the epoch just run) and lr (base schedule lr of its last step).
          Losses are NaN for coins that did not train this epoch.
        """
        with jax.default_matmul_precision(self.config.matmul_precision):
            return self._epoch_jit(state, arrays)

    def lowered_epoch(self, state: GroupState, arrays: windows.GroupArrays) -> jax.stages.Lowered:
        """The lowered epoch program, e.g. `.compile().cost_analysis()` for benchmarks."""
        with jax.default_matmul_precision(self.config.matmul_precision):
            return self._epoch_jit.lower(state, arrays)

    # -- init ------------------------------------------------------------------------

    def _init_coin(self, key):
        d = self.config.data
        init_key, train_key = jax.random.split(key)
        params_key, dropout_key, teacher_key = jax.random.split(init_key, 3)
        x_BLF = jnp.zeros((1, d.lookback, len(d.features)), jnp.float32)
        y_BHC = jnp.zeros((1, d.horizon, windows.NUM_TARGETS), jnp.float32)
        rngs = {"params": params_key, "dropout": dropout_key, "teacher": teacher_key}
        params = self.module.init(rngs, x_BLF, y_BHC, train=False)["params"]
        return params, self.tx.init(params), optimizer.init_plateau(self.plateau), train_key

    def _init(self, keys_K2, train_mask_KN, val_mask_KN) -> GroupState:
        """The fresh state of the coins given (all K, or one device's share of them)."""
        # lax.map, not vmap: a vmapped orthogonal init (GRU/LSTM recurrent kernels) is a
        # batched LAPACK QR, whose CPU kernel (jaxlib 0.10) fans out over the intra-op
        # pool and deadlocks when the pool is small (seen with K >= 3 on 2 cores). Init
        # runs once per group, so a sequential map costs nothing that matters.
        params, opt_state, plateau, train_keys = jax.lax.map(self._init_coin, keys_K2)
        k = keys_K2.shape[0]
        zeros_K = jnp.zeros((k,), jnp.int32)
        # A coin without train or val windows (a padded one) never trains.
        active_K = train_mask_KN.any(axis=1) & val_mask_KN.any(axis=1)
        return GroupState(
            params=params,
            opt_state=opt_state,
            plateau=plateau,
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

    # -- one coin ------------------------------------------------------------------------

    def _gather(self, data, ends_B):
        """(x_BLF, y_BHC, aux_BA) of the windows ending at ends_B of ONE coin (data: _coin_data)."""
        d = self.config.data
        inputs_TF, targets_TC, anchor_T, price_mask_F, aux_TA = data
        num_aux = len(self.config.model.aux_targets)
        if aux_TA.shape[-1] != num_aux:
            raise ValueError(
                f"the group has {aux_TA.shape[-1]} aux target columns but config.model."
                f"aux_targets={tuple(self.config.model.aux_targets)}: prepare the series with "
                "windows.prepare_all(..., aux_targets=config.model.aux_targets)"
            )
        x_BLF, y_BHC = windows.gather(
            inputs_TF, targets_TC, anchor_T, price_mask_F, ends_B, d.lookback, d.horizon
        )
        return x_BLF, y_BHC, windows.gather_aux(aux_TA, ends_B)

    def _coin_loss(self, params, data, ends_B, mask_B, key):
        """The training objective of ONE coin's batch, and its OHLC part.

        Per window: OHLC MSE + model.aux_weight * aux MSE (the aux term only with
        model.aux_targets); both are means over the valid windows of the batch.

        Returns:
          (objective, ohlc_mse): float32 scalars; 0 when no window is valid.
        """
        x_BLF, y_BHC, aux_BA = self._gather(data, ends_B)
        dropout_key, teacher_key = jax.random.split(key)
        y_hat_BHC, aux_hat_BA = self.module.apply(
            {"params": params},
            x_BLF,
            y_BHC,
            train=True,
            teacher_forcing=self.config.train.teacher_forcing,
            return_aux=True,
            rngs={"dropout": dropout_key, "teacher": teacher_key},
        )
        n = jnp.maximum(jnp.sum(mask_B), 1)
        err_B = jnp.where(mask_B, _window_sq_err(y_hat_BHC, y_BHC), 0.0)
        objective_B = err_B
        if aux_BA.shape[-1]:  # static: without aux targets the objective is the OHLC MSE
            aux_err_B = jnp.where(mask_B, _window_sq_err(aux_hat_BA, aux_BA), 0.0)
            objective_B = err_B + self.config.model.aux_weight * aux_err_B
        return jnp.sum(objective_B) / n, jnp.sum(err_B) / n

    def _coin_train_step(self, params, opt_state, data, ends_B, mask_B, key, lr, active):
        """One masked update of ONE coin; data is `_coin_data` of one coin.

        Returns (params, opt_state, loss_sum, num_windows, nonfinite) where the sums
        cover the windows actually trained on; the loss is the OHLC MSE (the aux term
        shapes the gradient, not the reported loss, so runs with and without aux
        targets report the same quantity as the val loss).
        """
        n = jnp.sum(mask_B)
        (objective, loss), grads = jax.value_and_grad(self._coin_loss, has_aux=True)(
            params, data, ends_B, mask_B, key
        )
        updates, new_opt = self.tx.update(
            grads, optimizer.with_learning_rate(opt_state, lr), params
        )
        finite = jnp.isfinite(objective) & jnp.isfinite(optax.tree.norm(grads))
        take = active & (n > 0) & finite
        params = jax.tree.map(
            lambda a, b: jnp.where(take, a, b), optax.apply_updates(params, updates), params
        )
        opt_state = jax.tree.map(lambda a, b: jnp.where(take, a, b), new_opt, opt_state)
        n_taken = jnp.where(take, n, 0)
        return params, opt_state, loss * n_taken, n_taken, active & (n > 0) & ~finite

    def _coin_val_sums(self, params, data, ends_B, mask_B):
        """Sum of per-window OHLC MSE over the valid val windows of ONE coin, and their count.

        The aux targets never enter it: early stopping watches the forecast the model
        is for, and the val loss stays comparable across runs with any aux targets.
        """
        x_BLF, y_BHC, _ = self._gather(data, ends_B)
        y_hat_BHC = self.module.apply({"params": params}, x_BLF, None, train=False)
        err_B = jnp.where(mask_B, _window_sq_err(y_hat_BHC, y_BHC), 0.0)
        return jnp.sum(err_B), jnp.sum(mask_B)

    # -- the epoch ---------------------------------------------------------------------

    def _batches(self, ends_KN, mask_KN, num_steps, keys_K=None):
        """[S, K, B] window ends and masks; shuffled per coin (valid first) if keys_K given."""
        if keys_K is not None:

            def shuffle(key, ends_N, mask_N):
                u_N = jnp.where(mask_N, jax.random.uniform(key, mask_N.shape), 2.0)
                order_N = jnp.argsort(u_N)  # Valid windows in random order, padding last.
                return ends_N[order_N], mask_N[order_N]

            ends_KN, mask_KN = jax.vmap(shuffle)(keys_K, ends_KN, mask_KN)
        k, n = ends_KN.shape
        batch = self.config.train.batch_size
        pad = num_steps * batch - n
        ends_KN = jnp.pad(
            ends_KN, ((0, 0), (0, pad)), constant_values=self.config.data.lookback - 1
        )
        mask_KN = jnp.pad(mask_KN, ((0, 0), (0, pad)))
        # [K, S*B] -> [K, S, B] -> [S, K, B]: scan over S, vmap over K.
        to_skb = lambda a: a.reshape(k, num_steps, batch).swapaxes(0, 1)
        return to_skb(ends_KN), to_skb(mask_KN)

    def _train_pass(self, state: GroupState, arrays: windows.GroupArrays):
        """Scan over this epoch's batches; returns params, opt state and per-coin sums."""
        epoch_keys_K = jax.vmap(jax.random.fold_in, (0, None))(state.key, state.epoch)
        pair_K22 = jax.vmap(jax.random.split)(epoch_keys_K)
        shuffle_keys_K, step_keys_K = pair_K22[:, 0], pair_K22[:, 1]
        ends_SKB, mask_SKB = self._batches(
            arrays.train_ends, arrays.train_mask, self.train_steps, shuffle_keys_K
        )
        data = _coin_data(arrays)
        lr_scale_K = jax.vmap(optimizer.plateau_scale)(state.plateau)
        step = jax.vmap(self._coin_train_step, in_axes=(0, 0, _DATA_AXES, 0, 0, 0, 0, 0))

        def body(carry, xs):
            params, opt_state, loss_K, n_K, bad_K = carry
            s, ends_KB, mask_KB = xs
            lr = self.schedule(state.epoch * self.train_steps + s)
            keys_K = jax.vmap(jax.random.fold_in, (0, None))(step_keys_K, s)
            params, opt_state, loss_b, n_b, bad_b = step(
                params, opt_state, data, ends_KB, mask_KB, keys_K, lr * lr_scale_K, state.active
            )
            return (params, opt_state, loss_K + loss_b, n_K + n_b, bad_K | bad_b), None

        k = state.active.shape[0]  # this device's coins
        carry = (
            state.params,
            state.opt_state,
            jnp.zeros((k,), jnp.float32),
            jnp.zeros((k,), jnp.int32),
            jnp.zeros((k,), bool),
        )
        xs = (jnp.arange(self.train_steps), ends_SKB, mask_SKB)
        carry, _ = jax.lax.scan(body, carry, xs)
        return carry

    def _val_loss(self, params, arrays: windows.GroupArrays) -> jax.Array:
        """Masked mean validation loss per coin, float32 [K] (NaN for a coin without windows)."""
        ends_SKB, mask_SKB = self._batches(arrays.val_ends, arrays.val_mask, self.val_steps)
        data = _coin_data(arrays)
        sums = jax.vmap(self._coin_val_sums, in_axes=(0, _DATA_AXES, 0, 0))

        def body(carry, xs):
            err_K, n_K = sums(params, data, *xs)
            return (carry[0] + err_K, carry[1] + n_K), None

        k = ends_SKB.shape[1]  # this device's coins
        (err_K, n_K), _ = jax.lax.scan(
            body, (jnp.zeros((k,), jnp.float32), jnp.zeros((k,), jnp.int32)), (ends_SKB, mask_SKB)
        )
        return jnp.where(n_K > 0, err_K / jnp.maximum(n_K, 1), jnp.nan)

    def _epoch(self, state: GroupState, arrays: windows.GroupArrays):
        params, opt_state, loss_K, n_K, nonfinite_K = self._train_pass(state, arrays)
        val_K = self._val_loss(params, arrays)
        train_K = jnp.where(state.active & (n_K > 0), loss_K / jnp.maximum(n_K, 1), jnp.nan)
        return self._end_epoch(state, params, opt_state, train_K, val_K, nonfinite_K)

    def _end_epoch(self, state: GroupState, params, opt_state, train_K, val_K, nonfinite_K):
        """Per-coin early stopping, divergence and plateau bookkeeping after one epoch."""
        t = self.config.train
        epoch = state.epoch + 1
        ran_K = state.active
        diverged_K = ran_K & (nonfinite_K | ~jnp.isfinite(val_K))
        improved_K = ran_K & ~diverged_K & (val_K < state.best_val - t.min_delta)
        best_params = _select(improved_K, params, state.best_params)
        bad_K = jnp.where(improved_K, 0, state.bad_epochs + ran_K.astype(jnp.int32))
        plateau = state.plateau
        if t.reduce_on_plateau:
            stepped = jax.vmap(optimizer.step_plateau, (None, 0, 0))(self.plateau, plateau, val_K)
            plateau = _select(ran_K & ~diverged_K, stepped, plateau)
        active_K = ran_K & ~diverged_K & (bad_K < t.patience)
        new_state = state.replace(
            params=_select(diverged_K, best_params, params),
            opt_state=opt_state,
            plateau=plateau,
            best_params=best_params,
            best_val=jnp.where(improved_K, val_K, state.best_val),
            best_epoch=jnp.where(improved_K, epoch, state.best_epoch),
            bad_epochs=bad_K,
            active=active_K,
            diverged=state.diverged | diverged_K,
            diverged_epoch=jnp.where(diverged_K, epoch, state.diverged_epoch),
            epochs_run=state.epochs_run + ran_K.astype(jnp.int32),
            epoch=epoch,
        )
        metrics = {
            "epoch": epoch,
            "lr": self.schedule(epoch * self.train_steps - 1),
            "train_loss": train_K,
            "val_loss": jnp.where(ran_K, val_K, jnp.nan),
            "best_val_loss": new_state.best_val,
            "lr_scale": jax.vmap(optimizer.plateau_scale)(plateau),
            "active": active_K,
            "diverged": new_state.diverged,
        }
        return new_state, metrics


# ---------------------------------------------------------------------------------------
# The run driver.

LEDGER_FILE = "groups.json"  # Under checkpoints/: the group plan and finished groups.
MAX_GROUP_SIZE = 64  # train.group_size=0 puts up to this many series in one program ...
# ... except on CPU devices, where a coin's step is fastest while the group's working set
# stays in cache: 4 coins per device (BUILD_NOTES "Group size on the CPU").
CPU_COINS_PER_DEVICE = 4


def _is_primary() -> bool:
    """Whether this process writes the workdir's files (process 0 of a multi-host run)."""
    return jax.process_index() == 0


def _to_host(tree):
    """Numpy copy of a pytree of [K, ...] device arrays.

    In a multi-host run each process holds only its own coins' shards, so the arrays
    are gathered from every process (a collective: every process must call this).
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def _wait_for_all(barrier: str) -> None:
    """Multi-host: every process waits here until all arrive (process 0 is the slow one,
    as it alone evaluates and writes), so none runs ahead into the next collective."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(barrier)


def group_size(num_series: int, train_cfg, num_devices: int, backend: str) -> int:
    """Coins per program, a multiple of the device count so the coin axis shards evenly.

    train.group_size if set, else as many as fit: up to 64 on accelerators and
    CPU_COINS_PER_DEVICE per device on the CPU backend; never more than the series
    (rounded up to the device count).
    """
    fit = CPU_COINS_PER_DEVICE * num_devices if backend == "cpu" else MAX_GROUP_SIZE
    k = min(train_cfg.group_size or fit, num_series)
    return -(-k // num_devices) * num_devices


def _prepare_all(config) -> tuple[list, dict]:
    """Loads and prepares every series; returns (PreparedSeries list, name -> skip reason)."""
    series, skipped = sources.load_all(config.data)
    preps, unusable = windows.prepare_all(series, config.data, aux_targets=config.model.aux_targets)
    return preps, {**skipped, **unusable}


# Data fields that change where or how candles are fetched, never which candles.
_FETCH_FIELDS = ("base_url", "cache_dir", "download_workers", "timeout_seconds", "retries")
# Train fields that change how the coins are computed, never what they train.
_EXECUTION_FIELDS = ("compact_groups",)


def _training_fields(config) -> dict:
    """The config fields that decide what a run trains (JSON types)."""
    keys = ("seed", "dtype", "matmul_precision", "data", "model", "train")
    fields = writers.to_jsonable({k: config[k] for k in keys})
    for name in _FETCH_FIELDS:
        del fields["data"][name]
    for name in _EXECUTION_FIELDS:
        del fields["train"][name]
    return fields


def _fingerprint(config, plan: list[list[str]]) -> dict:
    """What a resumed run must share with the run that wrote the checkpoints."""
    return {"config": _training_fields(config), "groups": plan}


def _with_defaults(old: dict, defaults: dict) -> dict:
    """`old` plus the fields it lacks, from `defaults` (nested dicts merged).

    A config field added to cpbjax after a run was started is absent from that run's
    ledger; left at its default it changes nothing, so it must not block the resume.
    """
    merged = dict(old)
    for key, value in defaults.items():
        if key not in merged:
            merged[key] = value
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = _with_defaults(merged[key], value)
    return merged


def _differences(old, new, prefix="") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for k in sorted(set(old) | set(new))
            for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        ]
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


class _Ledger:
    """<workdir>/checkpoints/groups.json: the run's group plan and each finished group's entries.

    A rerun with the same --workdir skips the groups recorded here and refuses to mix
    in a different config or set of series.
    """

    def __init__(self, workdir: str, fingerprint: dict):
        self.path = os.path.join(workdir, "checkpoints", LEDGER_FILE)
        self.data = {"fingerprint": fingerprint, "finished": {}}
        if os.path.exists(self.path):
            old = writers.read_json(self.path)
            defaults = _training_fields(config_lib.base_config())
            old_config = _with_defaults(old["fingerprint"]["config"], defaults)
            diffs = _differences({**old["fingerprint"], "config": old_config}, fingerprint)
            if diffs:
                raise RunMismatch(
                    f"{workdir} holds a run with a different config or series, so it cannot be "
                    f"resumed ({'; '.join(diffs[:5])}); rerun the same command or use a new --workdir"
                )
            self.data = old
        self._write()

    def finished(self, group: str) -> dict | None:
        return self.data["finished"].get(group)

    def finish(self, group: str, entries: dict) -> None:
        self.data["finished"][group] = entries
        self._write()

    def _write(self) -> None:
        if _is_primary():
            writers.write_json(self.path, self.data)


def _memory_bytes() -> tuple[int | None, int | None]:
    """(bytes in use, peak bytes) summed over local devices, or Nones where unsupported."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    if not all(stats):
        return None, None
    peak = [s.get("peak_bytes_in_use") for s in stats]
    return sum(s.get("bytes_in_use", 0) for s in stats), (None if None in peak else sum(peak))


@dataclasses.dataclass
class _Run:
    """What every group of one run shares."""

    config: Any
    workdir: str
    module: Any
    trainer: GroupTrainer
    ledger: _Ledger
    log: writers.MetricsLog
    progress: Any
    index: dict  # series name -> position in the run (its key's fold-in index)
    tensorboard: tensorboard.TensorBoardLog | None  # with logging.tensorboard, process 0
    forecasts: dict = dataclasses.field(default_factory=dict)  # name -> test forecast record
    # Programs of fewer coins that group compaction moved live coins to: K -> GroupTrainer.
    smaller_trainers: dict = dataclasses.field(default_factory=dict)

    def checkpoints(self, group: str) -> checkpoint.GroupCheckpoints:
        c = self.config.ckpt
        path = os.path.join(self.workdir, "checkpoints", group)
        return checkpoint.GroupCheckpoints(path, c.every_epochs, c.keep)

    def trainer_for(self, num_coins: int) -> GroupTrainer:
        """The run's trainer for programs of `num_coins` coins (each size compiles once)."""
        if num_coins == self.trainer.num_coins:
            return self.trainer
        if num_coins not in self.smaller_trainers:
            self.smaller_trainers[num_coins] = GroupTrainer(
                self.config, self.module, num_coins, self.trainer.mesh
            )
        return self.smaller_trainers[num_coins]


def _place(host_tree, shardings):
    """Device arrays of a host (numpy) pytree, each process placing only its own shards."""
    return jax.tree.map(
        lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]), host_tree, shardings
    )


def _compaction_pays(epoch_seconds: list[float], k: int, k_live: int, epochs_left: int) -> bool:
    """Whether moving the live coins of a k-coin program to a k_live-coin one saves time.

    Args:
      epoch_seconds: wall times of the current program's epochs; the first includes its
        compile. The new program is assumed to compile as long, and its epoch to take
        k_live / k of this one's (true on a CPU; on an accelerator with room to spare
        the epoch shrinks less, so this over-estimates the saving there).
      epochs_left: a lower bound on the epochs still to run (the most patience any live
        coin has left, at most the epochs left in the run).
    """
    if len(epoch_seconds) < 2:
        return False
    epoch_s = float(np.median(epoch_seconds[1:]))
    compile_s = max(epoch_seconds[0] - epoch_s, 0.0)
    return epochs_left * epoch_s * (1 - k_live / k) > compile_s


class _LiveCoins:
    """The coins of one group that still train, and the program that trains them.

    A vmapped epoch computes every coin of its program, the stopped ones too (their
    results are thrown away), so a group whose coins have mostly stopped pays for all of
    them. With train.compact_groups, once at most half of the program's coins still
    train, and the time saved should outweigh compiling a new program, they move to a
    program of their own size (rounded up to a multiple of the devices). Each coin keeps
    its key, and the schedule follows the shared epoch count, so every coin trains as
    before; only the batch of coins computed together changes.
    The stopped coins' state no longer changes: it waits on the host, and the group's
    full state is put back together only for a checkpoint and at the end.
    """

    def __init__(self, run: _Run, preps: list, state: GroupState, arrays):
        self.run, self.preps = run, preps
        self.trainer, self.state, self.arrays = run.trainer, state, arrays
        self.slots = np.arange(run.trainer.num_coins)  # group slot of each program coin
        self.frozen = None  # host GroupState of the whole group, once compacted
        self.frozen_metrics = None  # what the whole program would report for stopped coins
        self.epoch_seconds = []  # of the current program

    def run_epoch(self) -> dict:
        """One epoch of the live coins; host metrics for all K coins of the group."""
        t0 = time.monotonic()
        self.state, metrics = self.trainer.run_epoch(self.state, self.arrays)
        m = _to_host(metrics)
        self.epoch_seconds.append(time.monotonic() - t0)
        if self.frozen is None:
            return m
        full = {"epoch": m["epoch"], "lr": m["lr"]}
        for name, stopped in self.frozen_metrics.items():
            full[name] = stopped.copy()
            full[name][self.slots] = m[name][: len(self.slots)]
        return full

    def maybe_compact(self, m: dict) -> None:
        """Moves the live coins to a smaller program if at most half of this one's train
        and `_compaction_pays`; `m` is the group's host metrics of the epoch just run."""
        t = self.run.config.train
        k, devices = self.trainer.num_coins, self.trainer.mesh.size
        live = np.flatnonzero(m["active"][self.slots])  # positions in this program
        k_live = max(devices, -(-live.size // devices) * devices)
        if live.size == 0 or 2 * live.size > k or k_live >= k:
            return
        # Only now is the patience left worth a transfer (metrics do not carry it).
        bad = _to_host(self.state.bad_epochs)[live]
        epochs_left = min(t.patience - bad.min(), t.epochs - int(m["epoch"]))
        pays = _compaction_pays(self.epoch_seconds, k, k_live, int(epochs_left))
        if jax.process_count() > 1:  # Timings differ between hosts: process 0 decides.
            pays = bool(multihost_utils.broadcast_one_to_all(np.array(pays)))
        if not pays:
            return
        full = self._full_host()
        slots = self.slots[live]
        # Stopped coins fill the padding rows: inactive, they never train, and only the
        # live rows are ever written back.
        filler = np.flatnonzero(~full.active)[0]
        rows = np.concatenate([slots, np.full(k_live - slots.size, filler)])
        trainer = self.run.trainer_for(k_live)
        self.state = _place(
            jax.tree.map(lambda a: a[rows] if a.ndim else a, full), trainer.state_sharding
        )
        self.arrays = trainer.stack([self.preps[i] for i in slots])
        self.trainer, self.slots, self.frozen, self.epoch_seconds = trainer, slots, full, []
        nan_K = np.full(full.active.shape, np.nan, np.float32)
        self.frozen_metrics = {
            "train_loss": nan_K,
            "val_loss": nan_K,
            "best_val_loss": full.best_val,
            "lr_scale": np.asarray(jax.vmap(optimizer.plateau_scale)(full.plateau)),
            "active": np.zeros_like(full.active),
            "diverged": full.diverged,
        }
        logging.info(
            "%d of %d coins still train: moved them to a program of %d", slots.size, k, k_live
        )

    def full_state(self) -> GroupState:
        """The whole group's state on the devices (this program's own while uncompacted)."""
        if self.frozen is None:
            return self.state
        return _place(self._full_host(), self.run.trainer.state_sharding)

    def _full_host(self) -> GroupState:
        """Host copy of the whole group's state: the frozen rows updated with the live ones."""
        host = _to_host(self.state)
        if self.frozen is None:
            return host
        n = self.slots.size

        def merge(frozen, live):
            if not frozen.ndim:  # the group's epoch count
                return live
            merged = frozen.copy()
            merged[self.slots] = live[:n]
            return merged

        return jax.tree.map(merge, self.frozen, host)


def _epoch_record(
    group: str, names: list[str], m: dict, seconds: float, plateau: bool, coins_computed: int
) -> dict:
    """One metrics.jsonl line from the host copy of `run_epoch`'s metrics (real coins only)."""
    n = len(names)
    record = {
        "group": group,
        "epoch": int(m["epoch"]),
        "series": names,
        "train_loss": m["train_loss"][:n],
        "val_loss": m["val_loss"][:n],
        "best_val_loss": m["best_val_loss"][:n],
        "lr": float(m["lr"]),
        "active": m["active"][:n],
        "seconds": seconds,
        "coins_computed": coins_computed,
    }
    if plateau:
        record["lr_scale"] = m["lr_scale"][:n]
    return writers.to_jsonable(record)


def _run_epochs(run: _Run, group: str, preps: list, state, arrays, start: int):
    """Runs epochs until every coin stopped or train.epochs; checkpoints as configured.

    Returns:
      (final state, training seconds, peak device memory bytes or None).
    """
    t = run.config.train
    names = [p.name for p in preps]
    ckpts = run.checkpoints(group)
    primary = _is_primary()
    if primary:
        run.progress.start_group(group, len(names), t.epochs, start)
        if run.tensorboard:
            run.tensorboard.start_group(group, start)
    began = time.monotonic()
    live = _LiveCoins(run, preps, state, arrays)
    finished = start >= t.epochs or not _to_host(state.active).any()
    while not finished:
        computed = live.trainer.num_coins
        m = live.run_epoch()
        record = _epoch_record(
            group, names, m, live.epoch_seconds[-1], t.reduce_on_plateau, computed
        )
        if primary:
            run.log.append(record)
            run.progress.update(record, _memory_bytes()[0])
            if run.tensorboard:
                run.tensorboard.append(record)
        finished = record["epoch"] >= t.epochs or not m["active"].any()
        if ckpts.due(record["epoch"], force=finished):  # All processes save.
            ckpts.maybe_save(record["epoch"], live.full_state(), force=finished)
        if t.compact_groups and not finished:
            live.maybe_compact(m)
    ckpts.close()
    if primary:
        run.progress.end_group()
    return live.full_state(), time.monotonic() - began, _memory_bytes()[1]


def _train_group(run: _Run, group: str, preps: list) -> dict:
    """Trains one group from scratch or from its latest checkpoint; returns its entries."""
    trainer, names = run.trainer, [p.name for p in preps]
    arrays = trainer.stack(preps)
    ckpts = run.checkpoints(group)
    restored = ckpts.restore_latest(trainer.abstract_state())
    ckpts.close()
    if restored is None:
        pad = [len(run.index) + i for i in range(trainer.num_coins - len(preps))]
        keys = coin_keys(run.config.seed, [run.index[n] for n in names] + pad)
        state, start = trainer.init_state(keys, arrays), 0
    else:
        state, start = restored
        logging.info("%s: resuming after epoch %d", group, start)
    if _is_primary():  # Epochs after the checkpoint are re-run: drop their lines.
        run.log.keep(lambda r: r["group"] != group or r["epoch"] <= start)
    state, seconds, peak = _run_epochs(run, group, preps, state, arrays, start)
    return _finish_group(run, group, preps, state, seconds, peak)


def _status(active: bool, diverged: bool) -> str:
    return "diverged" if diverged else ("trained" if active else "stopped_early")


def _model_meta(run: _Run, prep, entry: dict) -> dict:
    """meta.json of a saved series model: enough to rebuild the module and map prices."""
    return {
        "series": prep.name,
        "symbol": prep.symbol,
        "interval": prep.interval,
        "model": dataclasses.asdict(models.make_config(run.config)),
        "config": run.config.to_dict(),
        "data": run.config.data.to_dict(),
        "norm": prep.norm,
        "price_mask": prep.price_mask,
        **{k: entry[k] for k in ("num_params", "status", "best_epoch", "best_val_loss")},
    }


def _evaluate(run: _Run, params, prep) -> dict:
    """val and test metrics of one series; keeps (and optionally saves) its test forecasts."""
    c = run.config
    test = evaluate.forecast(run.module, params, prep, "test", c.data.lookback, c.data.horizon)
    ends, prices, _ = test
    if prices is not None:
        if c.eval.save_forecasts:
            evaluate.save_forecasts(run.workdir, prep, ends, prices, c.data.horizon)
        run.forecasts[prep.name] = evaluate.forecast_record(prep, ends, prices, c.data.horizon)
    return {
        "val": evaluate.evaluate_series(run.module, params, prep, c, "val"),
        "test": evaluate.evaluate_series(run.module, params, prep, c, "test", forecasts=test),
    }


def _finish_group(
    run: _Run, group: str, preps: list, state: GroupState, seconds: float, peak_bytes: int | None
) -> dict:
    """Saves each series' best model, evaluates it and records the group as finished.

    Returns:
      series name -> results.json entry (without evaluation on processes other than 0).
    """
    fields = (
        "best_params",
        "best_val",
        "best_epoch",
        "epochs_run",
        "active",
        "diverged",
        "diverged_epoch",
    )
    host = _to_host({f: getattr(state, f) for f in fields})
    leaves = jax.tree.leaves(host["best_params"])
    num_params = sum(leaf.size for leaf in leaves) // run.trainer.num_coins
    entries = {}
    for i, prep in enumerate(preps):
        params = jax.tree.map(lambda a, i=i: a[i], host["best_params"])
        entry = {
            "status": _status(host["active"][i], host["diverged"][i]),
            "best_val_loss": host["best_val"][i],
            "best_epoch": int(host["best_epoch"][i]) or None,
            "epochs_run": int(host["epochs_run"][i]),
            "diverged_epoch": int(host["diverged_epoch"][i]) or None,
            "group": group,
            "train_seconds": seconds / len(preps),
            "group_train_seconds": seconds,
            "num_params": num_params,
            "peak_memory_bytes": peak_bytes,
            "data": prep.notes,
        }
        if _is_primary():
            path = os.path.join(run.workdir, "models", prep.name)
            checkpoint.save_series_model(path, params, _model_meta(run, prep, entry))
            entry.update(_evaluate(run, params, prep))
        entries[prep.name] = writers.to_jsonable(entry)
    run.ledger.finish(group, entries)
    _wait_for_all(f"cpbjax {group} finished")
    return entries


def _reload_forecasts(run: _Run, preps: list) -> None:
    """Test forecasts of a group finished by an earlier process, for the report's plots."""
    c = run.config
    plots = c.eval.plots and c.eval.plot_windows and c.data.normalization != "candle_minmax"
    if not (plots and _is_primary()):
        return
    for prep in preps:
        params, _ = checkpoint.load_series_model(os.path.join(run.workdir, "models", prep.name))
        ends, prices, _ = evaluate.forecast(
            run.module, params, prep, "test", c.data.lookback, c.data.horizon
        )
        run.forecasts[prep.name] = evaluate.forecast_record(prep, ends, prices, c.data.horizon)


def _versions() -> dict:
    names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy")
    return {
        "python": sys.version.split()[0],
        "cpbjax": cpbjax.__version__,
        **{n: importlib.metadata.version(n) for n in names},
    }


def _results(config, entries: dict, skipped: dict, started: float, plan: list) -> dict:
    """The results.json dict. `run.wall_seconds` counts this process only (not resumed parts)."""
    devices = platform.describe_devices()
    run = {
        "model": config.model.name,
        "seed": config.seed,
        "versions": _versions(),
        "platform": devices["backend"],
        "device_count": devices["device_count"],
        "process_count": devices["process_count"],
        "devices": devices["devices"],
        "groups": len(plan),
        "group_size": max((len(g) for g in plan), default=0),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_seconds": time.time() - started,
    }
    return writers.to_jsonable({"run": run, "series": entries, "skipped": skipped})


def _make_run(config, workdir: str, preps: list, mesh: Mesh) -> tuple[_Run, list]:
    """Builds the shared context of a run and its plan (a list of groups of PreparedSeries)."""
    k = group_size(len(preps), config.train, mesh.size, mesh.devices.flat[0].platform)
    plan = [preps[i : i + k] for i in range(0, len(preps), k)]
    module = models.build(models.make_config(config))
    pairs = itertools.product(config.data.symbols, config.data.intervals)
    run = _Run(
        config=config,
        workdir=workdir,
        module=module,
        trainer=GroupTrainer(config, module, k, mesh),
        ledger=_Ledger(workdir, _fingerprint(config, [[p.name for p in g] for g in plan])),
        log=writers.MetricsLog(workdir),
        progress=writers.make_progress(config.logging.progress),
        index={f"{s}-{i}": j for j, (s, i) in enumerate(pairs)},
        tensorboard=(
            tensorboard.TensorBoardLog(workdir)
            if config.logging.tensorboard and _is_primary()
            else None
        ),
    )
    return run, plan


def train_and_evaluate(config, workdir: str) -> dict:
    """Trains every series of `config` group by group, evaluates it, and writes the workdir.

    Writes config.json, metrics.jsonl, checkpoints/, models/<SERIES>/, results.json
    and the report. Rerunning with the same workdir resumes: finished groups are
    skipped and an unfinished one continues from its latest checkpoint.

    In a multi-host run (config.distributed) every process runs this with the same
    config and a workdir on a shared filesystem: the coin axis is sharded over all
    processes' devices, every process saves its shards of the group checkpoints, and
    process 0 alone writes the other files and evaluates.

    Args:
      config: the run config (validated here again).
      workdir: the run folder; created if missing.

    Returns:
      The results dict written to results.json.

    Raises:
      ConfigError: a bad config value. RunMismatch: the workdir holds a different run.
      NothingTrained: every series was skipped (results.json still lists why).
    """
    config_lib.validate(config)
    started = time.time()
    primary = _is_primary()
    os.makedirs(workdir, exist_ok=True)
    preps, skipped = _prepare_all(config)
    if not preps:
        if primary:
            writers.write_config(workdir, config)
            writers.write_results(workdir, _results(config, {}, skipped, started, []))
        raise NothingTrained(f"no series could be trained; skipped: {skipped}")
    run, plan = _make_run(config, workdir, preps, coin_mesh())  # refuses a different run
    if primary:
        writers.write_config(workdir, config)
    entries = {}
    try:
        for g, group_preps in enumerate(plan):
            group = f"group-{g:03d}"
            finished = run.ledger.finished(group)
            if finished is None:
                finished = _train_group(run, group, group_preps)
            else:
                logging.info("%s already finished in %s; skipping it", group, workdir)
                _reload_forecasts(run, group_preps)
            entries.update(finished)
    finally:
        if run.tensorboard:
            run.tensorboard.close()
    results = _results(config, entries, skipped, started, plan)
    if primary:
        writers.write_results(workdir, results)
        report.write_reports(workdir, results, config, forecasts=run.forecasts)
    _wait_for_all("cpbjax run finished")
    return results
