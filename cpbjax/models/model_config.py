"""The config base of every architecture (`ModelConfig`) and the checks that read it.

A registered architecture's config dataclass extends ModelConfig with fields named like
its config.model entries; `ModelConfig.check_group` checks config.model against it, and
`check_inputs` checks a model's windows against it. Shape suffixes: models/layers.py.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from cpbjax import columns
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Fields every architecture shares; `models.make_config` fills them from the run config."""

    name: str  # Registry name (config.model.name).
    decoding: str  # autoregressive | direct.
    lookback: int  # L, input candles per window.
    horizon: int  # H, forecast candles per window.
    num_features: int  # F, input columns: data.features, then data.covariates.
    num_targets: int = 4  # C, OHLC.
    dropout: float = 0.0  # Dropout rate; only active with train=True.
    dtype: str = "float32"  # Compute dtype: float32 | bfloat16. Params stay float32.
    matmul_precision: str = "default"  # highest | high | default.
    baseline: str = "none"  # none | vol_band: what the output corrects.
    window_scale: str = "none"  # none | range: see PriceScale.
    # Indices of the input columns that are prices (columns.price_mask of data.features).
    price_columns: tuple = (0, 1, 2, 3)
    # Y: independently initialised members trained side by side whose forecasts are
    # averaged (models/ensemble.py); 1 = one model.
    ensemble: int = 1
    # The target columns (columns.COLUMNS names) the network corrects; the others forecast
    # the baseline's (heads.ForecastOutput).
    corrected_columns: tuple = columns.COLUMNS

    # The fields `models.make_config` fills from outside config.model (the data's shapes,
    # config.dtype, ...); every other field is a config.model entry of the same name.
    FROM_RUN: ClassVar[frozenset[str]] = frozenset(
        (
            "lookback",
            "horizon",
            "num_features",
            "num_targets",
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
        entries the run reads, checked by cpbjax.config.schema), and every field must be there.
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
        elif field == "corrected_columns":
            ok = (
                isinstance(value, tuple)
                and len(value) > 0
                and len(set(value)) == len(value)
                and set(value) <= set(columns.COLUMNS)
            )
            rules.check(
                ok,
                "model.corrected_columns",
                value,
                f"a tuple of distinct names of {columns.COLUMNS}",
            )
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


def check_inputs(cfg: ModelConfig, x_BLF: jax.Array, y_BHC: jax.Array | None) -> None:
    """Raises ValueError when the window shapes do not match the model config."""
    if x_BLF.ndim != 3 or x_BLF.shape[-1] != cfg.num_features:
        raise ValueError(
            f"{cfg.name}: inputs x have shape {x_BLF.shape}; expected [batch, lookback, "
            f"{cfg.num_features}] (num_features: data.features plus data.covariates)"
        )
    expected = (x_BLF.shape[0], cfg.horizon, cfg.num_targets)
    if y_BHC is not None and tuple(y_BHC.shape) != expected:
        raise ValueError(f"{cfg.name}: targets y have shape {y_BHC.shape}; expected {expected}")
    if cfg.decoding not in DECODINGS:
        raise ValueError(f"{cfg.name}: decoding={cfg.decoding!r}; expected one of {DECODINGS}")
