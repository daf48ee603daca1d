"""The saved best models of a workdir (models/<SERIES>/), and new data prepared for them.

--mode evaluate and --mode predict load <workdir>/models/<SYMBOL>-<INTERVAL>/
(checkpoint.save_series_model) and the data of the given config. What defines a model's
windows (features, lookback, horizon, normalization) and the model itself always come
from the model's own saved config; the data location and extent (source, mirror,
months, end, candles) come from the given config, so a model can be scored on other
months or another mirror. Windows are normalised with the statistics the model was
trained with (its meta.json `norm`), so new data is scaled exactly as training data
was; only a model saved without them (by an earlier cpbjax) re-fits them on the
loaded data, with a warning.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, NamedTuple

import ml_collections
from absl import logging

from cpbjax import columns, models, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.data import features as features_lib
from cpbjax.data import sources, windows
from cpbjax.data.series import INTERVAL_MS, SeriesSkipped
from cpbjax.models import heads
from cpbjax.score import intervals
from cpbjax.training import checkpoint, sharing

# data fields that define a model's windows: always taken from the model's saved config.
MODEL_DATA_FIELDS = ("features", "lookback", "horizon", "normalization")


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


def run_config(config, trained, names) -> ml_collections.ConfigDict:
    """The given config with the model's window fields and model group, restricted to names."""
    c = ml_collections.ConfigDict(config.to_dict())
    for field in MODEL_DATA_FIELDS:
        if c.data[field] != trained.data[field]:
            logging.warning(
                "using the model's data.%s=%r, not the given %r",
                field,
                trained.data[field],
                c.data[field],
            )
            c.data[field] = trained.data[field]
    c.model = ml_collections.ConfigDict(trained.model.to_dict())
    c.data.symbols = tuple(dict.fromkeys(parse_series(n)[0] for n in names))
    c.data.intervals = tuple(dict.fromkeys(parse_series(n)[1] for n in names))
    return c


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


def history_months(data_cfg, interval_days: float = 0.0) -> int:
    """Monthly files that hold the features' warm-up plus data.lookback candles, and the
    `interval_days` days that the calibrated interval's scale averages (intervals.py).

    The largest over data.intervals, in whole months of 28 days (the shortest): the
    month in progress comes on top of the monthly files (from the REST top-up), so N
    complete months always hold N x 28 days of candles.
    """
    needed_ms = max(
        (features_lib.warmup_candles(data_cfg.features, i) + data_cfg.lookback) * INTERVAL_MS[i]
        for i in data_cfg.intervals
    )
    needed_ms = max(needed_ms, interval_days * features_lib.DAY_MS)
    return math.ceil(needed_ms / (28 * features_lib.DAY_MS))


def forecast_config(config, trained, names, fit_days: float = 0.0) -> ml_collections.ConfigDict:
    """`run_config` for forecasting from the newest candles (--mode predict, serve, the API).

    Only data.lookback candles past the indicator warm-up are needed, so min_candles is
    lowered to data.lookback, and binance data.months is raised to `history_months` (plus
    the months of `fit_days`, the windows an unseen series' fits need, zero_shot.py) if
    it holds fewer; and with predict.fresh, Binance Vision history is topped up
    to now from data.api_url (the registered `binance_rest` source).
    """
    c = run_config(config, trained, names)
    c.data.min_candles = min(c.data.min_candles, c.data.lookback)
    months = history_months(c.data, intervals.VOL_DAYS)  # the interval scale's span
    months += math.ceil(fit_days / 28)
    if c.data.source == "binance" and c.data.months < months:
        logging.info(
            "loading %d months, not data.months=%d: the warm-up of data.features plus "
            "data.lookback, and the days the interval's scale averages, need them",
            months,
            c.data.months,
        )
        c.data.months = months
    if c.predict.fresh and c.data.source == "binance":
        c.data.source = "binance_rest"
    return c


# What a per-series run's ModelNotFound adds for a series it has no model of.
UNSEEN_HINT = (
    "; a symbol or interval the run never trained on needs a pooled workdir "
    "(train.share='pooled'), whose one model forecasts any pair"
)


def requested_series(config, run) -> tuple[tuple, tuple]:
    """(symbols, intervals) to forecast: predict.symbols / predict.intervals, or else the
    given data.symbols / data.intervals where they differ from the run's own (`run`: its
    config.json), e.g. --config.data.symbols="('NEWUSDT',)"; () = every one with a model."""

    def pick(given, data, own):
        return tuple(given) or (tuple(data) if tuple(data) != tuple(own) else ())

    return (
        pick(config.predict.symbols, config.data.symbols, run.data.symbols),
        pick(config.predict.intervals, config.data.intervals, run.data.intervals),
    )


def resolve_series(available, symbols, intervals, pooled: bool) -> tuple[list[str], list[str]]:
    """(requested series with a saved model, requested series without one).

    A pooled run forecasts every requested series, those without a model with its shared
    model (zero_shot.py): symbols x intervals, where () means the run's own. A per-series
    run has no model for a series it did not train: `select_series` raises ModelNotFound
    naming it, and saying that it needs a pooled workdir.
    """
    if not pooled:
        return select_series(available, symbols, intervals, hint=UNSEEN_HINT)[0], []
    if not symbols and not intervals:
        return list(available), []
    pairs = [parse_series(n) for n in available]
    symbols = symbols or tuple(dict.fromkeys(s for s, _ in pairs))
    intervals = intervals or tuple(dict.fromkeys(i for _, i in pairs))
    wanted = [f"{s}-{i}" for s in symbols for i in intervals]
    return [n for n in wanted if n in available], [n for n in wanted if n not in available]


def shared_model(base: LoadedModel) -> LoadedModel:
    """A pooled run's model for a series it never saw: `base`, any of its series' saved
    models (all hold the same network), without that series' normalisation, interval and
    column fallback (eval.column_fallback decided it on that series' val windows; a new
    series has none, so the network forecasts every column); zero_shot.fit_series fits
    the others, and the band, on the new series' own candles."""
    params = heads.without_keep(base.params)
    return base._replace(params=params, norm=None, calibration=None, zero_shot=True)


def run_config_of(workdir: str) -> ml_collections.ConfigDict:
    """The config a trained workdir's run was trained with (its config.json, upgraded)."""
    return config_lib.upgrade(writers.read_json(workdir_lib.config_json(workdir)))


def load_for_forecast(config, workdir: str, fit_days: float = 0.0):
    """The models of the requested series (`requested_series`) in `workdir`, ready to forecast.

    Args:
      fit_days: > 0 lets a pooled run forecast series it never trained on (their
        LoadedModel is `shared_model`), loading that many more days of candles to fit
        their own band and interval on (zero_shot.FIT_DAYS); 0 refuses them.

    Returns:
      (name -> LoadedModel, their `forecast_config`, name -> reason a model is unreadable).

    Raises:
      ModelNotFound: a requested series has no model (and is not forecast zero-shot), or
        none could be read.
    """
    available = available_models(workdir)
    # A models/ folder without its run's config.json (put together by hand): the given
    # config is the run's, and its models are per series.
    has_run = os.path.exists(workdir_lib.config_json(workdir))
    run = run_config_of(workdir) if has_run else config
    symbols, intervals_ = requested_series(config, run)
    pooled = has_run and sharing.from_config(run.train).one_model
    if pooled and not fit_days:
        names, _ = select_series(available, symbols, intervals_)
        unseen = []
    else:
        names, unseen = resolve_series(available, symbols, intervals_, pooled)
    loaded, trained, unreadable = load_models(available, names or list(available)[:1])
    if unseen:
        shared = shared_model(next(iter(loaded.values())))
        loaded = {**(loaded if names else {}), **{n: shared for n in unseen}}
    cfg = forecast_config(config, trained, list(loaded), fit_days if unseen else 0.0)
    return loaded, cfg, unreadable


def _prepare_latest(series_list, data_cfg, norms: dict) -> tuple[list, dict]:
    preps, skipped = [], {}
    for s in series_list:
        try:
            preps.append(windows.prepare_latest(s, data_cfg, norms.get(s.name)))
        except SeriesSkipped as e:
            skipped[s.name] = str(e)
    return preps, skipped


def prepare(config, loaded: dict, latest: bool = False) -> tuple[dict, dict]:
    """Loads and prepares the series of `loaded` (name -> LoadedModel) with each model's
    training normalisation; returns (name -> PreparedSeries, skipped).

    `latest`: only the newest candles, for a forecast (windows.prepare_latest: no splits);
    otherwise the full train/val/test windows, for scoring.
    """
    names = list(loaded)
    norms = {n: m.norm for n, m in loaded.items() if m.norm is not None}
    z_scored = [f for f in config.data.features if f not in columns.PRICE_FEATURES]
    if not latest and z_scored and len(norms) < len(names):
        logging.warning(
            "models %s were saved without their normalisation statistics: those are "
            "re-fitted on the train split of the data loaded now",
            sorted(set(names) - set(norms)),
        )
    series, skipped = sources.load_all(config.data)
    wanted = [s for s in series if s.name in names]
    if latest:
        preps, unusable = _prepare_latest(wanted, config.data, norms)
    else:
        preps, unusable = windows.prepare_all(wanted, config.data, norms)
    skipped.update(unusable)
    return {p.name: p for p in preps}, {n: r for n, r in skipped.items() if n in names}
