"""The training and validation loss of one coin's windows, in the normalised target space.

One function, `window_loss`, is what the train step minimises and what early stopping
watches, so the model is selected by the loss it was trained on (`train.loss`):
  mse      (y_hat - y)^2, the replaced system's loss;
  mae      |y_hat - y|, the evaluation's error measure.
Column scaling (`train.loss_scale`):
  none         errors as they are; close and open, whose persistence errors are the
               largest, dominate the sum.
  persistence  each column's error is divided by that coin's mean absolute error of
               persistence (the last close) on its TRAIN windows (`stacking`'s
               `target_scale`), so every column weighs like its skill against
               persistence, the quantity the evaluation reports.
Shape letters (docs/design.md): B windows, H horizon, C OHLC targets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cpbjax.config.check import LOSSES


def window_loss(kind: str, y_hat_BHC, y_BHC: jax.Array, scale_C: jax.Array | None) -> jax.Array:
    """Mean loss of each window over its steps and columns, float32 [B].

    Args:
      kind: one of LOSSES.
      y_hat_BHC: forecasts [B, H, C].
      y_BHC: targets [B, H, C].
      scale_C: per-column divisors of the error (None: unscaled).
    """
    r_BHC = y_hat_BHC.astype(jnp.float32) - y_BHC
    if scale_C is not None:
        r_BHC = r_BHC / scale_C
    if kind == "mse":
        err_BHC = jnp.square(r_BHC)
    elif kind == "mae":
        err_BHC = jnp.abs(r_BHC)
    else:
        raise ValueError(f"train.loss={kind!r} is not allowed: expected one of {LOSSES}")
    return jnp.mean(err_BHC, axis=(1, 2))
