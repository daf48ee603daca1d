"""Post-LN Transformer encoder-decoder (model.name=transformer) with a KV-cached decoder.

Parameters match torch.nn.Transformer{Encoder,Decoder}Layer (norm_first=False,
no final norms). Autoregressive decoding is causal, with a key/value cache, in
one nn.scan over the H steps; the replaced system re-ran an unmasked decoder
over the whole growing sequence each step (O(H²), uncacheable, slow to compile).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax.models import heads, layers, model_config, seq2seq


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(model_config.ModelConfig):
    """config.model fields of the Transformer."""

    d_model: int  # D, width of every attention and residual stream.
    num_heads: int  # E; d_model divides by it.
    num_encoder_layers: int
    num_decoder_layers: int
    ff_dim: int  # Feed-forward width (GELU).

    @classmethod
    def check_rules(cls, group) -> None:
        super().check_rules(group)
        model_config.check_divides(group, "d_model", "num_heads")


def sinusoid(length: int, width: int) -> np.ndarray:
    """The sinusoidal position table [length, width] of "Attention is all you need"."""
    pos_P1 = np.arange(length)[:, None]  # P positions (L or H)
    rate = np.exp(-np.log(10000.0) * np.arange(0, width, 2) / width)
    table = np.zeros((length, width + width % 2), np.float32)
    table[:, 0::2] = np.sin(pos_P1 * rate)
    table[:, 1::2] = np.cos(pos_P1 * rate)
    return table[:, :width]


def _layer_norm(cfg):
    # torch's LayerNorm epsilon; statistics are float32 even under bfloat16.
    return nn.LayerNorm(epsilon=1e-5, dtype=cfg.compute_dtype, param_dtype=jnp.float32)


class FeedForward(nn.Module):
    """linear1 → GELU (exact, as torch) → dropout → linear2."""

    cfg: TransformerConfig

    @nn.compact
    def __call__(self, h_BQD, train):
        h = nn.gelu(layers.dense(self.cfg, self.cfg.ff_dim, name="linear1")(h_BQD), False)
        h = nn.Dropout(self.cfg.dropout)(h, deterministic=not train)
        return layers.dense(self.cfg, self.cfg.d_model, name="linear2")(h)


class EncoderLayer(nn.Module):
    """Post-LN: x = norm1(x + SA(x)); x = norm2(x + FF(x)); dropout on each branch."""

    cfg: TransformerConfig

    def setup(self):
        cfg = self.cfg
        self.self_attn = layers.Attention(cfg, cfg.d_model, cfg.num_heads, cfg.dropout)
        self.ff = FeedForward(cfg)
        self.norm1 = _layer_norm(cfg)
        self.norm2 = _layer_norm(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(self, h_BLD, train):
        branch = self.self_attn(h_BLD, *self.self_attn.project_kv(h_BLD), train=train)
        h_BLD = self.norm1(h_BLD + self.drop(branch, deterministic=not train))
        return self.norm2(h_BLD + self.drop(self.ff(h_BLD, train), deterministic=not train))


class DecoderLayer(nn.Module):
    """Post-LN: norm1(x + SA(x)), norm2(x + CA(x, memory)), norm3(x + FF(x))."""

    cfg: TransformerConfig

    def setup(self):
        cfg = self.cfg
        self.self_attn = layers.Attention(cfg, cfg.d_model, cfg.num_heads, cfg.dropout)
        self.cross_attn = layers.Attention(cfg, cfg.d_model, cfg.num_heads, cfg.dropout)
        self.ff = FeedForward(cfg)
        self.norm1 = _layer_norm(cfg)
        self.norm2 = _layer_norm(cfg)
        self.norm3 = _layer_norm(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(self, h_BQD, cross_kv, train):
        """All Q positions at once, unmasked (the direct decoder's learned queries)."""
        return self._block(h_BQD, self.self_attn.project_kv(h_BQD), cross_kv, None, train)

    def step(self, h_B1D, cache, t, cross_kv, train):
        """Position t only: writes its key/value into cache ([B, H, E, W] each), attends ≤ t."""
        kv_t = self.self_attn.project_kv(h_B1D)
        cache = tuple(
            jax.lax.dynamic_update_slice_in_dim(c, new.astype(c.dtype), t, axis=1)
            for c, new in zip(cache, kv_t, strict=True)
        )
        visible_P = jnp.arange(cache[0].shape[1]) <= t
        return self._block(h_B1D, cache, cross_kv, visible_P, train), cache

    def _block(self, h_BQD, self_kv, cross_kv, mask, train):
        def residual(norm, h, branch):
            return norm(h + self.drop(branch, deterministic=not train))

        h_BQD = residual(self.norm1, h_BQD, self.self_attn(h_BQD, *self_kv, mask, train))
        h_BQD = residual(self.norm2, h_BQD, self.cross_attn(h_BQD, *cross_kv, train=train))
        return residual(self.norm3, h_BQD, self.ff(h_BQD, train))


class Transformer(nn.Module):
    """Encoder-decoder forecaster: windows [B, L, F] → forecasts [B, H, C] float32.

    The encoder input is input_proj(x) + sinusoidal positions. Autoregressive
    decoding starts from a zero token; each later token is the projection of the
    previous forecast (or, under teacher forcing, of the true previous candle),
    plus the position. When F == C a candle is an input row, so the input
    projection is shared (the reference parameter count assumes this); otherwise
    a separate target projection C → D embeds candles. Cross-attention keys and
    values of the encoder memory are computed once, before the decoding scan.
    Direct decoding feeds H learned query embeddings through the decoder at once.
    """

    cfg: TransformerConfig

    def setup(self):
        cfg = self.cfg
        self.input_proj = layers.dense(cfg, cfg.d_model)
        if cfg.num_features != cfg.num_targets:
            self.target_proj = layers.dense(cfg, cfg.d_model)
        self.encoder = [EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)]
        self.decoder = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
        self.output_proj = layers.dense(cfg, cfg.num_targets, kernel_init=heads.head_init(cfg))
        self.price_scale = layers.PriceScale(cfg)
        self.output = heads.ForecastOutput(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        if cfg.decoding == "direct":
            init = nn.initializers.normal(0.02)
            self.queries = self.param("queries", init, (cfg.horizon, cfg.d_model))

    def __call__(
        self,
        x_BLF,
        y_BHC=None,
        train: bool = False,
        teacher_forcing=0.0,
    ):
        """Forecasts H candles from windows: the model interface of every cpbjax model, with
        the arguments and returns documented on `seq2seq.RNNSeq2Seq.__call__`."""
        cfg = self.cfg
        model_config.check_inputs(cfg, x_BLF, y_BHC)
        memory_BLD = self._encode(x_BLF, train)
        cross_kv = [layer.cross_attn.project_kv(memory_BLD) for layer in self.decoder]
        if cfg.decoding == "direct":
            h_BHD = jnp.broadcast_to(self.queries, (x_BLF.shape[0], *self.queries.shape))
            h_BHD = h_BHD.astype(cfg.compute_dtype)
            for layer, kv in zip(self.decoder, cross_kv, strict=True):
                h_BHD = layer(h_BHD, kv, train)
            return self.output(self.output_proj(h_BHD), x_BLF)
        return self._autoregressive(cross_kv, x_BLF.shape[0], y_BHC, train, teacher_forcing)

    def _encode(self, x_BLF, train):
        cfg = self.cfg
        x_BLF = self.price_scale(x_BLF)  # prices in range units (model.window_scale)
        h_BLD = self.input_proj(x_BLF) + sinusoid(x_BLF.shape[1], cfg.d_model)
        h_BLD = self.drop(h_BLD.astype(cfg.compute_dtype), deterministic=not train)
        for layer in self.encoder:
            h_BLD = layer(h_BLD, train)
        return h_BLD

    def _embed_target(self, y_BC):
        proj = (
            self.input_proj if self.cfg.num_features == self.cfg.num_targets else self.target_proj
        )
        return proj(y_BC).astype(self.cfg.compute_dtype)

    def _autoregressive(self, cross_kv, batch, y_BHC, train, teacher_forcing):
        cfg = self.cfg
        teacher = seq2seq.uses_teacher(train, y_BHC, teacher_forcing)
        y_true_HBC = seq2seq.scanned_targets(cfg, batch, y_BHC, teacher)

        def step(mdl, carry, t, pos_D, y_true_BC, consts):
            tok_BD, caches = carry
            h_B1D = mdl.drop((tok_BD + pos_D)[:, None], deterministic=not train)
            new_caches = []
            for layer, cache, kv in zip(mdl.decoder, caches, consts[0], strict=True):
                h_B1D, cache = layer.step(h_B1D, cache, t, kv, train)
                new_caches.append(cache)
            y_hat_BC = mdl.output_proj(h_B1D[:, 0]).astype(jnp.float32)
            next_BC = (
                seq2seq.teacher_force(mdl, y_hat_BC, y_true_BC, consts[1]) if teacher else y_hat_BC
            )
            return (mdl._embed_target(next_BC), new_caches), y_hat_BC

        scan = nn.scan(
            step,
            variable_broadcast="params",
            split_rngs={"params": False, "dropout": True, "teacher": True},
            in_axes=(0, 0, 0, nn.broadcast),
        )
        dt = cfg.compute_dtype
        head_dim = cfg.d_model // cfg.num_heads
        empty = jnp.zeros((batch, cfg.horizon, cfg.num_heads, head_dim), dt)
        caches = [(empty, empty) for _ in self.decoder]
        carry = (jnp.zeros((batch, cfg.d_model), dt), caches)
        steps_H = jnp.arange(cfg.horizon)
        pos_HD = jnp.asarray(sinusoid(cfg.horizon, cfg.d_model), dt)
        consts = (cross_kv, jnp.asarray(teacher_forcing, jnp.float32))
        _, y_hat_HBC = scan(self, carry, steps_H, pos_HD, y_true_HBC, consts)
        return jnp.swapaxes(y_hat_HBC, 0, 1)
