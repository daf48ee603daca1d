"""Early stopping, in one place: which epoch is kept, when a coin stops, what it keeps.

The contract (per coin; a pooled model's coins share one record, cpbjax/training/pooled.py):
- An epoch is kept only if its val loss beats the best by more than `train.min_delta`
  standard errors of the paired val gain (`bar`, with `gain_se` or `pooled_gain_se`).
- `train.patience` counts the epochs without such an improvement; at patience the coin
  stops training.
- The kept params are the best epoch's. Epoch 0 is the untrained model: with
  model.baseline it is the baseline, whose val loss is the first best (step.first_bar);
  without one the best starts at inf, so the first finite epoch is kept.
- A coin whose train loss, gradient or val loss is not finite diverges: it stops and
  goes back to its kept params.
cpbjax/training/step.py runs the passes (cpbjax/training/validation.py the epoch's val losses, and the kept
params' for the standard error) and ends each epoch with `judge` and `kept`.

The bar: `train.min_delta` sets a margin the val loss must beat the best by, in standard errors
of the val gain. The gain is the mean over val windows of the paired difference
(candidate's loss - best model's loss, window by window), and its standard error is
Newey-West's with Bartlett weights over H - 1 lags, since windows n and n + l share
H - l target candles (the Diebold-Mariano convention, cpbjax/score/metrics.py). So the bar
shrinks where the val loss is measured on more windows: a pooled model, judged on every
series' windows, needs a smaller gain than a per-series model to leave its best. It won
out of sample for both train.share modes over a share of the best val loss and a margin
in the loss's units (experiments/early_stopping_margin). min_delta=0 (the
replaced system's, no margin): any lower val loss improves.

Shape letters (docs/design.md): K coins, N windows of a split (padded to S x B).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from cpbjax.training.epoch_spec import EpochSpec, GroupState


def bar(min_delta: float, best_K: jnp.ndarray, gain_se_K: jnp.ndarray) -> jnp.ndarray:
    """The val loss an epoch must go below to improve on `best_K` (float32 [K]).

    A margin keeps a model from leaving its best (the untrained baseline, first) on a
    val gain the size of the val split's noise, which out of sample costs error
    (experiments/pooled_or_series). inf stays inf, whatever the
    standard error.
    """
    return jnp.where(jnp.isinf(best_K), best_K, best_K - min_delta * gain_se_K)


def newey_west_se(sum_KN: jnp.ndarray, count_KN: jnp.ndarray, lag: int) -> jnp.ndarray:
    """Standard error of each row's mean, float32 [K], from per-position sums (K rows: coins, or
    one row of a pooled model's sums over coins).

    Args:
      sum_KN: the values summed at each position n (0 where there is none).
      count_KN: how many values each sum holds.
      lag: the last autocovariance lag counted, with Bartlett weight 1 - gap / (lag + 1).
    """
    n_K = jnp.sum(count_KN, axis=1)
    mean_K = jnp.sum(sum_KN, axis=1) / jnp.maximum(n_K, 1)
    # Centred totals: a position of c values deviates by its sum - c * mean.
    dev_KN = sum_KN - mean_K[:, None] * count_KN
    var_K = jnp.sum(dev_KN * dev_KN, axis=1)
    for gap in range(1, min(lag, sum_KN.shape[1] - 1) + 1):
        weight = 1.0 - gap / (lag + 1)
        var_K = var_K + 2.0 * weight * jnp.sum(dev_KN[:, gap:] * dev_KN[:, :-gap], axis=1)
    return jnp.sqrt(jnp.maximum(var_K, 0.0)) / jnp.maximum(n_K, 1)


def gain_se(new_KN, best_KN, mask_KN, lag: int) -> jnp.ndarray:
    """Each coin's standard error of its mean val gain, float32 [K].

    new_KN, best_KN: per-window val losses of the candidate and of the best model;
    mask_KN: bool, the valid windows.
    """
    d_KN = jnp.where(mask_KN, new_KN - best_KN, 0.0)
    return newey_west_se(d_KN, mask_KN.astype(jnp.float32), lag)


def pooled_gain_se(new_KN, best_KN, mask_KN, take_K, lag: int) -> jnp.ndarray:
    """The standard error of the pooled mean val gain over the coins `take_K`, float32 [].

    Coins' windows at the same position n are summed before the autocovariances, so
    errors that move together across series (one market, the same hours for every
    series of an interval) count as the dependence they are, not as independent draws.
    """
    m_KN = mask_KN & take_K[:, None]
    d_N = jnp.sum(jnp.where(m_KN, new_KN - best_KN, 0.0), axis=0)
    count_N = jnp.sum(m_KN, axis=0).astype(jnp.float32)
    return newey_west_se(d_N[None], count_N[None], lag)[0]  # one row: [1, N]


def select(take_K: jax.Array, new, old):
    """Per-coin choice between two [K, ...] pytrees (take_K: bool [K])."""

    def pick(n, o):
        return jnp.where(take_K.reshape(take_K.shape + (1,) * (n.ndim - 1)), n, o)

    return jax.tree.map(pick, new, old)


class Verdict(NamedTuple):
    """One epoch's early-stopping verdict, per coin (bool or int32 [K])."""

    diverged_K: jax.Array  # trained this epoch and had a non-finite loss or gradient
    improved_K: jax.Array  # cleared the bar: this epoch's params become the kept ones
    bad_K: jax.Array  # epochs since the last improvement
    active_K: jax.Array  # still trains: not diverged and bad_K below patience


def judge(spec: EpochSpec, state: GroupState, nonfinite_K, val_K, gain_se_K) -> Verdict:
    """The verdict on the coins that trained this epoch (state.active).

    nonfinite_K: bool [K], a non-finite train loss or gradient; val_K: float32 [K], the
    val loss compared with state.best_val; gain_se_K: float32 [K], the standard error of
    val_K - best_val.
    """
    ran_K = state.active
    diverged_K = ran_K & (nonfinite_K | ~jnp.isfinite(val_K))
    bar_K = bar(spec.min_delta, state.best_val, gain_se_K)
    improved_K = ran_K & ~diverged_K & (val_K < bar_K)
    bad_K = jnp.where(improved_K, 0, state.bad_epochs + ran_K.astype(jnp.int32))
    active_K = ran_K & ~diverged_K & (bad_K < spec.patience)
    return Verdict(diverged_K, improved_K, bad_K, active_K)


def kept(state: GroupState, verdict: Verdict, params: Any, val_K, epoch) -> dict:
    """The GroupState fields early stopping owns after `epoch` (int32 []), whose trained
    params were `params` [K, ...] and val loss val_K: the kept params and their val loss
    and epoch, the patience count, and the stop and divergence flags. A diverged coin's
    params go back to its kept ones."""
    best_params = select(verdict.improved_K, params, state.best_params)
    return {
        "params": select(verdict.diverged_K, best_params, params),
        "best_params": best_params,
        "best_val": jnp.where(verdict.improved_K, val_K, state.best_val),
        "best_epoch": jnp.where(verdict.improved_K, epoch, state.best_epoch),
        "bad_epochs": verdict.bad_K,
        "active": verdict.active_K,
        "diverged": state.diverged | verdict.diverged_K,
        "diverged_epoch": jnp.where(verdict.diverged_K, epoch, state.diverged_epoch),
    }
