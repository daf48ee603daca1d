"""GRU seq2seq with simple attention pooling (model.name=gru), torch's nn.GRU parameterisation."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from cpbjax.models import layers, model_config, seq2seq


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRUConfig(seq2seq.RNNConfig):
    """config.model fields of the GRU: hidden, num_layers, dropout."""


class GRUCell(nn.RNNCellBase):
    """A GRU cell laid out like torch.nn.GRU: input AND hidden biases for all three gates.

    flax's nn.GRUCell has 4·h biases (none on the hidden side of r and z); torch
    has 6·h, and the reference parameter count (and loading torch weights) needs
    torch's layout. Gate order in the fused kernels is r, z, n:
      r = σ(W_ir x + b_ir + W_hr h + b_hr),  z = σ(W_iz x + b_iz + W_hz h + b_hz)
      n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)),  h' = (1 - z) ⊙ n + z ⊙ h
    Gates and state are float32; only the matmuls use the compute dtype.
    """

    features: int
    cfg: model_config.ModelConfig

    @nn.compact
    def __call__(self, h_BD, x_BI):
        xr, xz, xn = jnp.split(
            self._fused("input", x_BI, nn.initializers.lecun_normal()), 3, axis=-1
        )
        hr, hz, hn = jnp.split(self._fused("hidden", h_BD, nn.initializers.orthogonal()), 3, -1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h_BD = (1.0 - z) * n + z * h_BD
        return h_BD, h_BD

    def _fused(self, name, v, kernel_init):
        layer = layers.dense(self.cfg, 3 * self.features, kernel_init=kernel_init, name=name)
        return layer(v).astype(jnp.float32)

    @nn.nowrap
    def initialize_carry(self, rng, input_shape):
        del rng  # The state starts at zero, as in torch.
        return jnp.zeros((*input_shape[:-1], self.features), jnp.float32)

    @property
    def num_feature_axes(self) -> int:
        return 1


class PoolingAttention(nn.Module):
    """The replaced system's "simple attention": softmax(Dense(h→1)) pooling over time.

    The context does not depend on the decoder state, so it is computed once.
    """

    cfg: seq2seq.RNNConfig

    @nn.compact
    def prepare(self, enc_BLD):
        score_BL = layers.dense(self.cfg, 1, name="score")(enc_BLD)[..., 0]
        w_BL = jax.nn.softmax(score_BL.astype(jnp.float32), axis=-1)
        return jnp.einsum("bl,bld->bd", w_BL, enc_BLD.astype(jnp.float32))

    def __call__(self, context_BD, query_BD):
        del query_BD  # Pooling is query-free.
        return context_BD


class GRUSeq2Seq(seq2seq.RNNSeq2Seq):
    """2-layer GRU encoder and decoder, hidden 128, simple attention; see RNNSeq2Seq."""

    cell_type = GRUCell
    attention_type = PoolingAttention
