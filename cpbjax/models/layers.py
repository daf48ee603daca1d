"""Layers shared by the architectures: Dense with the configured precision, attention, and
the window's price scale (`PriceScale`, `window_range`).

Shape suffixes (the package's legend): B batch, L lookback, H horizon, F input features,
C targets (OHLC), D model width. Attention adds Q query positions,
P attended (key/value) positions, E heads and W head width (D / E); an RNN cell's
input width is I (F, D or C, by layer).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import band
from cpbjax.models import model_config

# Smallest window range divided by: a window of flat candles (range 0) keeps finite inputs,
# and its forecast is then the baseline (the head's output times about 0).
RANGE_FLOOR = 1e-6


def floored_range(sigma_B: jax.Array) -> jax.Array:
    """The window range [B] that window_scale=range divides by, floored at RANGE_FLOOR."""
    return jnp.maximum(sigma_B, RANGE_FLOOR)


class PriceScale(nn.Module):
    """The encoder's view of a window [B, L, F] (no params): with window_scale=range, its
    price columns divided by the window's EWMA log range (window_range); else as it is.

    Why: last_close prices are about 0.01 and their scale varies tenfold between windows,
    while the correction a baseline needs is proportional to that scale. A network with
    layer norms (the transformer) loses the scale; this puts inputs in range units and
    ForecastOutput multiplies the median back by the range (reversible instance scaling,
    as RevIN or NeuralForecast's per-window scalers). A module, so that `init_params`
    sees whether a model applies it.
    """

    cfg: model_config.ModelConfig

    def __call__(self, x_BLF: jax.Array) -> jax.Array:
        if self.cfg.window_scale == "none":
            return x_BLF
        sigma_B = floored_range(band.window_range(x_BLF, jnp)).astype(x_BLF.dtype)
        is_price_F = np.isin(np.arange(x_BLF.shape[-1]), self.cfg.price_columns)  # static
        return x_BLF / jnp.where(is_price_F, sigma_B[:, None], 1.0)[:, None, :]


def dense(cfg: model_config.ModelConfig, features: int, **kwargs) -> nn.Dense:
    """A Dense layer with float32 params, the configured compute dtype and matmul precision."""
    return nn.Dense(
        features,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        precision=cfg.precision,
        **kwargs,
    )


class Attention(nn.Module):
    """Multi-head dot-product attention with torch.nn.MultiheadAttention's parameters.

    q, k, v and output projections, all with biases: 4·D² + 4·D parameters.
    Keys and values come from `project_kv`, so callers can project a memory
    once and attend to it many times (the KV cache, the cross-attention).
    """

    cfg: model_config.ModelConfig
    features: int  # D.
    num_heads: int  # E; D must divide by it.
    dropout: float = 0.0  # On the attention weights, as in torch.

    def setup(self):
        self.query = dense(self.cfg, self.features)
        self.key = dense(self.cfg, self.features)
        self.value = dense(self.cfg, self.features)
        self.out = dense(self.cfg, self.features)
        self.weights_dropout = nn.Dropout(self.dropout)

    def _heads(self, x_BQD: jax.Array) -> jax.Array:
        return x_BQD.reshape(*x_BQD.shape[:-1], self.num_heads, -1)  # [B, Q, E, W]

    def project_kv(self, m_BPD: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys and values of a memory, each [B, P, E, W]."""
        return self._heads(self.key(m_BPD)), self._heads(self.value(m_BPD))

    def __call__(self, x_BQD, k_BPEW, v_BPEW, mask=None, train: bool = False) -> jax.Array:
        """Attends queries from x to projected keys/values; mask [..., Q, P] True = visible."""
        q_BQEW = self._heads(self.query(x_BQD))
        scale = 1.0 / math.sqrt(q_BQEW.shape[-1])
        prec = self.cfg.precision
        logits_BEQP = jnp.einsum("bqew,bpew->beqp", q_BQEW * scale, k_BPEW, precision=prec)
        logits_BEQP = logits_BEQP.astype(jnp.float32)  # Softmax in float32 under bfloat16.
        if mask is not None:
            logits_BEQP = jnp.where(mask, logits_BEQP, jnp.finfo(jnp.float32).min)
        w_BEQP = jax.nn.softmax(logits_BEQP, axis=-1).astype(self.cfg.compute_dtype)
        w_BEQP = self.weights_dropout(w_BEQP, deterministic=not train)
        y_BQEW = jnp.einsum("beqp,bpew->bqew", w_BEQP, v_BPEW, precision=prec)
        return self.out(y_BQEW.reshape(*y_BQEW.shape[:2], -1))
