"""The frozen spec of the compiled epoch (`EpochSpec`), built from a run config once.

cpbjax/training/step.py's and cpbjax/training/pooled.py's traced functions read it, never the config.
"""

from __future__ import annotations

import dataclasses
import math

import optax
from flax import linen as nn

from cpbjax.config import sweep_grid
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


def make_spec(config, module: nn.Module, t_max: int | None = None) -> EpochSpec:
    """The EpochSpec of a run config (data, model, train), its model, and its
    padded length T (stacking.padded_length; default data.max_candles)."""
    d, t = config.data, config.train
    sizes = stacking.padded_sizes(d, t_max)
    train_steps = math.ceil(sizes["train"] / t.batch_size)
    members = config.model.ensemble
    return EpochSpec(
        module=module,
        tx=optimizer.make_optimizer(
            t, "weight_decay" in sweep_grid.hparam_names(config), members=members
        ),
        schedule=optimizer.make_schedule(t, optimizer.total_steps(t, train_steps)),
        lookback=d.lookback,
        horizon=d.horizon,
        num_features=len(d.features),
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
    )
