"""The windows a training or val pass reads: each coin's device-resident series, its
windows gathered by their end candles, and the epoch's batches of window ends.

A step's windows reach the per-coin math (cpbjax/training/step.py, cpbjax/training/validation.py) as one of
two `StepWindows`: `SeriesWindows`, still to be sliced from the device-resident series
(the default path), or `HostWindows`, gathered on the host and streamed in
(train.stream_chunk_steps, cpbjax/training/streaming.py). Both give the same `Windows`, so both
paths run the same step.

Shape letters (docs/design.md): K coins, T candles, N windows of a split, S steps of an
epoch, B windows per step, L lookback, H horizon, F features, C OHLC targets.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cpbjax.data import stacking
from cpbjax.training.epoch_spec import EpochSpec, GroupState


class CoinData(NamedTuple):
    """The device-resident series of ONE coin that every per-coin function reads."""

    inputs_TF: jax.Array
    targets_TC: jax.Array
    anchor_T: jax.Array
    price_mask_F: jax.Array  # shared by the coins of a group
    target_scale_C: jax.Array  # the loss's per-column divisors (train.loss_scale)


# vmap axes of CoinData over the coins of a GroupArrays.
COIN_DATA_AXES = CoinData(0, 0, 0, None, 0)


def coin_data(arrays: stacking.GroupArrays) -> CoinData:
    return CoinData(
        arrays.inputs,
        arrays.targets,
        arrays.anchor,
        arrays.price_mask,
        arrays.target_scale,
    )


class Windows(NamedTuple):
    """B windows of one coin (sliced on the device or gathered on the host)."""

    x_BLF: jax.Array  # normalised inputs
    y_BHC: jax.Array  # normalised OHLC targets


def gather_windows(spec: EpochSpec, data: CoinData, ends_B: jax.Array) -> Windows:
    """The windows of ONE coin ending at ends_B (int32 [B])."""
    source = stacking.WindowSource(
        data.inputs_TF, data.targets_TC, data.anchor_T, data.price_mask_F
    )
    x_BLF, y_BHC = stacking.gather(source, ends_B, spec.lookback, spec.horizon)
    return Windows(x_BLF, y_BHC)


class SeriesWindows(NamedTuple):
    """A step's B windows of ONE coin, still to be sliced from its device-resident series."""

    data: CoinData
    ends_B: jax.Array  # int32 [B] window ends

    def gathered(self, spec: EpochSpec) -> Windows:
        return gather_windows(spec, self.data, self.ends_B)

    @property
    def target_scale_C(self) -> jax.Array:
        return self.data.target_scale_C

    def coin_axes(self) -> SeriesWindows:
        """vmap axes of K coins' SeriesWindows (the price mask is shared)."""
        return SeriesWindows(COIN_DATA_AXES, 0)


class HostWindows(NamedTuple):
    """A step's B windows of ONE coin, gathered on the host (cpbjax/training/streaming.py)."""

    windows: Windows
    target_scale_C: jax.Array  # [C] the loss's per-column divisors, as in CoinData

    def gathered(self, spec: EpochSpec) -> Windows:
        return self.windows

    def coin_axes(self) -> HostWindows:
        """vmap axes of K coins' HostWindows (every leaf has the coin axis)."""
        return HostWindows(Windows(0, 0), 0)


StepWindows = SeriesWindows | HostWindows


def batches(spec: EpochSpec, ends_KN, mask_KN, num_steps: int, keys_K=None):
    """[S, K, B] window ends and masks; shuffled per coin (valid first) if keys_K given."""
    if keys_K is not None:

        def shuffle(key, ends_N, mask_N):
            u_N = jnp.where(mask_N, jax.random.uniform(key, mask_N.shape), 2.0)
            order_N = jnp.argsort(u_N)  # Valid windows in random order, padding last.
            return ends_N[order_N], mask_N[order_N]

        ends_KN, mask_KN = jax.vmap(shuffle)(keys_K, ends_KN, mask_KN)
    k, n = ends_KN.shape
    pad = num_steps * spec.batch_size - n
    ends_KN = jnp.pad(ends_KN, ((0, 0), (0, pad)), constant_values=spec.lookback - 1)
    mask_KN = jnp.pad(mask_KN, ((0, 0), (0, pad)))
    # [K, S*B] -> [K, S, B] -> [S, K, B]: scan over S, vmap over K.
    to_skb = lambda a: a.reshape(k, num_steps, spec.batch_size).swapaxes(0, 1)
    return to_skb(ends_KN), to_skb(mask_KN)


def epoch_keys(state: GroupState):
    """This epoch's keys of every coin: (shuffle keys, step keys), uint32 [K, 2] each."""
    epoch_keys_K = jax.vmap(jax.random.fold_in, (0, None))(state.key, state.epoch)
    pair_K22 = jax.vmap(jax.random.split)(epoch_keys_K)
    return pair_K22[:, 0], pair_K22[:, 1]


def train_batches(spec: EpochSpec, state: GroupState, arrays: stacking.GroupArrays):
    """This epoch's train batches, shuffled per coin: (ends, mask) [S, K, B]."""
    shuffle_keys_K, _ = epoch_keys(state)
    return batches(spec, arrays.train_ends, arrays.train_mask, spec.train_steps, shuffle_keys_K)


def val_batches(spec: EpochSpec, arrays: stacking.GroupArrays):
    """The val pass's batches, in val_ends order: (ends, mask) [S, K, B]."""
    return batches(spec, arrays.val_ends, arrays.val_mask, spec.val_steps)
