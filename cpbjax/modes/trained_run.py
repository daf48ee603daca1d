"""A trained workdir read back for the modes that use its models (evaluate, predict,
serve, train.init_from, cpbjax.load): which series are asked for, the run's own config
with today's request laid over it, and the newest data prepared for its models.

What defines a model's windows (features, lookback, horizon, normalization) and the
model itself always come from the model's own saved config; the data location and
extent (source, mirror, months, end, candles) come from the given config, so a model
can be scored on other months or another mirror. Windows are normalised with the
statistics the model was trained with (its meta.json `norm`), so new data is scaled
exactly as training data was; only a model saved without them (by an earlier cpbjax)
re-fits them on the loaded data, with a warning.
"""

from __future__ import annotations

import math
import os

import ml_collections
from absl import logging

from cpbjax import columns, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.data import features as features_lib
from cpbjax.data import latest, sources, windows
from cpbjax.data.series import INTERVAL_MS, CovariateError, SeriesSkipped
from cpbjax.models import heads
from cpbjax.score import intervals
from cpbjax.score.saved import (
    COVARIATE_FIELDS,
    MODEL_DATA_FIELDS,
    LoadedModel,
    available_models,
    load_models,
    parse_series,
    select_series,
)
from cpbjax.training import sharing


def run_config(config, trained, names) -> ml_collections.ConfigDict:
    """The given config with the model's window fields (and covariate fields) and model
    group, restricted to names."""
    c = ml_collections.ConfigDict(config.to_dict())
    for field in (*MODEL_DATA_FIELDS, *COVARIATE_FIELDS):
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

    Raises:
      CovariateError: covariate models and a binance source (its klines carry none).
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
    if c.data.covariates and c.data.source in ("binance", "binance_rest"):
        raise CovariateError(
            f"the models read data.covariates={tuple(c.data.covariates)}, which "
            f"data.source={c.data.source!r} cannot give: covariates need a local source or "
            "frames (data.source='local' with files that carry the columns, or Model.predict)"
        )
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
            preps.append(latest.prepare_latest(s, data_cfg, norms.get(s.name)))
        except SeriesSkipped as e:
            skipped[s.name] = str(e)
    return preps, skipped


def prepare(config, loaded: dict, latest: bool = False) -> tuple[dict, dict]:
    """Loads and prepares the series of `loaded` (name -> LoadedModel) with each model's
    training normalisation; returns (name -> PreparedSeries, skipped).

    `latest`: only the newest candles, for a forecast (latest.prepare_latest: no splits);
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
