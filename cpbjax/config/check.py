"""The validation of a whole config: each field's own check, then the rules between fields.

`config.validate()` runs it before anything downloads or compiles; every error is a
`ConfigError` naming the field, the value and what is allowed. Names that other modules
own (data sources, models, features, losses) are read from them when
validating, and config.model is checked by the registered model's config dataclass
(`cpbjax.models.validate_group`), so user-registered ones are allowed.
"""

from __future__ import annotations

import importlib
import re

from cpbjax import config_rules as rules
from cpbjax.columns import PRICE_FEATURES, market_columns
from cpbjax.config import sweep_grid
from cpbjax.config_rules import ConfigError
from cpbjax.data import pairs
from cpbjax.data.series import INTERVAL_MS, split_date_ms

SHARES = ("series", "pooled")  # train.share: a model per series, or one for the run
# train.loss and train.loss_scale: what cpbjax/training/losses.py computes for each name.
LOSSES = ("mse", "mae")
LOSS_SCALES = ("none", "persistence")

# Name lists that other modules own, read from the owner each time they are asked for
# (`config.SOURCES`, or validate()), so a source or model registered from user code is
# allowed. Imported only then: the owners import jax, requests, scipy, and never config.
OWNED_NAMES = {
    "SOURCES": ("cpbjax.data.sources", lambda m: tuple(m.SOURCES)),
    "MODELS": ("cpbjax.models", lambda m: tuple(m.REGISTRY)),
    "FEATURES": ("cpbjax.data.features", lambda m: tuple(m.NAMES)),
}
# (lo, hi, lo_open) of the train fields a sweep can set per coin: train.<field> and each
# value of sweep.<field> obey the same range.
_SWEEPABLE_RANGES = {"learning_rate": (0, 10, True), "weight_decay": (0, 1, False)}
_SYMBOL_RE = re.compile(r"^[A-Z0-9]{2,20}$")


def owned_names(kind: str) -> tuple[str, ...]:
    """The names `kind` (a key of OWNED_NAMES) that its owner module holds now."""
    owner, read = OWNED_NAMES[kind]
    return read(importlib.import_module(owner))


def _int_range(c, field: str, lo: int, hi: int | None = None) -> None:
    rules.int_in(field, _get(c, field), lo, hi)


def _num_range(c, field: str, lo: float, hi: float, lo_open=False, hi_open=False) -> None:
    rules.num_in(field, _get(c, field), lo, hi, lo_open, hi_open)


def _choice(c, field: str, allowed) -> None:
    rules.one_of(field, _get(c, field), allowed)


def _bool(c, field: str) -> None:
    rules.bool_field(field, _get(c, field))


def _get(c, field: str):
    for part in field.split("."):
        c = c[part]
    return c


def _validate_top(c) -> None:
    _int_range(c, "seed", 0, 2**63 - 1)  # jax.random.PRNGKey takes an int64
    _choice(c, "platform", ("cpu", "gpu", "tpu", "auto"))
    _choice(c, "matmul_precision", ("highest", "high", "default"))
    _choice(c, "dtype", ("float32", "bfloat16"))
    _validate_distributed(c)


def _validate_distributed(c) -> None:
    h = c.distributed
    _bool(c, "distributed.enabled")
    address = h.coordinator_address
    rules.check(
        address == "" or re.fullmatch(r"[^\s:]+:\d{1,5}", address) is not None,
        "distributed.coordinator_address",
        address,
        "'' or host:port",
    )
    _int_range(c, "distributed.num_processes", 0)
    _int_range(c, "distributed.process_id", -1)


def _validate_data(c) -> None:
    d = c.data
    _choice(c, "data.source", owned_names("SOURCES"))
    _validate_name_lists(c)
    rules.check(
        isinstance(d.base_url, str) and bool(d.base_url),
        "data.base_url",
        d.base_url,
        "an http(s):// URL, a file:// URL or a directory",
    )
    rules.check(
        isinstance(d.api_url, str) and d.api_url.startswith(("http://", "https://")),
        "data.api_url",
        d.api_url,
        "an http(s):// URL",
    )
    _cache_folder(d.parsed_cache, "data.parsed_cache")
    _int_range(c, "data.months", 0, 120)
    rules.check(
        d.end == "" or re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", d.end) is not None,
        "data.end",
        d.end,
        "'' or a month as YYYY-MM",
    )
    _validate_windows(c)
    _int_range(c, "data.download_workers", 1, 64)
    _num_range(c, "data.timeout_seconds", 0, 600, lo_open=True)
    _num_range(c, "data.download_deadline_s", 0, 3600, lo_open=True)
    _int_range(c, "data.retries", 0, 20)
    _int_range(c, "data.synthetic_candles", 1, 10_000_000)
    rules.check(
        tuple(d.features[:4]) == ("open", "high", "low", "close"),
        "data.features",
        d.features,
        "a tuple starting with open, high, low, close (the targets)",
    )
    _validate_covariates(c)


# Names a covariate cannot take: the candle and time columns, the long frame's series
# column, and the price features (a column of that name would be scaled as a price).
_NOT_COVARIATES = frozenset(
    {"open_time", "timestamp", "date", "datetime", "time", "volume", "series", *PRICE_FEATURES}
)


def _validate_covariates(c) -> None:
    """data.covariates: a tuple of distinct column names (ignoring case), none a candle
    column; its scaling, fill and the synthetic source's switch."""
    d = c.data
    names = d.covariates
    allowed = "a tuple of column names, e.g. ('funding',); () = none"
    rules.check(isinstance(names, (tuple, list)), "data.covariates", names, allowed)
    for name in names:
        ok = isinstance(name, str) and name.strip() == name and bool(name)
        rules.check(ok, "data.covariates", name, "a column name without surrounding spaces")
        bad = name.lower() in _NOT_COVARIATES
        rules.check(not bad, "data.covariates", name, "a column other than the candles' own")
    lower = [n.lower() for n in names]
    rules.check(len(set(lower)) == len(lower), "data.covariates", names, "no repeated names")
    _validate_market_series(d)
    _choice(c, "data.covariate_scaling", ("zscore", "none"))
    _int_range(c, "data.covariate_fill", 0, 1_000_000)
    _bool(c, "data.synthetic_covariates")


def _validate_market_series(d) -> None:
    """data.market_series: distinct symbols whose columns no data.covariates name takes."""
    symbols = d.market_series
    allowed = "a tuple of symbols, e.g. ('BTCUSDT',); () = none"
    rules.check(isinstance(symbols, (tuple, list)), "data.market_series", symbols, allowed)
    for symbol in symbols:
        ok = isinstance(symbol, str) and bool(_SYMBOL_RE.match(symbol))
        rules.check(ok, "data.market_series", symbol, "a Binance symbol like BTCUSDT")
    rules.check(len(set(symbols)) == len(symbols), "data.market_series", symbols, "no repeats")
    taken = {n.lower() for n in d.covariates} & {n.lower() for n in market_columns(symbols)}
    allowed = "symbols whose <SYM>_return, <SYM>_range columns no data.covariates name takes"
    rules.check(not taken, "data.market_series", symbols, allowed)


def _validate_name_lists(c) -> None:
    """data.symbols, intervals and features: non-empty tuples of known names, no repeats."""
    d, features = c.data, owned_names("FEATURES")
    for field, names, check, allowed in (
        ("data.symbols", d.symbols, _SYMBOL_RE.match, "Binance symbols like BTCUSDT"),
        ("data.intervals", d.intervals, INTERVAL_MS.__contains__, ", ".join(INTERVAL_MS)),
        ("data.features", d.features, features.__contains__, ", ".join(features)),
    ):
        rules.check(
            isinstance(names, (tuple, list)) and len(names) > 0, field, names, "a non-empty tuple"
        )
        for name in names:
            rules.check(isinstance(name, str) and bool(check(name)), field, name, allowed)
        rules.check(len(set(names)) == len(names), field, names, "no repeated entries")


def _validate_windows(c) -> None:
    """Window sizes, candle counts, bad rows, normalisation and the split fractions."""
    d = c.data
    _int_range(c, "data.lookback", 1, 4096)
    _int_range(c, "data.horizon", 1, 1024)
    _int_range(c, "data.max_candles", 0, 10_000_000)
    _int_range(c, "data.min_candles", 1)
    _choice(c, "data.bad_rows", ("skip_series", "drop_rows"))
    _choice(c, "data.normalization", ("last_close",))
    splits = d.splits
    ok = (
        isinstance(splits, (tuple, list))
        and len(splits) == 3
        and all(rules.is_num(s) and s > 0 for s in splits)
        and abs(sum(splits) - 1) < 1e-6
    )
    rules.check(
        ok, "data.splits", splits, "three positive fractions (train, val, test) summing to 1"
    )


def _validate_model(c) -> None:
    """config.model: the registered model's own fields (its dataclass's rules); every
    config.model entry is a field of the model's config dataclass (cpbjax.models)."""
    from cpbjax import models  # The registry imports jax: only when a config is validated.

    models.validate_group(c.model)
    _validate_outputs(c)


def _validate_outputs(c) -> None:
    """The loss and its scaling."""
    _choice(c, "train.loss", LOSSES)
    _choice(c, "train.loss_scale", LOSS_SCALES)


def _validate_train(c) -> None:
    _choice(c, "train.optimizer", ("adam", "adamw"))
    for field, bounds in _SWEEPABLE_RANGES.items():
        _num_range(c, f"train.{field}", *bounds)
    _int_range(c, "train.batch_size", 1, 65536)
    _int_range(c, "train.epochs", 0, 100_000)  # 0 only with train.init_from (config_rules)
    _int_range(c, "train.patience", 1)
    _num_range(c, "train.min_delta", 0, 1e6)
    _num_range(c, "train.grad_clip", 0, 1e6, lo_open=True)
    _num_range(c, "train.warmup_fraction", 0, 1, hi_open=True)
    _num_range(c, "train.warmup_init_factor", 0, 1)
    _num_range(c, "train.final_lr_factor", 0, 1)
    _num_range(c, "train.teacher_forcing", 0, 1)
    _int_range(c, "train.group_size", 0)
    _choice(c, "train.share", SHARES)
    _int_range(c, "train.pooled_chunk", 0, 1_000_000)
    _bool(c, "train.compact_groups")
    _int_range(c, "train.stream_chunk_steps", 0, 1_000_000)
    init_from = c.train.init_from
    rules.check(
        isinstance(init_from, str), "train.init_from", init_from, "a workdir path, '' = none"
    )


def _check_interval_levels(levels) -> None:
    ok = isinstance(levels, (tuple, list)) and all(rules.is_num(q) for q in levels)
    ok = ok and (not levels or (len(levels) == 2 and 0 < levels[0] < 0.5 < levels[1] < 1))
    allowed = "() or (lower, upper) with 0 < lower < 0.5 < upper < 1"
    rules.check(ok, "eval.interval_levels", levels, allowed)


def _cache_folder(value, field: str) -> None:
    """A cache's setting: "auto" (or ""), "off" or a folder path."""
    rules.check(
        isinstance(value, str) and value.strip() == value,
        field,
        value,
        "'auto' (or ''), 'off' or a folder path without surrounding spaces",
    )


def _validate_rest(c) -> None:
    _int_range(c, "ckpt.every_epochs", 1)
    _int_range(c, "ckpt.keep", 1)
    _bool(c, "eval.save_forecasts")
    _check_interval_levels(c.eval.interval_levels)
    _bool(c, "eval.refit_band")
    _bool(c, "eval.column_fallback")
    _bool(c, "eval.print_table")
    _int_range(c, "eval.plot_windows", 0, 100)
    _int_range(c, "eval.plot_workers", 0, 64)
    _cache_folder(c.eval.baseline_cache, "eval.baseline_cache")
    _bool(c, "predict.fresh")
    _int_range(c, "backtest.folds", 1, 1000)
    for field in ("step", "window", "min_train_windows"):
        _int_range(c, f"backtest.{field}", 0, 10_000_000)
    for name in c.predict.symbols:
        rules.check(bool(_SYMBOL_RE.match(name)), "predict.symbols", name, "Binance symbols")
    for name in c.predict.intervals:
        rules.check(name in INTERVAL_MS, "predict.intervals", name, ", ".join(INTERVAL_MS))
    _choice(c, "logging.progress", ("auto", "rich", "plain"))
    _bool(c, "logging.tensorboard")


def validate(config, defaults):
    """Checks every field, then the rules between fields (config_rules.check_combinations,
    which never refuses a value of `defaults`, the schema); raises ConfigError on the
    first bad one. Returns config."""
    _validate_top(config)
    _validate_protocol(config)
    _validate_data(config)
    _validate_model(config)
    _validate_train(config)
    _validate_rest(config)
    _validate_sweep(config)
    _validate_serve(config)
    rules.check_combinations(config, defaults)
    return config


def _validate_protocol(c) -> None:
    """data.symbols' named lists (cpbjax/data/pairs.py), expanded in place so config.json
    records the symbols, and data.split_dates: () or two ordered dates."""
    symbols = c.data.symbols
    try:
        expanded = pairs.expand(symbols) if isinstance(symbols, (tuple, list)) else symbols
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if expanded is not symbols:
        c.data.symbols = expanded
    dates = c.data.split_dates
    allowed = "() or (VAL_START, TEST_START): two dates as YYYY-MM or YYYY-MM-DD (UTC), in order"
    rules.check(
        isinstance(dates, (tuple, list)) and len(dates) in (0, 2),
        "data.split_dates",
        dates,
        allowed,
    )
    try:
        times = [split_date_ms(d) for d in dates]
    except ValueError as e:
        raise ConfigError(f"data.split_dates={tuple(dates)}: {e}; expected {allowed}") from None
    rules.check(times == sorted(set(times)), "data.split_dates", dates, allowed)


def _validate_sweep(c) -> None:
    """sweep.<field>: only per-coin hyperparameters (sweep_grid.FIELDS), each a tuple of
    distinct allowed values of its train field; anything else is refused with the reason;
    a grid of more than sweep.max_settings settings is refused with its projected cost."""
    for field in c.sweep:
        if field not in ("select", "max_settings") and field not in sweep_grid.FIELDS:
            raise ConfigError(sweep_grid.refusal(field))
    for field in sweep_grid.FIELDS:
        values = c.sweep[field]
        name = f"sweep.{field}"
        allowed = f"a tuple of distinct values, each allowed for train.{field}"
        rules.check(isinstance(values, (tuple, list)), name, values, allowed)
        rules.check(len(set(values)) == len(values), name, values, allowed)
        for v in values:
            rules.num_in(name, v, *_SWEEPABLE_RANGES[field])
    _choice(c, "sweep.select", sweep_grid.SELECT)
    _int_range(c, "sweep.max_settings", 1)
    sweep_grid.check_size(c)  # here, so a grid over the cap is refused before data loads


def _validate_serve(c) -> None:
    host = c.serve.host
    rules.check(
        isinstance(host, str) and bool(host.strip()), "serve.host", host, "a host name or IP"
    )
    _int_range(c, "serve.port", 1, 65535)
