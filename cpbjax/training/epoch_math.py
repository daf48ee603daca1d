"""`EpochMath`: the functions of an epoch that cpbjax/training/group.py and streaming.py run.

Two modules implement it: cpbjax/training/step.py (a model per coin, train.share=series)
and cpbjax/training/pooled.py (one model for every coin, train.share=pooled), over the
same state layout. A module satisfies the protocol structurally, by defining each member
with the same parameters; tests/epoch_math_test.py checks both, so a change to one
member's parameters in one module is caught before a program is traced. Each module's
`train_pass` is its own (only its `run_epoch` calls it), so it is not a member.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: step.py and pooled.py import nothing from here
    import jax

    from cpbjax.data import stacking
    from cpbjax.training import batching, epoch_spec, validation


class EpochMath(Protocol):
    """What the compiled programs call on the epoch math; every function is pure and
    traced under jit (shard_mapped per device, or one global program where the
    `sharing.Sharing` says so)."""

    def fresh_state(
        self, spec: epoch_spec.EpochSpec, keys_K2, arrays: stacking.GroupArrays
    ) -> epoch_spec.GroupState:
        """The fresh state, the group's init: best_val inf, no bar yet (a baseline's is set
        by the first epoch's `finish_epoch`)."""

    def with_bar(self, state: epoch_spec.GroupState, val_sum_K, val_n_K) -> epoch_spec.GroupState:
        """`state` whose bar is the val loss summed per coin (val_sum_K over val_n_K)."""

    def restart(self, spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, params):
        """A fresh `state` starting from trained `params` [K, ...] (train.init_from)."""

    def start_from(
        self, spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, params, arrays
    ) -> epoch_spec.GroupState:
        """`restart` from `params`, their val loss the bar."""

    def train_steps(
        self,
        spec: epoch_spec.EpochSpec,
        state: epoch_spec.GroupState,
        arrays: stacking.GroupArrays,
        trained: epoch_spec.TrainPass,
        xs,
        windows_of: Callable[[jax.Array], batching.StepWindows],
    ) -> epoch_spec.TrainPass:
        """`trained` after the train steps `xs` (all of an epoch's, or a streamed chunk's)."""

    def run_epoch(self, spec: epoch_spec.EpochSpec, state: epoch_spec.GroupState, arrays):
        """One epoch on device-resident data: (new state, metrics of step.EPOCH_METRICS)."""

    def finish_epoch(
        self,
        spec: epoch_spec.EpochSpec,
        state: epoch_spec.GroupState,
        trained: epoch_spec.TrainPass,
        val: validation.ValPass,
        best: validation.ValPass,
    ):
        """Early stopping after the train pass `trained`, given the val passes of its params
        and of the best params before it (at the first epoch also a baseline's bar):
        (new state, metrics)."""
