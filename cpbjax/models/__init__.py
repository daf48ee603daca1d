"""The model registry: config.model.name → (Linen module, frozen config dataclass).

`make_config(config)` is the one place a run config becomes a model config;
`build(model_cfg)` returns the module. Every module is called as
  module.apply({"params": p}, x_BLF, y_BHC or None, train=..., teacher_forcing=...,
               rngs={"dropout": k1, "teacher": k2}) → y_hat [B, H, C] float32,
or, with return_aux=True, (y_hat, aux_hat [B, A] float32): the multi-task head's
forecasts of config.model.aux_targets (A = 0 without them; the head then has no
parameters).
Adding an architecture: a file with a module and a config dataclass whose own
fields are named like its config.model fields, plus one REGISTRY line.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import ml_collections

from cpbjax.data.windows import NUM_TARGETS
from cpbjax.models import common, gru, lstm, transformer

REGISTRY = {
    "transformer": (transformer.Transformer, transformer.TransformerConfig),
    "gru": (gru.GRUSeq2Seq, gru.GRUConfig),
    "lstm": (lstm.LSTMSeq2Seq, lstm.LSTMConfig),
}

# ModelConfig fields that come from outside config.model.
_SHARED = {f.name for f in dataclasses.fields(common.ModelConfig)} - {"name", "decoding", "dropout"}


def make_config(config: ml_collections.ConfigDict) -> common.ModelConfig:
    """Builds the frozen model config of a run.

    Args:
      config: the run config (validated by cpbjax.config.validate).

    Returns:
      The registered config dataclass of config.model.name, filled from
      config.model.* plus lookback, horizon, num_features, num_aux, dtype and precision.

    Raises:
      ValueError: unknown model name, or a field the model needs is missing.
    """
    name = config.model.name
    if name not in REGISTRY:
        raise ValueError(
            f"config.model.name={name!r} is not registered: expected one of {list(REGISTRY)}"
        )
    config_cls = REGISTRY[name][1]
    shared = {
        "lookback": config.data.lookback,
        "horizon": config.data.horizon,
        "num_features": len(config.data.features),
        "num_targets": NUM_TARGETS,
        # .get: the config of a model saved before aux targets existed has no such field.
        "num_aux": len(config.model.get("aux_targets", ())),
        "dtype": config.dtype,
        "matmul_precision": config.matmul_precision,
    }
    own = {}
    for field in dataclasses.fields(config_cls):
        if field.name in _SHARED:
            continue
        if field.name not in config.model:
            raise ValueError(f"config.model.{field.name} is missing: model {name!r} needs it")
        own[field.name] = config.model[field.name]
    return config_cls(**shared, **own)


def build(model_cfg: common.ModelConfig) -> nn.Module:
    """Returns the Linen module registered under model_cfg.name, configured by model_cfg."""
    return REGISTRY[model_cfg.name][0](model_cfg)
