"""Group compaction (train.compact_groups): live coins move to a program of their own size.

A vmapped epoch computes every coin of its program, the stopped ones too (their results
are thrown away), so a group whose coins have mostly stopped pays for all of them. Once
at most half of the program's coins still train, and the epochs saved should outweigh
compiling a new program, they move to a program of their own size (rounded up to a
multiple of the devices). The decision counts coins and epochs, not wall time, so a
seed's run compacts alike every time (`compaction_pays`). Each coin keeps its key, and
the schedule follows the shared epoch count, so every coin trains as before; only the
batch of coins computed together changes. The stopped coins' state no longer changes:
it waits on the host, and the group's full state is put back together only for a
checkpoint and at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from cpbjax import sharding
from cpbjax.training import epoch_spec
from cpbjax.training.group import GroupTrainer

# A program's compile, counted in epochs of that program (compile seconds / steady epoch
# seconds), as the wall-time rule this replaced measured it: on a 2-core CPU at K=8, a
# GRU compiled in 4.5-6.5 s and ran 1.8-2.8 s epochs, an LSTM compiled in 5-8 s and ran
# 11-21 s epochs (benchmarks/records/train_bench-20261124T0303Z.md), so 3 covers the
# worst. On an accelerator epochs take 0.05-1 s and compiles 16-43 s (docs/performance.md),
# so compaction there pays only with far more epochs ahead.
COMPILE_EPOCHS = {"cpu": 3.0}
ACCELERATOR_COMPILE_EPOCHS = 32.0


def compaction_pays(k: int, k_live: int, epochs_left: int, platform: str) -> bool:
    """Whether moving the live coins of a k-coin program to a k_live-coin one saves time.

    Decided from coins and epochs only, never from measured wall time, so that a seed's
    run compacts at the same epochs on every run and on a resume: metrics.jsonl records
    the coins computed, programs of other sizes may round differently in the last bits
    (tests allow 1e-5), and an early-stopping decision on such a tie could otherwise
    flip (docs/design.md, "Reliability").

    Args:
      k, k_live: the current and the new program's coins. The new epoch is assumed to
        take k_live / k of this one's (true on a CPU; on an accelerator with room to
        spare the epoch shrinks less, so this over-estimates the saving there).
      epochs_left: a lower bound on the epochs still to run (the most patience any live
        coin has left, at most the epochs left in the run).
      platform: the devices' platform ("cpu", "gpu", "tpu"): what a compile costs in
        epochs (COMPILE_EPOCHS).
    """
    compile_epochs = COMPILE_EPOCHS.get(platform, ACCELERATOR_COMPILE_EPOCHS)
    return epochs_left * (1 - k_live / k) > compile_epochs


class LiveCoins:
    """The coins of one group that still train, and the program that trains them."""

    def __init__(self, trainer_for: Callable[[int], GroupTrainer], preps: list, state, arrays):
        """Args:
        trainer_for: K -> the run's GroupTrainer of K coins (each size compiles once).
        preps: the group's PreparedSeries. state, arrays: its GroupState and GroupArrays
          on the devices, for the group's own K.
        """
        self.trainer_for, self.preps = trainer_for, preps
        self.group_trainer = self.trainer = trainer_for(len(state.active))
        self.state, self.arrays = state, arrays
        self.slots = np.arange(self.trainer.num_coins)  # group slot of each program coin
        self.frozen = None  # host GroupState of the whole group, once compacted
        self.frozen_metrics = None  # what the whole program would report for stopped coins
        self.epoch_seconds = []  # of the current program

    def run_epoch(self) -> dict:
        """One epoch of the live coins; host metrics for all K coins of the group."""
        t0 = time.monotonic()
        self.state, metrics = self.trainer.run_epoch(self.state, self.arrays)
        m = sharding.to_host(metrics)
        self.epoch_seconds.append(time.monotonic() - t0)
        if self.frozen is None:
            return m
        full = {"epoch": m["epoch"], "lr": m["lr"]}
        for name, stopped in self.frozen_metrics.items():
            full[name] = stopped.copy()
            full[name][self.slots] = m[name][: len(self.slots)]
        return full

    def maybe_compact(self, m: dict, patience: int, max_epochs: int) -> None:
        """Moves the live coins to a smaller program if at most half of this one's train
        and `compaction_pays`; `m` is the group's host metrics of the epoch just run."""
        k, devices = self.trainer.num_coins, self.trainer.mesh.size
        live = np.flatnonzero(m["active"][self.slots])  # positions in this program
        k_live = max(devices, -(-live.size // devices) * devices)
        if live.size == 0 or 2 * live.size > k or k_live >= k:
            return
        # Only now is the patience left worth a transfer (metrics do not carry it).
        bad = sharding.to_host(self.state.bad_epochs)[live]
        epochs_left = min(patience - bad.min(), max_epochs - int(m["epoch"]))
        # Every process holds the same metrics and patience, so all decide alike.
        platform = self.trainer.mesh.devices.flat[0].platform
        if compaction_pays(k, k_live, int(epochs_left), platform):
            self._move(self.slots[live], k_live)

    def _move(self, slots: np.ndarray, k_live: int) -> None:
        """Moves the coins of group slots `slots` to a program of k_live coins."""
        full = self._full_host()
        # Stopped coins fill the padding rows: inactive, they never train, and only the
        # live rows are ever written back.
        filler = np.flatnonzero(~full.active)[0]
        rows = np.concatenate([slots, np.full(k_live - slots.size, filler)])
        trainer = self.trainer_for(k_live)
        rows_only = jax.tree.map(lambda a: a[rows] if a.ndim else a, full)
        self.state = sharding.place(rows_only, trainer.state_sharding)
        self.arrays = trainer.stack([self.preps[i] for i in slots])
        k = self.trainer.num_coins
        self.trainer, self.slots, self.frozen, self.epoch_seconds = trainer, slots, full, []
        nan_K = np.full(full.active.shape, np.nan, np.float32)
        self.frozen_metrics = {
            "train_loss": nan_K,
            "val_loss": nan_K,
            "best_val_loss": full.best_val,
            "active": np.zeros_like(full.active),
            "diverged": full.diverged,
            "val_gain_se": nan_K,
            "stop_val_loss": nan_K,
            "improved": np.zeros_like(full.active),
        }
        logging.info(
            "%d of %d coins still train: moved them to a program of %d", slots.size, k, k_live
        )

    def full_state(self) -> epoch_spec.GroupState:
        """The whole group's state on the devices (this program's own while uncompacted)."""
        if self.frozen is None:
            return self.state
        return sharding.place(self._full_host(), self.group_trainer.state_sharding)

    def _full_host(self) -> epoch_spec.GroupState:
        """Host copy of the whole group's state: the frozen rows updated with the live ones."""
        host = sharding.to_host(self.state)
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
