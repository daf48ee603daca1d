"""The saved best models of a workdir (models/<SERIES>/): what a kept model's meta.json
records (`RunMeta`, `keep_model`), which models a workdir holds, and loading one, its
manifest verified (checkpoint.save_series_model / load_series_model). Reading a trained
run back for new data is cpbjax/modes/trained_run.py's."""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from cpbjax import models, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.score import intervals
from cpbjax.training import checkpoint

# data fields that define a model's windows: always taken from the model's saved config.
MODEL_DATA_FIELDS = ("features", "lookback", "horizon", "normalization")
# The covariate fields a forecast takes from the model too (its inputs, and how they were
# filled and scaled; docs/design.md "Covariates").
COVARIATE_FIELDS = ("covariates", "market_series", "covariate_fill", "covariate_scaling")


class ModelNotFound(ValueError):
    """A requested series or interval has no saved model; the message lists those that do."""


@dataclasses.dataclass(frozen=True)
class RunMeta:
    """What every kept model's meta.json records of its run's config, taken once by the
    mode (`from_config`): plain dicts, never the ConfigDict."""

    model: dict  # dataclasses.asdict of the run's models.make_config
    config: dict  # the whole run config, to rebuild the model (`load_model`)
    data: dict  # its data group

    @classmethod
    def from_config(cls, config) -> RunMeta:
        model = dataclasses.asdict(models.make_config(config))
        return cls(model=model, config=config.to_dict(), data=config.data.to_dict())


def model_meta(run: RunMeta, prep, entry: dict) -> dict:
    """meta.json of a saved series model: enough to rebuild the module and map prices."""
    return {
        "series": prep.name,
        "symbol": prep.symbol,
        "interval": prep.interval,
        "model": run.model,
        "config": run.config,
        "data": run.data,
        "norm": prep.norm,
        "price_mask": prep.price_mask,
        **{k: entry[k] for k in ("num_params", "status", "best_epoch", "best_val_loss")},
        # eval.column_fallback's columns forecast by the baseline (the mask is in the params)
        **{k: entry[k] for k in ("baseline_columns",) if k in entry},
    }


def keep_model(workdir: str, run: RunMeta, prep, scored, entry: dict) -> None:
    """Saves a trained series' model to <workdir>/models/<SERIES>/: the params test
    scored (`evaluate.Scored`: with eval.refit_band, its band refit on train+val), and
    meta.json with its interval calibration (`run`: its run's RunMeta)."""
    meta = model_meta(run, prep, entry)
    if scored.calibration is not None:
        meta["interval_calibration"] = scored.calibration
    checkpoint.save_series_model(workdir_lib.series_model(workdir, prep.name), scored.params, meta)


def save_window_mae(workdir: str, name: str, window_mae: dict) -> None:
    """Writes a scored coin's per-window MAE (`evaluate.Scored.window_mae`, split ->
    float64 [N, C]) to <workdir>/window_mae/<name>.npz, so a resumed run still has them."""
    buf = io.BytesIO()
    np.savez(buf, **window_mae)
    writers.atomic_write(workdir_lib.window_mae_file(workdir, name), buf.getvalue())


def load_window_mae(workdir: str, name: str) -> dict:
    """split -> float64 [N, C], as `save_window_mae` wrote them."""
    with np.load(workdir_lib.window_mae_file(workdir, name)) as f:
        return {split: f[split] for split in f.files}


def available_models(workdir: str) -> dict[str, str]:
    """Series name -> folder of every saved best model under <workdir>/models/.

    Raises:
      ModelNotFound: if there is no saved model at all.
    """
    folder = workdir_lib.models_dir(workdir)
    found = {}
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if os.path.exists(os.path.join(folder, name, workdir_lib.MODEL_META_FILE)):
                found[name] = os.path.join(folder, name)
    if not found:
        raise ModelNotFound(f"no saved model under {folder}: train with --workdir {workdir} first")
    return found


def parse_series(name: str) -> tuple[str, str]:
    """("BTCUSDT", "1h") of "BTCUSDT-1h"."""
    symbol, _, interval = name.rpartition("-")
    return symbol, interval


def select_series(
    available, symbols, intervals, excused=None, hint: str = ""
) -> tuple[list[str], dict]:
    """The series of symbols x intervals to use, each of which must have a model.

    Args:
      available: series names with a saved model.
      symbols, intervals: requested; an empty one means every one with a model.
      excused: series name -> reason for series known to have no model (skipped in
        training); they are returned as skipped instead of raising.
      hint: appended to the ModelNotFound message.

    Returns:
      (names in request order, skipped: name -> reason).

    Raises:
      ModelNotFound: naming each series, symbol or interval without a model and
        listing the series that have one.
    """
    excused = excused or {}
    pairs = {n: parse_series(n) for n in available}
    if symbols and intervals:
        wanted = [f"{s}-{i}" for s in symbols for i in intervals]
        missing = [n for n in wanted if n not in pairs and n not in excused]
    else:
        wanted = [
            n
            for n, (s, i) in pairs.items()
            if (not symbols or s in symbols) and (not intervals or i in intervals)
        ]
        missing = [f"symbol {s}" for s in symbols if all(p[0] != s for p in pairs.values())]
        missing += [f"interval {i}" for i in intervals if all(p[1] != i for p in pairs.values())]
    if missing or not wanted:
        raise ModelNotFound(
            f"no saved model for {', '.join(missing) or 'the request'}; "
            f"series with a model: {', '.join(sorted(available))}{hint}"
        )
    skipped = {n: f"no model (skipped in training: {excused[n]})" for n in wanted if n not in pairs}
    return [n for n in wanted if n in pairs], skipped


class LoadedModel(NamedTuple):
    """One saved best model, as `load_model` returns it."""

    module: Any  # the Flax Linen module
    params: Any  # its params pytree
    trained: ml_collections.ConfigDict  # the config it was trained with
    norm: dict | None  # meta.json's `norm` if it holds the fitted statistics, else None
    # meta.json's `interval_calibration` (intervals.fit_calibration on the val split), or
    # None for a model saved without one (eval.interval_levels=(), or an earlier cpbjax)
    calibration: dict | None = None
    # A pooled run's shared model for a series it never saw (`shared_model`): its norm,
    # band and calibration are fitted on that series' candles (zero_shot.fit_series).
    zero_shot: bool = False


def load_model(path: str) -> LoadedModel:
    """Loads one saved best model (see LoadedModel)."""
    params, meta = checkpoint.load_series_model(path)
    if "config" not in meta:
        raise ValueError(
            f"{path}/{workdir_lib.MODEL_META_FILE} has no 'config': cannot rebuild the model"
        )
    trained = config_lib.upgrade(meta["config"])
    norm = meta.get("norm") if "feature_mean" in meta.get("norm", {}) else None
    module = models.build(models.make_config(trained))
    where = f"{path}/{workdir_lib.MODEL_META_FILE}"
    calibration = intervals.check_calibration(
        meta.get("interval_calibration"), trained.data.horizon, where
    )
    return LoadedModel(module, params, trained, norm, calibration)


def load_models(available, names):
    """Loads the models of `names`; all must share the window fields (one run).

    A model whose folder cannot be read (damaged meta.json, missing params/) or does not
    match its manifest (checkpoint.DamagedModel: a flipped bit, an edited field, a folder
    copied under another series' name) is skipped with its reason; the others are used.

    Returns:
      (name -> LoadedModel, the first model's training config, name -> skip reason).

    Raises:
      ModelNotFound: no requested model could be read.
    """
    loaded, skipped = {}, {}
    for name in names:
        try:
            loaded[name] = load_model(available[name])
        except (OSError, ValueError, KeyError, TypeError) as e:
            # long enough for a damaged file's absolute path and what to do about it
            skipped[name] = f"saved model unreadable: {str(e).splitlines()[0][:400]}"
    if not loaded:
        (first, reason), more = next(iter(skipped.items())), len(skipped) - 1
        also = f" (and {more} more series)" if more else ""
        raise ModelNotFound(f"no requested model could be read: {first}: {reason}{also}")
    first_name = next(iter(loaded))
    first = loaded[first_name].trained
    for name, model in loaded.items():
        for field in MODEL_DATA_FIELDS:
            if model.trained.data[field] != first.data[field]:
                raise ValueError(
                    f"model {name} has data.{field}={model.trained.data[field]!r} but "
                    f"{first_name} has {first.data[field]!r}: evaluate them separately"
                )
    return loaded, first, skipped
