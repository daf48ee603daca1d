"""The RNN encoder-decoder the GRU and the LSTM share (`RNNSeq2Seq`, `RNNConfig`), and the
teacher-forcing helpers of every autoregressive decoder (the transformer's too).

Shape suffixes: models/layers.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from cpbjax.models import heads, layers, model_config


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNConfig(model_config.ModelConfig):
    """Stacked-RNN encoder-decoder fields (config.model.hidden, .num_layers)."""

    hidden: int  # State width of every encoder and decoder layer.
    num_layers: int  # Stacked layers in the encoder and in the decoder.


def uses_teacher(train: bool, y_BHC: jax.Array | None, ratio: float | jax.Array) -> bool:
    """Whether teacher forcing can happen; static, so eval traces carry no coin flips."""
    never = isinstance(ratio, (int, float)) and ratio == 0
    return train and y_BHC is not None and not never


def scanned_targets(cfg: model_config.ModelConfig, batch: int, y_BHC, teacher: bool) -> jax.Array:
    """The true candles time-major [H, B, C] for the decoding scan; zeros when unused."""
    if teacher:
        return jnp.swapaxes(y_BHC, 0, 1).astype(jnp.float32)
    return jnp.zeros((cfg.horizon, batch, cfg.num_targets), jnp.float32)


def teacher_force(
    module: nn.Module, y_hat_BC: jax.Array, y_true_BC: jax.Array, ratio: float | jax.Array
) -> jax.Array:
    """The next decoder input: the true candle with probability `ratio`, else the forecast.

    One on-device draw per decoding step for the whole batch, as the replaced
    system drew one per step; each coin has its own "teacher" stream under vmap.
    """
    coin = jax.random.bernoulli(module.make_rng("teacher"), ratio)
    return jnp.where(coin, y_true_BC, y_hat_BC)


class RNNSeq2Seq(nn.Module):
    """Stacked-RNN encoder, attention over its outputs, and a stacked-RNN decoder.

    Subclasses name a `cell_type` (an nn.RNNCellBase built as cell_type(hidden, cfg))
    and an `attention_type` (built as
    attention_type(cfg), with `prepare(enc_BLD) -> memory` computed once and
    `__call__(memory, q_BD) -> ctx_BD`).
    Dropout sits between stacked layers, as in torch's nn.GRU / nn.LSTM.
    Autoregressive: the decoder starts from the encoder's final per-layer states
    and a zero candle, and is fed its previous forecast (or, under teacher forcing,
    the true candle); the head maps [decoder output; context] to C values per step.
    Direct: the head maps [encoder's last output; context] to all H·C values at once.
    """

    cfg: RNNConfig
    cell_type: ClassVar[Any]
    attention_type: ClassVar[Any]

    def setup(self):
        cfg = self.cfg
        self.encoder = [self._encoder_layer() for _ in range(cfg.num_layers)]
        autoregressive = cfg.decoding == "autoregressive"
        if autoregressive:
            self.decoder = [self.cell_type(cfg.hidden, cfg) for _ in range(cfg.num_layers)]
        self.attention = self.attention_type(cfg)
        self.head_hidden = layers.dense(cfg, cfg.hidden)
        out = cfg.num_targets if autoregressive else cfg.horizon * cfg.num_targets
        self.head_out = layers.dense(cfg, out, kernel_init=heads.head_init(cfg))
        self.price_scale = layers.PriceScale(cfg)
        self.output = heads.ForecastOutput(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(
        self,
        x_BLF,
        y_BHC=None,
        train: bool = False,
        teacher_forcing=0.0,
    ):
        """Forecasts H candles from windows.

        Args:
          x_BLF: input windows [B, L, F].
          y_BHC: true targets [B, H, C], used only for teacher forcing (train=True);
            None at evaluation.
          train: enables dropout and teacher forcing (needs rngs "dropout", "teacher").
          teacher_forcing: per-step probability (float or traced scalar) of feeding
            the true previous candle instead of the forecast.

        Returns:
          Forecasts [B, H, C] float32, in the normalised space of the targets.

        Raises:
          ValueError: window shapes that do not match the config.
        """
        cfg = self.cfg
        model_config.check_inputs(cfg, x_BLF, y_BHC)
        enc_BLD, states = self._encode(x_BLF, train)
        memory = self.attention.prepare(enc_BLD)
        if cfg.decoding == "direct":
            last_BD = enc_BLD[:, -1]
            y_flat = self._head(last_BD, self.attention(memory, last_BD))  # [B, H * C]
            raw = y_flat.reshape(-1, cfg.horizon, cfg.num_targets)
            return self.output(raw, x_BLF)
        return self._autoregressive(states, memory, y_BHC, train, teacher_forcing)

    def _encoder_layer(self) -> nn.Module:
        return nn.RNN(self.cell_type(self.cfg.hidden, self.cfg), return_carry=True)

    def _encode(self, x_BLF, train):
        h_BLD = self.price_scale(x_BLF)
        states = []
        for i, rnn in enumerate(self.encoder):
            state, h_BLD = rnn(h_BLD)
            states.append(state)
            if i + 1 < len(self.encoder):
                h_BLD = self.drop(h_BLD, deterministic=not train)
        return h_BLD, states

    def _head(self, h_BD, ctx_BD):
        return self.head_out(nn.relu(self.head_hidden(jnp.concatenate([h_BD, ctx_BD], -1))))

    def _autoregressive(self, states, memory, y_BHC, train, teacher_forcing):
        cfg = self.cfg
        teacher = uses_teacher(train, y_BHC, teacher_forcing)
        batch = jax.tree_util.tree_leaves(states)[0].shape[0]
        y_true_HBC = scanned_targets(cfg, batch, y_BHC, teacher)

        def step(mdl, carry, y_true_BC, consts):
            states, in_BC = carry
            h_BD, new_states = in_BC, []
            for i, cell in enumerate(mdl.decoder):
                state, h_BD = cell(states[i], h_BD)
                new_states.append(state)
                if i + 1 < len(mdl.decoder):
                    h_BD = mdl.drop(h_BD, deterministic=not train)
            y_hat_BC = mdl._head(h_BD, mdl.attention(consts[0], h_BD)).astype(jnp.float32)
            in_BC = teacher_force(mdl, y_hat_BC, y_true_BC, consts[1]) if teacher else y_hat_BC
            return (new_states, in_BC), y_hat_BC

        scan = nn.scan(
            step,
            variable_broadcast="params",
            split_rngs={"params": False, "dropout": True, "teacher": True},
            in_axes=(0, nn.broadcast),
        )
        in_BC = jnp.zeros((batch, cfg.num_targets), jnp.float32)
        ratio = jnp.asarray(teacher_forcing, jnp.float32)
        _, y_hat_HBC = scan(self, (states, in_BC), y_true_HBC, (memory, ratio))
        return jnp.swapaxes(y_hat_HBC, 0, 1)
