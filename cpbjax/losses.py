"""The training and validation loss of one coin's windows, in the normalised target space.

One function, `window_loss`, is what the train step minimises and what early stopping
watches, so the model is selected by the loss it was trained on (`train.loss`):
  mse      (y_hat - y)^2, the replaced system's loss;
  mae      |y_hat - y|, the evaluation's error measure;
  huber    optax.huber_loss with delta 1 (on scaled errors, see below);
  pinball  the quantile (pinball) loss summed over config.model.quantiles: a model
           with quantile outputs trains every quantile, the median included.
Column scaling (`train.loss_scale`):
  none         errors as they are; close and open, whose persistence errors are the
               largest, dominate the sum.
  persistence  each column's error is divided by that coin's mean absolute error of
               persistence (the last close) on its TRAIN windows (`stacking`'s
               `target_scale`), so every column weighs like its skill against
               persistence, the quantity the evaluation reports.
Shape letters (docs/design.md): B windows, H horizon, C OHLC targets, J quantile levels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

LOSSES = ("mse", "mae", "huber", "pinball")
LOSS_SCALES = ("none", "persistence")
HUBER_DELTA = 1.0  # in scaled units: one persistence MAE of the column


def _point_error(kind: str, r_BHC: jax.Array) -> jax.Array:
    if kind == "mse":
        return jnp.square(r_BHC)
    if kind == "mae":
        return jnp.abs(r_BHC)
    if kind == "huber":
        return optax.huber_loss(r_BHC, delta=HUBER_DELTA)
    raise ValueError(f"train.loss={kind!r} needs point forecasts: expected one of {LOSSES}")


def pinball(r_BHCJ: jax.Array, levels_J: tuple[float, ...]) -> jax.Array:
    """Pinball loss of forecast errors r = y_hat - y at each quantile level, [B, H, C, J].

    Under-forecasting (r < 0) costs q per unit, over-forecasting 1 - q.
    """
    q_J = jnp.asarray(levels_J, jnp.float32)
    return jnp.maximum(-r_BHCJ * q_J, r_BHCJ * (1.0 - q_J))


def window_loss(
    kind: str, y_hat, y_BHC: jax.Array, scale_C: jax.Array | None, levels_J=()
) -> jax.Array:
    """Mean loss of each window over its steps and columns, float32 [B].

    Args:
      kind: one of LOSSES.
      y_hat: forecasts [B, H, C], or [B, H, C, J] quantiles with kind "pinball".
      y_BHC: targets [B, H, C].
      scale_C: per-column divisors of the error (None: unscaled).
      levels_J: the quantile levels of y_hat's last axis (pinball only).
    """
    r = y_hat.astype(jnp.float32) - (y_BHC[..., None] if kind == "pinball" else y_BHC)
    if scale_C is not None:
        r = r / (scale_C[:, None] if kind == "pinball" else scale_C)
    err = pinball(r, levels_J).sum(-1) if kind == "pinball" else _point_error(kind, r)
    return jnp.mean(err, axis=tuple(range(1, err.ndim)))
