"""Portable exports of trained series models (--mode export), and loading them back.

<workdir>/export/<SERIES>/ holds everything needed to use one model elsewhere:
  params.msgpack        the Flax params (flax.serialization msgpack: plain nested dicts)
  config.json           the config the model was trained with
  normalization.json    the training split's normalisation statistics and price mask
  interval.json         the calibrated interval (intervals.fit_calibration), if it has one
  metrics.json          its results.json entry: validation and test metrics
  forward.jax_export    the forward pass serialised with jax.export (StableHLO), callable
                        as `jax.export.deserialize(b).call(params, x_BLF)` without cpbjax;
                        x_BLF's F columns are the features, then a covariate model's
                        data.covariates, scaled as the manifest's "covariates" say
  README.md             the model card: data period, metrics against naive and fitted
                        baselines, intended use and limits
  manifest.json         written last: the series name, the sha256 of every file above,
                        and the config fields that shape the params (written and
                        checked by cpbjax/training/manifest.py, as a saved model's is);
                        a covariate model's "covariates": {"names", "scaling", "mean",
                        "std"}, checked against normalization.json on load

`load_export(folder)` reads it back into the same `saved.LoadedModel` a workdir model gives,
so forecasts from an export are identical to the run's own. It first verifies the folder
against its manifest (every file's sha256, no file missing or added, the params' shapes
against the config's model), so a flipped bit, an edited config field, an edited or
deleted interval.json, or a folder renamed to another series is one ValueError naming
the file (and the field), never a model that silently forecasts other numbers. The series
is the manifest's, not the folder's name. An export without a manifest (made before
exports had one) is refused with a request to re-export it. The saved model is itself
verified against its own manifest before it is exported, so an export never certifies a
damaged model.
"""

from __future__ import annotations

import os

import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from cpbjax import columns, models, progress, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.models import heads
from cpbjax.report import model_card
from cpbjax.score import intervals, saved
from cpbjax.training import checkpoint, manifest

PARAMS_FILE = "params.msgpack"
CONFIG_FILE = "config.json"
NORM_FILE = "normalization.json"
INTERVAL_FILE = "interval.json"
METRICS_FILE = "metrics.json"
FORWARD_FILE = "forward.jax_export"
CARD_FILE = "README.md"
MANIFEST_FILE = manifest.MANIFEST_FILE  # written as a saved series model's (manifest.py)
# The manifest's entry of a covariate model's covariates (`listed_covariates`).
COVARIATES_KEY = "covariates"
# The files of an export; only those its manifest lists may be present.
EXPORT_FILES = (
    PARAMS_FILE,
    CONFIG_FILE,
    NORM_FILE,
    INTERVAL_FILE,
    METRICS_FILE,
    FORWARD_FILE,
    CARD_FILE,
)


def is_export(path: str) -> bool:
    """Whether `path` is an exported model folder (not a workdir's models/<SERIES>/, which
    has a manifest too, but its meta.json)."""
    if os.path.exists(os.path.join(path, checkpoint.META_FILE)):
        return False
    return any(os.path.exists(os.path.join(path, f)) for f in (MANIFEST_FILE, *EXPORT_FILES[:2]))


_sha256 = manifest.sha256_file
shaping_fields = manifest.shaping_fields


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
    model_cfg = models.make_config(trained)  # num_features: F features + K covariates
    module = models.build(model_cfg)
    files = {
        PARAMS_FILE: flax.serialization.msgpack_serialize(params),
        FORWARD_FILE: serialized_forward(
            module, params, trained.data.lookback, model_cfg.num_features
        ),
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
    stale = os.path.join(out_dir, INTERVAL_FILE)
    if INTERVAL_FILE not in jsons and os.path.exists(stale):  # from an earlier export
        os.remove(stale)
    series = os.path.basename(os.path.normpath(model_dir))
    more = (
        {COVARIATES_KEY: listed_covariates(meta["norm"])}
        if columns.covariate_names(trained.data)
        else {}
    )
    manifest.write(out_dir, series, [*files, *jsons], shaping_fields(meta["config"]), **more)
    return out_dir


def listed_covariates(norm: dict) -> dict:
    """The manifest's covariates entry of a model's `norm`: the x_BLF columns after the
    features, in order, and how each is scaled, (x - mean) / std (docs/design.md)."""
    return writers.to_jsonable(
        {
            "names": list(norm["covariates"]),
            "scaling": norm["covariate_scaling"],
            "mean": norm["covariate_mean"],
            "std": norm["covariate_std"],
        }
    )


def load_export(path: str) -> saved.LoadedModel:
    """Reads an export folder back into the LoadedModel a workdir model gives.

    Raises:
      ValueError: one line naming the file (and the field) that does not match the
        manifest, or the manifest is missing (an export made before manifests).
    """
    found = _read_manifest(path)
    trained = config_lib.upgrade(writers.read_json(os.path.join(path, CONFIG_FILE)))
    _verify_files(path, found, trained)
    params_path = os.path.join(path, PARAMS_FILE)
    with open(params_path, "rb") as f:
        try:
            params = flax.serialization.msgpack_restore(f.read())
        except Exception as e:  # msgpack raises its own types, not ValueError
            raise ValueError(f"{params_path} cannot be read ({type(e).__name__}: {e})") from None
    module = models.build(models.make_config(trained))
    _check_shapes(params_path, module, params, trained)
    norm = writers.read_json(os.path.join(path, NORM_FILE))["norm"]
    interval_path = os.path.join(path, INTERVAL_FILE)
    calibration = writers.read_json(interval_path) if os.path.exists(interval_path) else None
    calibration = intervals.check_calibration(calibration, trained.data.horizon, interval_path)
    _check_listed_covariates(path, found, norm, trained)
    fitted = norm if "feature_mean" in norm else None
    return saved.LoadedModel(module, params, trained, fitted, calibration)


def _check_listed_covariates(path: str, found: dict, norm: dict, trained) -> None:
    """Raises ValueError where the manifest's covariates are not those the model reads
    (config.json's data.covariates, scaled as normalization.json says)."""
    listed = found.get(COVARIATES_KEY)
    want = listed_covariates(norm) if columns.covariate_names(trained.data) else None
    if listed != want:
        raise ValueError(
            f"{os.path.join(path, MANIFEST_FILE)}: its {COVARIATES_KEY!r} are {listed!r}, but "
            f"the model reads {want!r} ({NORM_FILE}); export the run again"
        )


def exported_series(path: str) -> str:
    """The series name of export `path`, e.g. "BTCUSDT-1h", from its manifest."""
    return _read_manifest(path)["series"]


def _read_manifest(path: str) -> dict:
    """The manifest of export `path`, checked against the folder's name."""
    found = manifest.read(path, "export")
    if found is None:
        raise ValueError(
            f"{os.path.join(path, MANIFEST_FILE)} is missing: the export was made before "
            "exports carried a manifest (or it was deleted), so it cannot be verified; "
            "export the run again with --mode export"
        )
    return found


def _verify_files(path: str, found: dict, trained) -> None:
    """Every manifest file present with its sha256, no other export file present."""
    wrong = manifest.first_mismatch(path, found, EXPORT_FILES)
    if wrong is None:
        return
    name, why = wrong
    file_path = os.path.join(path, name)
    if why == manifest.ADDED:
        raise ValueError(f"{file_path} is not in {MANIFEST_FILE}: added after the export")
    if why == manifest.MISSING:
        raise ValueError(f"{file_path} is missing (listed in {MANIFEST_FILE})")
    if name == CONFIG_FILE:
        _name_edited_field(file_path, found, trained)
    raise ValueError(
        f"{file_path} does not match its sha256 in {MANIFEST_FILE}: changed or damaged "
        "since the export; export the run again"
    )


def _name_edited_field(config_path: str, found: dict, trained) -> None:
    """Raises ValueError naming the first shaping field config.json changed, if any."""
    # Only the manifest's fields: upgrading an older config may add fields it never had.
    now = {k: v for k, v in shaping_fields(trained.to_dict()).items() if k in found["fields"]}
    edit = manifest.edited_field(found, now)
    if edit is not None:
        field, now, was = edit
        raise ValueError(
            f"{config_path}: {field} is {now!r}, but the model was exported "
            f"with {was!r} ({MANIFEST_FILE}); the params fit only the exported config"
        )


def _check_shapes(params_path: str, module, params, trained) -> None:
    """Raises ValueError naming the first param whose shape the config does not give."""
    d, num_features = trained.data, models.make_config(trained).num_features
    x_BLF = jnp.zeros((1, d.lookback, num_features), jnp.float32)
    y_BHC = jnp.zeros((1, d.horizon, columns.NUM_TARGETS), jnp.float32)
    rngs = {k: jax.random.PRNGKey(0) for k in ("params", "dropout", "teacher")}
    init = lambda: heads.init_params(module, rngs, x_BLF, y_BHC)  # noqa: E731
    if isinstance(params, dict) and heads.keep_columns(params) is not None:
        # eval.column_fallback's mask: set after training, never by init (models/heads.py)
        keep = np.ones(columns.NUM_TARGETS, bool)
        want = jax.eval_shape(lambda: heads.with_keep(init(), keep))
    else:
        want = jax.eval_shape(init)
    want = flax.traverse_util.flatten_dict(want, sep="/")
    got = flax.traverse_util.flatten_dict(params, sep="/") if isinstance(params, dict) else {}
    for key in sorted(set(want) | set(got)):
        shape_want = tuple(want[key].shape) if key in want else "absent"
        shape_got = tuple(np.shape(got[key])) if key in got else "absent"
        if shape_want != shape_got:
            raise ValueError(
                f"{params_path}: {key} is {shape_got}, but config.json's model "
                f"({trained.model.name}) needs {shape_want}"
            )


class NothingToExport(RuntimeError):
    """The workdir has no finished series model to export."""


def run_export(config, workdir: str) -> dict:
    """--mode export: writes <workdir>/export/<SERIES>/ for every saved model of the run.

    Series are restricted to config.predict.symbols x intervals when given. A saved model
    that fails its manifest (checkpoint.DamagedModel) is not exported: its export would
    certify the damage. It is warned of, and the others are exported.

    Returns:
      series name -> export folder.

    Raises:
      saved.ModelNotFound: no saved model (or none of the requested series).
      NothingToExport: the run's results.json has no entry for any saved model, or every
        one of them is damaged (the first one named).
    """
    available = saved.available_models(workdir)
    names, _ = saved.select_series(available, config.predict.symbols, config.predict.intervals)
    results_path = workdir_lib.results_json(workdir)
    entries = writers.read_json(results_path)["series"] if os.path.exists(results_path) else {}
    done, refused = {}, {}
    todo = [n for n in names if n in entries]
    counted = progress.Counted("export", len(todo))
    for name in todo:
        out_dir = workdir_lib.export_dir(workdir, name)
        try:
            done[name] = export_series(available[name], entries[name], out_dir)
        except checkpoint.DamagedModel as e:
            refused[name] = str(e)
            logging.warning("%s: not exported: %s", name, e)
            continue
        finally:
            counted.advance()
        print(f"exported {name} -> {out_dir}")
    counted.finish()
    if refused and not done:
        first = next(iter(refused.values()))
        more = f" (and {len(refused) - 1} more series)" if len(refused) > 1 else ""
        raise NothingToExport(f"no saved model could be exported: {first}{more}")
    if not done:
        raise NothingToExport(f"{results_path} records none of the saved models {names}")
    return done
