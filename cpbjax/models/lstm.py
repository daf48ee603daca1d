"""LSTM seq2seq with multi-head attention (model.name=lstm), torch's nn.LSTM parameterisation."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from cpbjax.models import layers, model_config, seq2seq


@dataclasses.dataclass(frozen=True, kw_only=True)
class LSTMConfig(seq2seq.RNNConfig):
    """config.model fields of the LSTM: hidden, num_layers, dropout, attention_heads."""

    attention_heads: int  # Heads of the decoder-over-encoder attention; hidden divides by it.

    @classmethod
    def check_rules(cls, group) -> None:
        super().check_rules(group)
        model_config.check_divides(group, "hidden", "attention_heads")


class LSTMCell(nn.RNNCellBase):
    """An LSTM cell laid out like torch.nn.LSTM: input AND hidden biases (8·h per layer).

    Why not nn.OptimizedLSTMCell: it has 4·h biases, and bolting the other 4·h on
    from outside would need a second code path around the cell; one fused
    [i, f, g, o] kernel per side with its bias is the same math as torch, keeps
    the reference parameter count, and loads torch weights as they are:
      i, f, g, o = σ, σ, tanh, σ of (W_i x + b_i + W_h h + b_h)
      c' = f ⊙ c + i ⊙ g,  h' = o ⊙ tanh(c')
    The carry is (c, h), float32; only the matmuls use the compute dtype.
    """

    features: int
    cfg: model_config.ModelConfig

    @nn.compact
    def __call__(self, carry, x_BI):
        c_BD, h_BD = carry
        gates = self._fused("input", x_BI, nn.initializers.lecun_normal()) + self._fused(
            "hidden", h_BD, nn.initializers.orthogonal()
        )
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c_BD = jax.nn.sigmoid(f) * c_BD + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_BD = jax.nn.sigmoid(o) * jnp.tanh(c_BD)
        return (c_BD, h_BD), h_BD

    def _fused(self, name, v, kernel_init):
        layer = layers.dense(self.cfg, 4 * self.features, kernel_init=kernel_init, name=name)
        return layer(v).astype(jnp.float32)

    @nn.nowrap
    def initialize_carry(self, rng, input_shape):
        del rng  # The state starts at zero, as in torch.
        zeros = jnp.zeros((*input_shape[:-1], self.features), jnp.float32)
        return zeros, zeros

    @property
    def num_feature_axes(self) -> int:
        return 1


class DecoderAttention(nn.Module):
    """Multi-head attention from one decoder output over all encoder outputs.

    The encoder-side keys and values are projected once, in `prepare`.
    """

    cfg: LSTMConfig

    def setup(self):
        self.mha = layers.Attention(self.cfg, self.cfg.hidden, self.cfg.attention_heads)

    def prepare(self, enc_BLD):
        return self.mha.project_kv(enc_BLD)

    def __call__(self, kv, query_BD):
        return self.mha(query_BD[:, None, :], *kv)[:, 0].astype(jnp.float32)


class LSTMSeq2Seq(seq2seq.RNNSeq2Seq):
    """2-layer LSTM encoder and decoder, hidden 256, 4-head attention; see RNNSeq2Seq."""

    cell_type = LSTMCell
    attention_type = DecoderAttention
