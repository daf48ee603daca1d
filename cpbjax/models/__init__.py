"""The model registry: config.model.name → (Linen module, frozen config dataclass).

`make_config(config)` is the one place a run config becomes a model config;
`build(model_cfg)` returns the module. Every module is called as
  module.apply({"params": p}, x_BLF, y_BHC or None, train=..., teacher_forcing=...,
               rngs={"dropout": k1, "teacher": k2}) → y_hat [B, H, C] float32.
Adding an architecture: a module and a config dataclass (a `model_config.ModelConfig`
subclass) whose own fields are named like its config.model entries, then
`register(name, module_cls, config_cls)`, from this package or from user code.
`cpbjax.config.schema.validate` checks config.model with the dataclass (`validate_group`).
"""

from __future__ import annotations

import flax.linen as nn
import ml_collections
import numpy as np

from cpbjax import config_rules as rules
from cpbjax.columns import NUM_TARGETS, input_names, price_mask
from cpbjax.models import ensemble, gru, lstm, mlp, model_config, transformer

REGISTRY: dict[str, tuple[type[nn.Module], type[model_config.ModelConfig]]] = {}


def register(
    name: str, module_cls: type[nn.Module], config_cls: type[model_config.ModelConfig]
) -> None:
    """Makes config.model.name=`name` build `module_cls(config_cls(...))`.

    Raises:
      ValueError: the name is taken.
      TypeError: config_cls is not a model_config.ModelConfig dataclass.
    """
    if name in REGISTRY:
        raise ValueError(f"model {name!r} is registered twice")
    if not (isinstance(config_cls, type) and issubclass(config_cls, model_config.ModelConfig)):
        raise TypeError(
            f"model {name!r}: {config_cls!r} is not a model_config.ModelConfig subclass"
        )
    REGISTRY[name] = (module_cls, config_cls)


register("transformer", transformer.Transformer, transformer.TransformerConfig)
register("gru", gru.GRUSeq2Seq, gru.GRUConfig)
register("lstm", lstm.LSTMSeq2Seq, lstm.LSTMConfig)
register("mlp", mlp.WindowMLP, mlp.MLPConfig)


def validate_group(model_group, run_entries=()) -> None:
    """Checks config.model: a registered name, then that model's dataclass rules.

    Args:
      model_group: the config.model group (a ConfigDict or any mapping).
      run_entries: config.model entries that are not model fields (the run's own).

    Raises:
      ConfigError: naming the field, its value and what is allowed.
    """
    rules.one_of("model.name", model_group["name"], REGISTRY)
    REGISTRY[model_group["name"]][1].check_group(model_group, run_entries)


def make_config(config: ml_collections.ConfigDict) -> model_config.ModelConfig:
    """Builds the frozen model config of a run.

    Args:
      config: the run config (validated by cpbjax.config.schema.validate).

    Returns:
      The registered config dataclass of config.model.name, filled from
      config.model.* plus lookback, horizon, num_features, dtype and precision.

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
        "num_features": len(input_names(config.data)),
        "num_targets": NUM_TARGETS,
        "dtype": config.dtype,
        "matmul_precision": config.matmul_precision,
        "price_columns": tuple(
            int(j) for j in np.flatnonzero(price_mask(input_names(config.data)))
        ),
    }
    own = {}
    for field in config_cls.group_fields():
        if field in config.model:
            own[field] = config.model[field]
        else:
            raise ValueError(f"config.model.{field} is missing: model {name!r} needs it")
    return config_cls(**shared, **own)


def build(model_cfg: model_config.ModelConfig) -> nn.Module:
    """Returns the Linen module registered under model_cfg.name, configured by model_cfg;
    with model_cfg.ensemble > 1, that many of them as one ensemble.Ensemble."""
    module_cls = REGISTRY[model_cfg.name][0]
    if model_cfg.ensemble > 1:
        return ensemble.Ensemble(model_cfg, module_cls)
    return module_cls(model_cfg)
