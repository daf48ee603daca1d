"""The val pass: train.loss of every val window of every coin, under the params given.

Early stopping reads it twice per epoch (the epoch's params and the kept ones, whose
paired window losses give the standard error of the gain, cpbjax/training/early_stopping.py), and
the init once (an untrained baseline's or a start's val loss is the bar). `val_steps` is
the scan over the val batches; its windows are sliced from the device-resident series
(`val_pass`) or streamed from the host in chunks (cpbjax/training/streaming.py), the same math.

Shape letters (docs/design.md): K coins, N windows of a split (padded to S x B), S steps,
B windows per step, H horizon, C OHLC targets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cpbjax.data import stacking
from cpbjax.training import batching, epoch_spec, losses


def forecast_loss(
    spec: epoch_spec.EpochSpec, y_hat_BHC, y_BHC: jax.Array, target_scale_C: jax.Array
) -> jax.Array:
    """train.loss of each window's forecast, [B]."""
    scale_C = target_scale_C if spec.scale_loss else None
    return losses.window_loss(spec.loss, y_hat_BHC, y_BHC, scale_C)


def coin_val_losses(spec: epoch_spec.EpochSpec, params, w: batching.StepWindows, mask_B):
    """train.loss of each val window of ONE coin, float32 [B] (0 where mask_B is False)."""
    windows = w.gathered(spec)
    y_hat_BHC = spec.module.apply({"params": params}, windows.x_BLF, None, train=False)
    err_B = forecast_loss(spec, y_hat_BHC, windows.y_BHC, w.target_scale_C)
    return jnp.where(mask_B, err_B, 0.0)


def mean_K(sum_K: jax.Array, n_K: jax.Array) -> jax.Array:
    """The masked mean val loss per coin, float32 [K] (NaN for a coin without windows)."""
    return jnp.where(n_K > 0, sum_K / jnp.maximum(n_K, 1), jnp.nan)


class ValPass(NamedTuple):
    """One model's val pass, per coin."""

    sum_K: jax.Array  # float32 [K]: summed val loss over the valid windows
    n_K: jax.Array  # int32 [K]: valid windows
    loss_KN: jax.Array  # float32 [K, S*B]: each window's loss (0 where mask_KN is False)
    mask_KN: jax.Array  # bool [K, S*B]: the val windows in val_ends order, then padding

    def mean_K(self) -> jax.Array:
        """The masked mean val loss per coin, float32 [K] (NaN for a coin without windows)."""
        return mean_K(self.sum_K, self.n_K)


def zero_sums(k: int):
    """(summed loss float32 [K], windows int32 [K]) before the first val step."""
    return jnp.zeros((k,), jnp.float32), jnp.zeros((k,), jnp.int32)


def val_steps(
    spec: epoch_spec.EpochSpec,
    params,
    sums,
    xs,
    windows_of: Callable[[jax.Array], batching.StepWindows],
):
    """The val steps `xs` of every coin's `params` [K, ...]: (sums, each window's loss
    float32 [S, K, B]).

    Args:
      sums: (summed loss float32 [K], windows int32 [K]) before these steps (`zero_sums`).
      xs: (each step's part of the windows [S, K, ...], mask bool [S, K, B]): all the
        val steps, or one streamed chunk of them.
      windows_of: a step's part [K, ...] -> that step's StepWindows of the K coins.
    """

    def body(carry, xs):
        part, mask_KB = xs
        w = windows_of(part)
        losses_KB = jax.vmap(
            lambda p, w, m: coin_val_losses(spec, p, w, m), in_axes=(0, w.coin_axes(), 0)
        )
        err_KB = losses_KB(params, w, mask_KB)
        return (carry[0] + jnp.sum(err_KB, axis=1), carry[1] + jnp.sum(mask_KB, axis=1)), err_KB

    return jax.lax.scan(body, sums, xs)


def val_result(sums, err_SKB: jax.Array, mask_SKB: jax.Array) -> ValPass:
    """The ValPass of `val_steps`' sums and window losses over all the val steps."""
    k = err_SKB.shape[1]  # this device's coins
    # [S, K, B] -> [K, S*B]: each coin's windows in val_ends order.
    to_kn = lambda a: a.swapaxes(0, 1).reshape(k, -1)
    return ValPass(*sums, to_kn(err_SKB), to_kn(mask_SKB))


def val_pass(spec: epoch_spec.EpochSpec, params, arrays: stacking.GroupArrays) -> ValPass:
    """The val loss of every coin's params [K, ...], summed and window by window, each
    window sliced from the device-resident series."""
    ends_SKB, mask_SKB = batching.val_batches(spec, arrays)
    series = batching.coin_data(arrays)
    sums, err_SKB = val_steps(
        spec,
        params,
        zero_sums(ends_SKB.shape[1]),
        (ends_SKB, mask_SKB),
        lambda ends_KB: batching.SeriesWindows(series, ends_KB),
    )
    return val_result(sums, err_SKB, mask_SKB)


def val_sums(spec: epoch_spec.EpochSpec, params, arrays: stacking.GroupArrays):
    """Per coin: the summed val loss over its valid val windows, float32 [K], and their
    count, int32 [K]."""
    v = val_pass(spec, params, arrays)
    return v.sum_K, v.n_K
