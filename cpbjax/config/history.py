"""How the config schema changed since the first cpbjax release: what `config.upgrade`
applies to a config saved by an earlier cpbjax (a workdir's config.json, a saved model's
meta.json, an export's config.json, a run ledger's fingerprint).

ADDED: fields added since, with the value that reproduces what a config saved before them
did; the other fields added since (backtest.*, sweep.*, serve.*, distributed.*,
data.api_url, predict.fresh, eval.print_table, data.covariates and its fields,
data.synthetic_covariates, data.market_series) take today's default, which changes nothing a saved run
trained or scored. RETIRED: fields removed after their experiment concluded, with the value that behaves
as cpbjax does now and what to use instead; RETIRED_VALUES: the same for values of fields
that stay. A saved config that sets a retired option to anything else is refused
(`drop_retired`): the run it describes cannot be reproduced, and nothing silently
changes what it means.
"""

from __future__ import annotations

from typing import Any

from cpbjax.config_rules import ConfigError

ADDED: dict[str, Any] = {
    "model.baseline": "none",  # the raw network output
    "model.window_scale": "none",
    "model.ensemble": 1,
    "model.corrected_columns": ("open", "high", "low", "close"),  # every column
    "train.loss": "mse",  # the replaced system's objective
    "train.loss_scale": "none",
    "train.share": "series",  # a model per series
    "train.pooled_chunk": 0,
    "train.compact_groups": False,
    "train.init_from": "",  # trained from scratch
    "train.stream_chunk_steps": 0,  # every series in device memory
    "eval.interval_levels": (),  # no calibrated interval
    "eval.refit_band": False,
    "eval.column_fallback": False,  # the kept model's correction on every column
    "eval.plot_workers": 0,  # plots drawn at the end of the run
    "sweep.max_settings": 64,  # the cap every earlier sweep ran under
    # The cache changes no candle a run sees, only how fast a rerun reads them: an earlier
    # config gets today's default.
    "data.parsed_cache": "auto",
    "eval.baseline_cache": "auto",  # the same: never changes a score
}

_MARGIN = (
    "train.min_delta is in standard errors of the val gain now (experiments/early_stopping_margin)"
    ": retrain with train.min_delta, e.g. 1.0"
)
_INTERVAL_SCALE = (
    "the interval scale is the constants intervals.VOL_DAYS=7, VOL_WEIGHT=0.25 now "
    "(experiments/interval_scale): drop the field"
)
_PLATEAU = "the lr follows the warmup-cosine schedule alone (no run used it): retrain without it"
_AUX = "the objective is the forecast's loss alone (no run used aux targets): retrain without it"
# field -> (its value that behaves as cpbjax does now, what to do instead)
RETIRED: dict[str, tuple[Any, str]] = {
    "train.min_delta_mode": ("se", _MARGIN),  # see _margin_mode
    "model.quantiles": (
        (),
        "use eval.interval_levels, the calibrated interval around the point forecast "
        "(quantile heads lost on validation, experiments/accuracy_levers)",
    ),
    "model.series_embedding": (
        0,
        "retrain without it: a pooled model has no per-series vector (it stayed 0, "
        "experiments/pooled_or_series)",
    ),
    "recurrent_gradient": (
        "autodiff",
        "retrain with autodiff, the one gradient now (experiments/fused_gradient)",
    ),
    # A config saved before these existed (its interval scale the window's range alone)
    # is scored with today's blend: the calibration it saved keeps its own scale.
    "eval.interval_vol_days": (7.0, _INTERVAL_SCALE),
    "eval.interval_vol_weight": (0.25, _INTERVAL_SCALE),
    "train.reduce_on_plateau": (False, _PLATEAU),
    "train.plateau_factor": (0.5, _PLATEAU),
    "train.plateau_patience": (8, _PLATEAU),
    "model.aux_targets": ((), _AUX),
    "model.aux_weight": (0.1, _AUX),
}
# Retired fields read only while another retired field held a value other than its
# default: field -> that field. Dropped whatever they hold while it holds its default
# (nothing read them; config_rules.IGNORED refuses such a value only since it existed).
READ_ONLY_WITH: dict[str, str] = {
    "train.plateau_factor": "train.reduce_on_plateau",
    "train.plateau_patience": "train.reduce_on_plateau",
    "model.aux_weight": "model.aux_targets",
}
# (field, retired value) -> what to do instead
RETIRED_VALUES: dict[tuple[str, Any], str] = {
    ("train.loss", "huber"): "retrain with train.loss='mae' or 'mse'",
    ("train.loss", "pinball"): (
        "retrain with train.loss='mae'; eval.interval_levels gives the calibrated interval"
    ),
    ("model.baseline", "persistence"): (
        "retrain with model.baseline='vol_band' (experiments/accuracy_levers) or 'none'"
    ),
    ("data.normalization", "zscore"): "retrain with data.normalization='last_close'",
    ("data.normalization", "candle_minmax"): (
        "retrain with data.normalization='last_close' (candle_minmax kept no price level)"
    ),
}


def _get(d: dict, field: str, default=None):
    for part in field.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def _pop(d: dict, field: str) -> None:
    *groups, leaf = field.split(".")
    for part in groups:
        d = d[part]
    del d[leaf]


def _retired(field: str, value, instead: str) -> ConfigError:
    return ConfigError(
        f"config.{field}={value!r} was retired, so this saved config cannot be loaded: {instead}"
    )


def _margin_mode(d: dict) -> str | None:
    """The units of the saved train.min_delta: train.min_delta_mode, "abs" (the loss's
    units) for a config saved before that field existed, None for one saved after it
    was retired (standard errors). Both lack the field; only the earlier one also lacks
    model.window_scale, added after it (a model field: a run ledger's fingerprint, which
    has no eval group, holds it too)."""
    mode = _get(d, "train.min_delta_mode")
    if mode is None and _get(d, "model.window_scale") is None:
        return "abs"
    return mode


def drop_retired(d: dict) -> None:
    """Removes the retired fields of the saved config `d` (nested dicts, tuples for lists)
    that hold their default; raises ConfigError naming the first that holds another."""
    mode = _margin_mode(d)
    # A margin of 0 keeps every lower val loss in any units.
    if mode not in (None, "se") and _get(d, "train.min_delta", 0) != 0:
        raise _retired("train.min_delta_mode", mode, _MARGIN)
    if _get(d, "train.min_delta_mode") is not None:
        d["train"]["min_delta_mode"] = "se"
    unread = {
        f for f, by in READ_ONLY_WITH.items() if _get(d, by, RETIRED[by][0]) == RETIRED[by][0]
    }
    for field, (keep, instead) in RETIRED.items():
        value = _get(d, field, keep)
        if value != keep and field not in unread:
            raise _retired(field, value, instead)
        if _get(d, field) is not None:
            _pop(d, field)
    for (field, value), instead in RETIRED_VALUES.items():
        if _get(d, field) == value:
            raise _retired(field, value, instead)


def fill_added(d: dict) -> None:
    """Adds the ADDED fields the saved config `d` lacks, in groups it has."""
    for field, value in ADDED.items():
        group, leaf = field.split(".")
        if isinstance(d.get(group), dict):
            d[group].setdefault(leaf, value)
