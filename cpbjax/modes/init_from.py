"""train.init_from: the params a run starts from when it fine-tunes a trained workdir.

A pooled source (train.share=pooled) gives its one model to every coin; a per-series
source gives each series its own saved model, and has none for a series it did not
train (refused). A pooled run needs a pooled source: a per-series one has no single
model to pool. The saved models are the ones test scored (saved.keep_model), so with
eval.refit_band a pooled source's series differ in their band factors alone (each refit
on its own train+val); the pooled start takes their median, as pooled.pooled_band pools
the fitted bands of a fresh run (the same band on every series where the source had no
refit). The start's val loss becomes the bar (step.start_from, pooled.start_from).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import models
from cpbjax.config_rules import ConfigError
from cpbjax.models import heads
from cpbjax.modes import trained_run
from cpbjax.score import saved
from cpbjax.training import sharing

FIELD = "train.init_from"


def _source_models(config) -> tuple[dict, sharing.Sharing]:
    """(series name -> saved model folder, the source's sharing.Sharing) of
    config.train.init_from."""
    source = config.train.init_from
    try:
        available = saved.available_models(source)
        run = trained_run.run_config_of(source)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{FIELD}={source!r} is not a trained workdir: {e}") from None
    return available, sharing.from_config(run.train)


def check_source(config, workdir: str) -> None:
    """Before a run trains into `workdir`: ConfigError (one line) unless
    config.train.init_from is '' or another workdir that `_checked_source` accepts."""
    source = config.train.init_from
    if source and os.path.realpath(source) == os.path.realpath(workdir):
        raise ConfigError(f"{FIELD}={source!r} is this run's own --workdir: start from another")
    if source:
        _checked_source(config)


def _checked_source(config) -> tuple[dict, sharing.Sharing]:
    """`_source_models`, once the source's share suits this run (a pooled run needs a
    pooled source) and its models have this run's window fields and param shapes
    (`check_shape`, on one of them: a run's models share them)."""
    available, source = _source_models(config)
    if sharing.from_config(config.train).one_model and not source.one_model:
        raise ConfigError(
            f"{FIELD}={config.train.init_from!r} trained a model per series "
            "(train.share='series'): a pooled run starts from a pooled workdir"
        )
    model = _load(config, next(iter(available.values())))
    check_shape(config, model.trained, heads.without_keep(model.params))
    return available, source


def _load(config, path: str) -> saved.LoadedModel:
    """saved.load_model of a source model; one that cannot be read or fails its manifest
    (checkpoint.DamagedModel, naming the file) is a one-line ConfigError: a run never
    starts from a damaged model."""
    try:
        return saved.load_model(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{FIELD}={config.train.init_from!r}: {e}") from None


def _differing_field(config, trained) -> tuple[str, object, object] | None:
    """(field, the source's value, this run's) of the first window field, or else model
    field (models.make_config), in which the source config `trained` differs; or None."""
    for key in saved.MODEL_DATA_FIELDS:
        if config.data[key] != trained.data[key]:
            return f"data.{key}", trained.data[key], config.data[key]
    mine = dataclasses.asdict(models.make_config(config))
    theirs = dataclasses.asdict(models.make_config(trained))
    for key in mine:
        if mine[key] != theirs.get(key):
            return f"model.{key}", theirs.get(key), mine[key]
    return None


def param_shapes(config):
    """This run's params of one model, as jax.ShapeDtypeStructs (step.init_coin's init)."""
    mc = models.make_config(config)
    module = models.build(mc)
    x_BLF = jnp.zeros((1, mc.lookback, mc.num_features), jnp.float32)
    y_BHC = jnp.zeros((1, mc.horizon, mc.num_targets), jnp.float32)
    key = jax.random.PRNGKey(0)
    rngs = {"params": key, "dropout": key, "teacher": key}
    return jax.eval_shape(lambda: heads.init_params(module, rngs, x_BLF, y_BHC))


def check_shape(config, trained, params) -> None:
    """ConfigError unless the source model (`params`, trained with `trained`) has this
    run's window fields and param shapes. Other model fields (dropout, dtype, ...) may
    differ: they shape no param. The message names the first differing field."""
    differing = _differing_field(config, trained)
    want = param_shapes(config)
    same = jax.tree.structure(params) == jax.tree.structure(want) and all(
        np.shape(a) == b.shape
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True)
    )
    if same and (differing is None or not differing[0].startswith("data.")):
        return
    where = f"{FIELD}={config.train.init_from!r}"
    if differing is None:
        raise ConfigError(f"{where}: its params' shapes differ from this run's model")
    field, theirs, mine = differing
    raise ConfigError(
        f"{where}: its {field} is {theirs!r} but this run's is {mine!r}; a run starts "
        "only from a model of the same shape and windows"
    )


def _pooled_start(config, available: dict):
    """One model from a pooled source: its shared params, the band the median of its
    series' saved band factors (see the module docstring)."""
    loaded = [_load(config, path) for path in available.values()]
    params = heads.without_keep(loaded[0].params)  # a run decides its own column fallback
    if config.model.baseline == "vol_band":
        bands = np.stack([np.asarray(heads.band_factors(m.params)) for m in loaded])
        params = heads.with_band(params, np.median(bands, axis=0).astype(np.float32))
    return jax.tree.map(np.asarray, params)


def starting_params(config, names: list[str], num_coins: int):
    """Host params [K, ...] of the coins of series `names` (padding coins take the first
    coin's), from config.train.init_from.

    Raises:
      ConfigError: one line, as `_checked_source` says, or naming a series that a
        per-series source has no model of.
    """
    available, source_sharing = _checked_source(config)  # also a sweep's, a backtest's folds
    source = config.train.init_from
    if source_sharing.one_model:
        per_coin = [_pooled_start(config, available)] * len(names)
    else:  # a per-series source, so a per-series run
        missing = [n for n in names if n not in available]
        if missing:
            raise ConfigError(
                f"{FIELD}={source!r} has no model of {', '.join(missing)}: a per-series "
                "workdir starts only the series it trained"
            )
        loaded = [_load(config, available[n]).params for n in names]
        per_coin = [jax.tree.map(np.asarray, heads.without_keep(p)) for p in loaded]
    per_coin += [per_coin[0]] * (num_coins - len(per_coin))
    return jax.tree.map(lambda *leaves: np.stack(leaves), *per_coin)
