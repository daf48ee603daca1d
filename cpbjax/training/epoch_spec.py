"""The compiled epoch's types: its frozen spec (`EpochSpec`, built from a run config once),
the state it carries (`GroupState`) and the parts of a train pass (`StepResult`, `TrainPass`).

cpbjax/training/step.py's and cpbjax/training/pooled.py's traced functions read the spec,
never the config; batching, validation and early stopping read the state.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import optax
from flax import linen as nn
from flax import struct

from cpbjax import columns
from cpbjax.config import sweep_grid
from cpbjax.data import spec as data_spec
from cpbjax.data import stacking
from cpbjax.training import optimizer


@dataclasses.dataclass(frozen=True)
class EpochSpec:
    """Everything the compiled epoch reads, fixed when its program is built.

    Built once from the run config by `make_spec`, so the traced functions close over
    plain Python values and never see a mutable ConfigDict.
    """

    module: nn.Module  # the Flax Linen model of every coin
    tx: optax.GradientTransformation  # optimizer.make_optimizer (lr injected per step)
    schedule: optax.Schedule  # global step -> base learning rate
    lookback: int  # L
    horizon: int  # H
    num_features: int  # F
    batch_size: int  # B
    train_steps: int  # S of the train pass: ceil(padded train windows / B)
    val_steps: int  # S of the val pass
    teacher_forcing: float  # per-step probability of feeding the true candle
    patience: int  # early stopping: epochs without val improvement
    loss: str  # losses.LOSSES: minimised, and what the val loss measures
    scale_loss: bool  # train.loss_scale == "persistence": errors over target_scale
    baseline: str  # model.baseline: "vol_band" starts params at the fitted band
    min_delta: float  # an epoch improves only if it beats the best by more (`early_stopping.bar`)
    # train.share: "series" (a model per coin, cpbjax/training/step.py's epoch) or "pooled" (one model
    # for every coin: cpbjax/training/pooled.py's epoch over the same data and state layout).
    share: str = "series"
    # train.pooled_chunk: coins per gradient chunk of a pooled step; 0 = all K in one.
    pooled_chunk: int = 0
    # model.ensemble: Y members, each trained on its own loss (models/ensemble.py).
    members: int = 1
    # What the group's programs are built over besides the math (cpbjax/training/group.py):
    # the data's padded shapes, T, the swept hparams' names (GroupArrays.hparams), the
    # matmul precision and train.stream_chunk_steps (J; 0 = the device-resident epoch).
    data: data_spec.DataSpec | None = None
    t_max: int = 0
    hparams: tuple = ()
    matmul_precision: str = "default"
    stream_chunk_steps: int = 0


def make_spec(config, module: nn.Module, t_max: int | None = None) -> EpochSpec:
    """The EpochSpec of a run config (data, model, train, sweep, matmul_precision),
    its model, and its padded length T (stacking.padded_length; default data.max_candles)."""
    d, t = data_spec.make_spec(config.data), config.train
    t_max = d.max_candles if t_max is None else t_max
    hparams = sweep_grid.hparam_names(config)
    sizes = stacking.padded_sizes(d, t_max)
    train_steps = math.ceil(sizes["train"] / t.batch_size)
    members = config.model.ensemble
    return EpochSpec(
        module=module,
        tx=optimizer.make_optimizer(t, "weight_decay" in hparams, members=members),
        schedule=optimizer.make_schedule(t, optimizer.total_steps(t, train_steps)),
        lookback=d.lookback,
        horizon=d.horizon,
        num_features=len(columns.input_names(d)),
        batch_size=t.batch_size,
        train_steps=train_steps,
        val_steps=math.ceil(sizes["val"] / t.batch_size),
        teacher_forcing=t.teacher_forcing,
        patience=t.patience,
        loss=t.loss,
        scale_loss=t.loss_scale == "persistence",
        baseline=config.model.baseline,
        min_delta=t.min_delta,
        share=t.share,
        pooled_chunk=t.pooled_chunk,
        members=members,
        data=d,
        t_max=t_max,
        hparams=hparams,
        matmul_precision=config.matmul_precision,
        stream_chunk_steps=t.stream_chunk_steps,
    )


@struct.dataclass
class GroupState:
    """Everything a group needs to continue training; one Orbax checkpoint.

    All leaves except `epoch` carry the coin axis K first. Epoch numbers are 1-based;
    0 means "none yet".
    """

    params: Any  # Current Flax params [K, ...].
    opt_state: Any  # Optax state of `optimizer.make_optimizer` [K, ...].
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


class StepResult(NamedTuple):
    """One masked update of one coin."""

    params: Any
    opt_state: Any
    loss_sum: jax.Array  # forecast loss x windows trained on (0 if the update was not taken)
    num_windows: jax.Array  # int32: windows trained on
    nonfinite: jax.Array  # bool: an active coin's loss or gradient was not finite


class TrainPass(NamedTuple):
    """One epoch's train pass so far, per coin, in the state's layout ([K, ...] leaves)."""

    params: Any
    opt_state: Any
    loss_sum_K: jax.Array
    num_windows_K: jax.Array
    nonfinite_K: jax.Array

    def add(self, r: StepResult) -> TrainPass:
        """The pass after one more step: its params and opt state, its sums added."""
        return TrainPass(
            r.params,
            r.opt_state,
            self.loss_sum_K + r.loss_sum,
            self.num_windows_K + r.num_windows,
            self.nonfinite_K | r.nonfinite,
        )
