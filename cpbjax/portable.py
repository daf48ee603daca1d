"""Portable exports of trained series models (--mode export), and loading them back.

<workdir>/export/<SERIES>/ holds everything needed to use one model elsewhere:
  params.msgpack        the Flax params (flax.serialization msgpack: plain nested dicts)
  config.json           the config the model was trained with
  normalization.json    the training split's normalisation statistics and price mask
  interval.json         the calibrated interval (intervals.fit_calibration), if it has one
  metrics.json          its results.json entry: validation and test metrics
  forward.jax_export    the forward pass serialised with jax.export (StableHLO), callable
                        as `jax.export.deserialize(b).call(params, x_BLF)` without cpbjax
  README.md             the model card: data period, metrics against naive and fitted
                        baselines, intended use and limits

`load_export(folder)` reads it back into the same `saved.LoadedModel` a workdir model gives,
so forecasts from an export are identical to the run's own.
"""

from __future__ import annotations

import os

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import checkpoint, intervals, model_card, models, saved, writers
from cpbjax import config as config_lib
from cpbjax import workdir as workdir_lib

PARAMS_FILE = "params.msgpack"
CONFIG_FILE = "config.json"
NORM_FILE = "normalization.json"
INTERVAL_FILE = "interval.json"
METRICS_FILE = "metrics.json"
FORWARD_FILE = "forward.jax_export"
CARD_FILE = "README.md"


def is_export(path: str) -> bool:
    """Whether `path` is an exported model folder (not a workdir's models/<SERIES>/)."""
    return os.path.exists(os.path.join(path, PARAMS_FILE))


def serialized_forward(module, params, lookback: int, num_features: int) -> bytes:
    """The deterministic forward pass (params, x_BLF) -> y_BHC, for any batch size B."""

    def forward(params, x_BLF):
        return module.apply({"params": params}, x_BLF, None, train=False)

    (b,) = jax.export.symbolic_shape("b")
    x_spec = jax.ShapeDtypeStruct((b, lookback, num_features), jnp.float32)
    param_specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    return jax.export.export(jax.jit(forward))(param_specs, x_spec).serialize()


def export_series(model_dir: str, entry: dict, out_dir: str) -> str:
    """Writes the export folder of one saved series model; returns it.

    Args:
      model_dir: <workdir>/models/<SERIES>/. entry: its results.json entry.
      out_dir: the folder to write, e.g. <workdir>/export/<SERIES>/.
    """
    params, meta = checkpoint.load_series_model(model_dir)
    params = jax.tree.map(np.asarray, params)
    trained = config_lib.upgrade(meta["config"])
    module = models.build(models.make_config(trained))
    d = trained.data
    files = {
        PARAMS_FILE: flax.serialization.msgpack_serialize(params),
        FORWARD_FILE: serialized_forward(module, params, d.lookback, len(d.features)),
        CARD_FILE: model_card.render(meta, entry),
    }
    for name, data in files.items():
        writers.atomic_write(os.path.join(out_dir, name), data)
    norm = {"norm": meta["norm"], "price_mask": meta["price_mask"]}
    jsons = {CONFIG_FILE: meta["config"], NORM_FILE: norm, METRICS_FILE: entry}
    if meta.get("interval_calibration"):
        jsons[INTERVAL_FILE] = meta["interval_calibration"]
    for name, obj in jsons.items():
        writers.write_json(os.path.join(out_dir, name), obj)
    return out_dir


def load_export(path: str) -> saved.LoadedModel:
    """Reads an export folder back into the LoadedModel a workdir model gives."""
    with open(os.path.join(path, PARAMS_FILE), "rb") as f:
        params = flax.serialization.msgpack_restore(f.read())
    trained = config_lib.upgrade(writers.read_json(os.path.join(path, CONFIG_FILE)))
    norm = writers.read_json(os.path.join(path, NORM_FILE))["norm"]
    module = models.build(models.make_config(trained))
    interval_path = os.path.join(path, INTERVAL_FILE)
    calibration = writers.read_json(interval_path) if os.path.exists(interval_path) else None
    calibration = intervals.check_calibration(calibration, trained.data.horizon, interval_path)
    fitted = norm if "feature_mean" in norm else None
    return saved.LoadedModel(module, params, trained, fitted, calibration)


class NothingToExport(RuntimeError):
    """The workdir has no finished series model to export."""


def run_export(config, workdir: str) -> dict:
    """--mode export: writes <workdir>/export/<SERIES>/ for every saved model of the run.

    Series are restricted to config.predict.symbols x intervals when given.

    Returns:
      series name -> export folder.

    Raises:
      saved.ModelNotFound: no saved model (or none of the requested series).
      NothingToExport: the run's results.json has no entry for any saved model.
    """
    available = saved.available_models(workdir)
    names, _ = saved.select_series(available, config.predict.symbols, config.predict.intervals)
    results_path = workdir_lib.results_json(workdir)
    entries = writers.read_json(results_path)["series"] if os.path.exists(results_path) else {}
    done = {}
    for name in names:
        if name in entries:
            out_dir = workdir_lib.export_dir(workdir, name)
            done[name] = export_series(available[name], entries[name], out_dir)
            print(f"exported {name} -> {out_dir}")
    if not done:
        raise NothingToExport(f"{results_path} records none of the saved models {names}")
    return done
