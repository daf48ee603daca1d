"""Pieces shared by the architectures: the config base, attention, teacher forcing, RNN seq2seq.

Shape suffixes (the package's legend): B batch, L lookback, H horizon, F input features,
C targets (OHLC), A aux targets, D model width. Attention adds Q query positions,
P attended (key/value) positions, E heads and W head width (D / E); an RNN cell's
input width is I (F, D or C, by layer).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import config_rules as rules

PRECISIONS = {
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}
DECODINGS = ("autoregressive", "direct")
# What the network's output is added to (model.baseline); see ForecastOutput.
BASELINES = ("none", "vol_band")
# model.window_scale: none | range (price inputs in units of the window's EWMA log range,
# and the head's median output multiplied back by it); see PriceScale.
WINDOW_SCALES = ("none", "range")
# Smallest window range divided by: a window of flat candles (range 0) keeps finite inputs,
# and its forecast is then the baseline (the head's output times about 0).
RANGE_FLOOR = 1e-6
HIGH, LOW = 1, 2  # columns of high and low in the targets and in the input features
BAND_DECAY = 0.9  # EWMA weight ratio of the band's range, baselines.EWMA_DECAY's value


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Fields every architecture shares; `models.make_config` fills them from the run config."""

    name: str  # Registry name (config.model.name).
    decoding: str  # autoregressive | direct.
    lookback: int  # L, input candles per window.
    horizon: int  # H, forecast candles per window.
    num_features: int  # F, input columns.
    num_targets: int = 4  # C, OHLC.
    num_aux: int = 0  # A, auxiliary targets (len(config.model.aux_targets)); 0: no aux head.
    dropout: float = 0.0  # Dropout rate; only active with train=True.
    dtype: str = "float32"  # Compute dtype: float32 | bfloat16. Params stay float32.
    matmul_precision: str = "default"  # highest | high | default.
    baseline: str = "none"  # none | vol_band: what the output corrects.
    window_scale: str = "none"  # none | range: see PriceScale.
    # Indices of the input columns that are prices (normalize.price_mask of data.features).
    price_columns: tuple = (0, 1, 2, 3)
    # Y: independently initialised members trained side by side whose forecasts are
    # averaged (models/ensemble.py); 1 = one model.
    ensemble: int = 1

    # The fields `models.make_config` fills from outside config.model (the data's shapes,
    # config.dtype, ...); every other field is a config.model entry of the same name.
    FROM_RUN: ClassVar[frozenset[str]] = frozenset(
        (
            "lookback",
            "horizon",
            "num_features",
            "num_targets",
            "num_aux",
            "dtype",
            "matmul_precision",
            "price_columns",
        )
    )
    MAX_INT: ClassVar[int] = 65536  # Upper bound of every int field (widths, heads, layers).
    # Upper bound of model.ensemble: each member multiplies a step's memory and time.
    MAX_MEMBERS: ClassVar[int] = 64

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def precision(self) -> jax.lax.Precision:
        return PRECISIONS[self.matmul_precision]

    @classmethod
    def group_fields(cls) -> tuple[str, ...]:
        """The fields read from config.model, in declaration order (name, decoding, ...)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.FROM_RUN)

    @classmethod
    def check_group(cls, group: Mapping, run_entries=()) -> None:
        """Checks config.model against this dataclass; raises ConfigError on the first problem.

        Every entry must be one of `group_fields()` or of `run_entries` (config.model
        entries the run reads, checked by cpbjax.config), and every field must be there.
        Each value then passes `check_field`, and the whole group `check_rules`.
        """
        fields, name = cls.group_fields(), group["name"]
        for key in group:
            allowed = f"a field of model {name!r}: " + ", ".join((*fields, *run_entries))
            rules.check(key in fields or key in run_entries, f"model.{key}", group[key], allowed)
        for field in fields:
            if field not in group:
                raise rules.ConfigError(f"config.model.{field} is missing: model {name!r} needs it")
        hints = _field_types(cls)
        for field in fields:
            cls.check_field(field, hints[field], group[field])
        cls.check_rules(group)

    @classmethod
    def check_field(cls, field: str, kind: Any, value: Any) -> None:
        """One config.model value, by the field's type: ints >= 1, dropout in [0, 1), ..."""
        if field == "decoding":
            rules.one_of("model.decoding", value, DECODINGS)
        elif field == "baseline":
            rules.one_of("model.baseline", value, BASELINES)
        elif field == "window_scale":
            rules.one_of("model.window_scale", value, WINDOW_SCALES)
        elif field == "ensemble":
            rules.int_in("model.ensemble", value, 1, cls.MAX_MEMBERS)
        elif field == "dropout":
            rules.num_in("model.dropout", value, 0, 1, hi_open=True)
        elif kind is bool:
            rules.bool_field(f"model.{field}", value)
        elif kind is int:
            rules.int_in(f"model.{field}", value, 1, cls.MAX_INT)
        elif kind is float:
            rules.check(rules.is_num(value), f"model.{field}", value, "a finite number")
        elif kind is str:
            rules.check(isinstance(value, str), f"model.{field}", value, "a string")

    @classmethod
    def check_rules(cls, group: Mapping) -> None:
        """Rules between fields (e.g. a width that its heads divide); subclasses call super."""
        for field in ("baseline", "window_scale"):
            rules.check(
                group[field] == "none" or group["decoding"] == "direct",
                f"model.{field}",
                group[field],
                "none with model.decoding='autoregressive' (it needs direct decoding)",
            )


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """field name -> its type (annotations may be strings under `from __future__`)."""
    return typing.get_type_hints(cls)


def check_divides(group: Mapping, width: str, heads: str) -> None:
    """config.model.<width> must be a multiple of config.model.<heads> (attention heads)."""
    rules.check(
        group[width] % group[heads] == 0,
        f"model.{width}",
        group[width],
        f"a multiple of model.{heads} ({group[heads]})",
    )


def window_range(x_BLF: jax.Array, decay: float = BAND_DECAY) -> jax.Array:
    """EWMA of each input candle's log(high/low) over the window, newest weighing most, [B].

    Under last_close normalisation the high and low input columns are log prices less
    one anchor, so their difference is the log range: the same number as
    baselines.ewma_range computes from prices (in float32 here).
    """
    range_BL = (x_BLF[..., HIGH] - x_BLF[..., LOW]).astype(jnp.float32)
    lookback = x_BLF.shape[1]
    w_L = decay ** jnp.arange(lookback - 1, -1, -1, dtype=jnp.float32)
    return range_BL @ (w_L / jnp.sum(w_L))


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

    cfg: ModelConfig

    def __call__(self, x_BLF: jax.Array) -> jax.Array:
        if self.cfg.window_scale == "none":
            return x_BLF
        sigma_B = floored_range(window_range(x_BLF)).astype(x_BLF.dtype)
        is_price_F = np.isin(np.arange(x_BLF.shape[-1]), self.cfg.price_columns)  # static
        return x_BLF / jnp.where(is_price_F, sigma_B[:, None], 1.0)[:, None, :]


def head_init(cfg: ModelConfig):
    """Kernel init of the output layer: zeros when the output corrects a baseline, so an
    untrained model forecasts the baseline exactly; else Dense's default."""
    return nn.initializers.zeros if cfg.baseline != "none" else nn.linear.default_kernel_init


class ForecastOutput(nn.Module):
    """Turns a head's raw outputs [B, H, C] into forecasts [B, H, C]: the raw output (times
    the window's range under window_scale=range) plus the baseline (cfg.baseline):
      vol_band: the last close for every column (0 in the last_close space), and
        high = +k_h·sigma and low = -k'_h·sigma, sigma the window's EWMA log range and
        k, k' learned per step ("band_high", "band_low" [H]; group training starts them
        at the coin's train-split fit, `with_band`).
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(self, raw: jax.Array, x_BLF: jax.Array):
        cfg = self.cfg
        y_BHC = raw.astype(jnp.float32).reshape(*raw.shape[:2], cfg.num_targets)
        sigma_B = window_range(x_BLF)
        if cfg.window_scale == "range":  # the output is in range units
            y_BHC = y_BHC * floored_range(sigma_B)[:, None, None]
        if cfg.baseline == "vol_band":
            steps_H = jnp.sqrt(jnp.arange(1, cfg.horizon + 1, dtype=jnp.float32))
            k_high_H = self.param("band_high", lambda _: 0.5 * steps_H)
            k_low_H = self.param("band_low", lambda _: 0.5 * steps_H)
            band_BH = sigma_B[:, None]
            y_BHC = y_BHC.at[:, :, HIGH].add(k_high_H * band_BH)
            y_BHC = y_BHC.at[:, :, LOW].add(-k_low_H * band_BH)
        return y_BHC


# The params key of model.ensemble's members, every leaf under it [Y, ...] (ensemble.py).
MEMBERS = "members"


def init_params(module: nn.Module, rngs, x_BLF, y_BHC) -> dict:
    """module.init's params, refusing a baseline (cfg.baseline) or a window scale
    (cfg.window_scale) the module would ignore.

    A registered user model whose forecasts do not go through ForecastOutput would
    silently forecast without its baseline (and, for vol_band, have no band to start);
    one whose inputs skip PriceScale would see unscaled prices and scale its outputs.
    An interceptor sees which of the two the init runs through.
    """
    used = set()

    def note_used(call, args, kwargs, context):
        used.add(type(context.module))
        return call(*args, **kwargs)

    with nn.intercept_methods(note_used):
        params = module.init(rngs, x_BLF, y_BHC, train=False)["params"]
    cfg = module.cfg
    for field, value, needs in (
        ("baseline", cfg.baseline, (ForecastOutput,)),
        ("window_scale", cfg.window_scale, (ForecastOutput, PriceScale)),
    ):
        missing = [f"common.{m.__name__}" for m in needs if m not in used]
        if value != "none" and missing:
            raise rules.ConfigError(
                f"config.model.{field}={value!r} needs a model that runs "
                f"{' and '.join(missing)}; model {cfg.name!r} does not: set "
                f"--config.model.{field}=none"
            )
    return params


def band_factors(params) -> jax.Array:
    """The vol_band factors of one model's params: [H, 2] (high, low), or [Y, H, 2] for an
    ensemble's members."""
    out = params[MEMBERS]["output"] if MEMBERS in params else params["output"]
    return jnp.stack([out["band_high"], out["band_low"]], axis=-1)


def with_band(params, k_H2) -> dict:
    """params with the vol_band factors set to k_H2 [H, 2] (high, low), others as they are;
    an ensemble's members all take k_H2, or each its own row of a k_YH2 [Y, H, 2]."""
    if MEMBERS in params:
        members = params[MEMBERS]
        size = members["output"]["band_high"].shape[0]  # Y
        return {
            **params,
            MEMBERS: with_band(members, jnp.broadcast_to(k_H2, (size, *k_H2.shape[-2:]))),
        }
    out = dict(params)
    out["output"] = {**params["output"], "band_high": k_H2[..., 0], "band_low": k_H2[..., 1]}
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class RNNConfig(ModelConfig):
    """Stacked-RNN encoder-decoder fields (config.model.hidden, .num_layers)."""

    hidden: int  # State width of every encoder and decoder layer.
    num_layers: int  # Stacked layers in the encoder and in the decoder.


def dense(cfg: ModelConfig, features: int, **kwargs) -> nn.Dense:
    """A Dense layer with float32 params, the configured compute dtype and matmul precision."""
    return nn.Dense(
        features,
        dtype=cfg.compute_dtype,
        param_dtype=jnp.float32,
        precision=cfg.precision,
        **kwargs,
    )


def aux_head(cfg: ModelConfig) -> nn.Dense | None:
    """The multi-task head: a linear map from the window summary to the A aux targets.

    Linear on purpose: the auxiliary losses are there to shape the shared encoder
    (hard parameter sharing); a deeper head could fit them by itself and leave the
    encoder less shaped. None without aux targets: such a model has no extra parameter.
    """
    return dense(cfg, cfg.num_aux) if cfg.num_aux else None


def outputs(
    head: nn.Dense | None, y_hat_BHC: jax.Array, summary_BD: jax.Array | None, return_aux: bool
):
    """y_hat_BHC, or (y_hat_BHC, aux_hat_BA float32) with return_aux.

    The head runs whether or not its output is returned, so `init` creates its
    parameters either way; under jit an unused aux output is pruned.
    """
    if head is None:
        aux_hat_BA = jnp.zeros((y_hat_BHC.shape[0], 0), jnp.float32)
    else:
        aux_hat_BA = head(summary_BD).astype(jnp.float32)
    return (y_hat_BHC, aux_hat_BA) if return_aux else y_hat_BHC


def check_inputs(cfg: ModelConfig, x_BLF: jax.Array, y_BHC: jax.Array | None) -> None:
    """Raises ValueError when the window shapes do not match the model config."""
    if x_BLF.ndim != 3 or x_BLF.shape[-1] != cfg.num_features:
        raise ValueError(
            f"{cfg.name}: inputs x have shape {x_BLF.shape}; expected [batch, lookback, "
            f"{cfg.num_features}] (num_features = len(config.data.features))"
        )
    expected = (x_BLF.shape[0], cfg.horizon, cfg.num_targets)
    if y_BHC is not None and tuple(y_BHC.shape) != expected:
        raise ValueError(f"{cfg.name}: targets y have shape {y_BHC.shape}; expected {expected}")
    if cfg.decoding not in DECODINGS:
        raise ValueError(f"{cfg.name}: decoding={cfg.decoding!r}; expected one of {DECODINGS}")


def uses_teacher(train: bool, y_BHC: jax.Array | None, ratio: float | jax.Array) -> bool:
    """Whether teacher forcing can happen; static, so eval traces carry no coin flips."""
    never = isinstance(ratio, (int, float)) and ratio == 0
    return train and y_BHC is not None and not never


def scanned_targets(cfg: ModelConfig, batch: int, y_BHC, teacher: bool) -> jax.Array:
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


class Attention(nn.Module):
    """Multi-head dot-product attention with torch.nn.MultiheadAttention's parameters.

    q, k, v and output projections, all with biases: 4·D² + 4·D parameters.
    Keys and values come from `project_kv`, so callers can project a memory
    once and attend to it many times (the KV cache, the cross-attention).
    """

    cfg: ModelConfig
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
    The aux head (num_aux > 0) reads the encoder's last output, the top layer's final
    state: a summary of the window that teacher-forced candles never reach.
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
        self.head_hidden = dense(cfg, cfg.hidden)
        out = cfg.num_targets if autoregressive else cfg.horizon * cfg.num_targets
        self.head_out = dense(cfg, out, kernel_init=head_init(cfg))
        self.price_scale = PriceScale(cfg)
        self.output = ForecastOutput(cfg)
        self.aux_head = aux_head(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(
        self,
        x_BLF,
        y_BHC=None,
        train: bool = False,
        teacher_forcing=0.0,
        return_aux: bool = False,
    ):
        """Forecasts H candles from windows.

        Args:
          x_BLF: input windows [B, L, F].
          y_BHC: true targets [B, H, C], used only for teacher forcing (train=True);
            None at evaluation.
          train: enables dropout and teacher forcing (needs rngs "dropout", "teacher").
          teacher_forcing: per-step probability (float or traced scalar) of feeding
            the true previous candle instead of the forecast.
          return_aux: also return the aux head's forecasts.

        Returns:
          Forecasts [B, H, C] float32, in the
          normalised space of the targets; with return_aux, (forecasts, aux forecasts
          [B, A] float32).

        Raises:
          ValueError: window shapes that do not match the config.
        """
        cfg = self.cfg
        check_inputs(cfg, x_BLF, y_BHC)
        enc_BLD, states = self._encode(x_BLF, train)
        memory = self.attention.prepare(enc_BLD)
        last_BD = enc_BLD[:, -1]
        if cfg.decoding == "direct":
            y_flat = self._head(last_BD, self.attention(memory, last_BD))  # [B, H * C]
            raw = y_flat.reshape(-1, cfg.horizon, cfg.num_targets)
            y_hat_BHC = self.output(raw, x_BLF)
        else:
            y_hat_BHC = self._autoregressive(states, memory, y_BHC, train, teacher_forcing)
        return outputs(self.aux_head, y_hat_BHC, last_BD, return_aux)

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
