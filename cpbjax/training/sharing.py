"""`Sharing`: what train.share decides, answered in one place.

train.share is "series" (a model per coin: cpbjax/training/step.py's epoch) or "pooled"
(ONE model trained on every coin's windows: cpbjax/training/pooled.py's epoch over the
same state layout). Every module that behaves differently under the two asks the
`Sharing` of the run (`from_config` of a config, `of` of an EpochSpec's value) a
question by name, never the string: the plan, the group programs, compaction, the
memory check's advice, the run log, the report's plots, train.init_from, and a kept
model's forecasts of series it never saw. Only the config's value check
(cpbjax/config/check.py) and its rules on train.pooled_chunk and train.compact_groups
(cpbjax/config_rules.py, a leaf) name the values; tests/epoch_math_test.py checks them
against `chunked_gradient` and `compactable`.
"""

from __future__ import annotations

import dataclasses

from cpbjax.training import epoch_math, pooled, step


@dataclasses.dataclass(frozen=True)
class Sharing:
    """One train.share strategy; `SERIES` and `POOLED` are the two."""

    name: str  # the train.share value, as config.json and results.json's "share" hold it
    math: epoch_math.EpochMath  # the epoch's functions: the step or the pooled module
    # Every coin holds the same params: a kept model forecasts series the run never
    # trained (zero_shot.py), and a run may start only from such a source's one model.
    one_model: bool
    # Every series trains in one group (its K padded to the devices): there is no
    # train.group_size to lower.
    one_group: bool
    # The model learns from every series' windows, purged across series
    # (cpbjax/data/pooling.py), training-data-only series (data.split_dates) among them.
    pools_windows: bool
    # The init (and train.init_from's start) reads every coin: one global program that
    # XLA partitions, not a shard_mapped one per device.
    global_init: bool
    # One gradient over every coin's windows, which train.pooled_chunk may split.
    chunked_gradient: bool
    # What early stopping judged besides each coin's val loss: metrics.jsonl's key of it
    # (the same on every coin that trains), None where each coin is judged on its own.
    judged_val_key: str | None
    val_label: str  # how the loss plots name a kept untrained baseline's val loss

    @property
    def compactable(self) -> bool:
        """Whether a group's stopped coins may leave it for a smaller program
        (cpbjax/training/compaction.py): not a group of one model, whose coins stop together."""
        return not self.one_model


SERIES = Sharing(
    name="series",
    math=step,
    one_model=False,
    one_group=False,
    pools_windows=False,
    global_init=False,
    chunked_gradient=False,
    judged_val_key=None,
    val_label="val",
)
POOLED = Sharing(
    name="pooled",
    math=pooled,
    one_model=True,
    one_group=True,
    pools_windows=True,
    global_init=True,
    chunked_gradient=True,
    judged_val_key="pooled_val_loss",
    val_label="pooled val",
)
BY_NAME = {s.name: s for s in (SERIES, POOLED)}  # config/check.py's SHARES, in order


def of(share: str) -> Sharing:
    """The Sharing of a train.share value (already checked by the config)."""
    return BY_NAME[share]


def from_config(train_cfg) -> Sharing:
    """The Sharing of a run's train config (`config.train`)."""
    return of(train_cfg.share)
