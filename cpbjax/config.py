"""The config schema shared by every configs/*.py file, its variants and its validation.

`base_config()` is the schema: every field with its documentation. Each
configs/<model>.py body sets the default run of its model on real data, and
`apply_variant` turns it into a named variant (demo, tiny, replaced).
`validate()` checks the whole config before anything downloads or compiles,
and raises `ConfigError` naming the field, the value and what is allowed. Names
that other modules own (data sources, models, features, aux targets) are read from
them when validating, and config.model is checked by the registered model's config
dataclass (`cpbjax.models.validate_group`), so user-registered ones are allowed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re

import ml_collections

from cpbjax import config_history, sweep_grid
from cpbjax import config_rules as rules
from cpbjax.config_rules import ConfigError as ConfigError  # config_lib.ConfigError, as before
from cpbjax.data import pairs
from cpbjax.data.pairs import CONFIRMATION_SYMBOLS as CONFIRMATION_SYMBOLS
from cpbjax.data.pairs import TUNING_SYMBOLS as TUNING_SYMBOLS
from cpbjax.data.series import INTERVAL_MS, split_date_ms

DEFAULT_SYMBOLS = (
    "BTCUSDT",
    "ETHUSDT",
    "BNBUSDT",
    "XRPUSDT",
    "LTCUSDT",
    "ADAUSDT",
    "SOLUSDT",
    "DOGEUSDT",
    "AVAXUSDT",
    "LINKUSDT",
    "UNIUSDT",
    "ATOMUSDT",
    "NEARUSDT",
    "DYDXUSDT",
    "ARBUSDT",
    "OPUSDT",
    "PEPEUSDT",
    "INJUSDT",
    "SHIBUSDT",
    "LUNAUSDT",
)
DEFAULT_INTERVALS = ("15m", "1h")
SHARES = ("series", "pooled")  # train.share: a model per series, or one for the run

# Name lists that other modules own, read from the owner each time they are asked for
# (`config.SOURCES`, or validate()), so a source or model registered from user code is
# allowed. Imported only then: the owners import jax, requests, scipy, and never config.
_OWNED_NAMES = {
    "SOURCES": ("cpbjax.data.sources", lambda m: tuple(m.SOURCES)),
    "MODELS": ("cpbjax.models", lambda m: tuple(m.REGISTRY)),
    "FEATURES": ("cpbjax.data.features", lambda m: tuple(m.NAMES)),
    "AUX_TARGETS": ("cpbjax.data.auxiliary", lambda m: tuple(m.FUNCTIONS)),
    "LOSSES": ("cpbjax.losses", lambda m: m.LOSSES),
    "LOSS_SCALES": ("cpbjax.losses", lambda m: m.LOSS_SCALES),
}
# config.model entries that the run reads (windows, the loss), not the model; every
# other config.model entry is a field of the model's config dataclass (cpbjax.models).
_RUN_MODEL_ENTRIES = ("aux_targets", "aux_weight")
# (lo, hi, lo_open) of the train fields a sweep can set per coin: train.<field> and each
# value of sweep.<field> obey the same range.
_SWEEPABLE_RANGES = {"learning_rate": (0, 10, True), "weight_decay": (0, 1, False)}
_SYMBOL_RE = re.compile(r"^[A-Z0-9]{2,20}$")


def __getattr__(name: str):
    """config.SOURCES, MODELS, FEATURES, AUX_TARGETS: the names their owners hold now."""
    if name in _OWNED_NAMES:
        return _names(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _names(kind: str) -> tuple[str, ...]:
    owner, read = _OWNED_NAMES[kind]
    return read(importlib.import_module(owner))


def base_config() -> ml_collections.ConfigDict:
    """The schema: every field of a cpbjax run with its documentation; configs/<model>.py
    set the default run (a model's fields, its size, schedule and objective)."""
    c = ml_collections.ConfigDict()
    c.seed = 0  # Root PRNG seed; each coin gets its own stream folded from it.
    c.platform = "auto"  # cpu | gpu | tpu | auto. `gpu` without a usable GPU is an error.
    c.matmul_precision = "default"  # highest | high | default (JAX's counterpart of TF32).
    c.dtype = "float32"  # Compute dtype: float32 | bfloat16. Params stay float32.

    # Multi-host training (docs/design.md "Multi-host runs"); all processes run the same command.
    c.distributed = h = ml_collections.ConfigDict()
    h.enabled = False  # Call jax.distributed.initialize() before anything touches a device.
    h.coordinator_address = ""  # host:port of process 0; "" = auto-detect (SLURM, Open MPI).
    h.num_processes = 0  # Processes in the run; 0 = auto-detect.
    h.process_id = -1  # This process' index; -1 = auto-detect.

    c.data = d = ml_collections.ConfigDict()
    d.source = "binance"  # binance | local | synthetic (see cpbjax/data/sources.py).
    d.symbols = DEFAULT_SYMBOLS  # Binance spot symbols, a tuple.
    d.intervals = DEFAULT_INTERVALS  # Kline intervals, a tuple.
    d.base_url = "https://data.binance.vision"  # Host, local mirror dir or file:// URL.
    # Exchange REST host whose /api/v3/klines tops the Vision history up to now
    # (the `binance_rest` source; --mode predict and serve use it on binance data).
    d.api_url = "https://api.binance.com"
    d.local_dir = ""  # `local` source: folder of <SYMBOL>-<INTERVAL>.csv/.parquet files.
    d.cache_dir = "~/.cache/cpbjax"  # Where verified downloads are kept.
    d.months = 12  # Newest monthly files per series; 0 = every month the source has.
    d.end = ""  # Last month to use, YYYY-MM; "" = the last complete month.
    d.include_daily = False  # Also fetch the current month's daily files.
    d.max_candles = 5000  # Keep the newest this many candles of each series; 0 = all.
    d.min_candles = 5000  # Skip a series with fewer usable candles than this.
    d.bad_rows = "skip_series"  # skip_series | drop_rows: what invalid candles do.
    d.features = ("open", "high", "low", "close")  # Model inputs (features.NAMES).
    d.lookback = 30  # Input candles per window (L).
    d.horizon = 10  # Forecast candles per window (H); targets are OHLC.
    d.splits = (0.70, 0.15, 0.15)  # Chronological train / val / test fractions.
    d.normalization = "last_close"  # last_close | candle_minmax (lossy, legacy).
    d.download_workers = 8  # Parallel downloads.
    d.timeout_seconds = 30.0  # Per-request timeout.
    d.retries = 5  # Retries per request (connection errors, 429, 5xx).
    d.synthetic_candles = 6000  # `synthetic` source: candles generated per series.
    # Calendar splits, (VAL_START, TEST_START) as YYYY-MM or YYYY-MM-DD (UTC): train windows
    # end before the first date, val targets lie between, test targets after the second,
    # the same span for every series; windows straddling a date are dropped. A series
    # ending before the first date is training data only. () = data.splits per series.
    d.split_dates = ()

    c.model = m = ml_collections.ConfigDict()
    m.name = "transformer"  # transformer | gru | lstm (see cpbjax/models/__init__.py).
    # direct | autoregressive: on 40 real series direct tied or beat autoregressive on
    # validation, its epochs taking 58-69% of the time (docs/performance.md "Decoding
    # modes"); the replaced system's was autoregressive.
    m.decoding = "direct"
    m.aux_targets = ()  # Multi-task head's extra targets: bb_position, realized_vol; () = none.
    m.aux_weight = 0.1  # Weight of the auxiliary MSE in the training loss (not in val loss).
    # none | vol_band: the network outputs a correction added to this forecast computed
    # from the window (the last close for open/close, plus a range band for high/low). Its
    # output layer starts at zero, so an untrained model IS the baseline. vol_band +
    # train.loss=mae + loss_scale=persistence won on validation on 40 real series
    # (docs/performance.md "Accuracy levers"). autoregressive decoding needs none.
    m.baseline = "vol_band"
    # none | range: the network sees price inputs in units of the window's EWMA log range,
    # and its output is multiplied back by it (per-window scaling, as RevIN); needs direct.
    m.window_scale = "none"
    # >= 1: train this many independently initialised copies of the model side by side in one
    # program (each its own init, dropout and optimizer state) and forecast the mean of
    # their log forecasts; early stopping judges that mean. Costs about that many times one model.
    m.ensemble = 1

    c.train = t = ml_collections.ConfigDict()
    t.optimizer = "adamw"  # adam | adamw.
    t.learning_rate = 1e-3  # Peak learning rate.
    t.weight_decay = 1e-2  # AdamW decoupled decay, or Adam's L2 term.
    t.batch_size = 128  # Windows per step per coin.
    t.epochs = 50  # Maximum epochs.
    t.patience = 10  # Early stopping: epochs without val improvement.
    # An epoch counts as an improvement (resets patience, becomes the kept model) only if
    # its val loss beats the best by more than min_delta standard errors of the paired val
    # gain (cpbjax/early_stopping.py); 0 = any lower val loss. One standard error won out of
    # sample for both train.share modes (docs/performance.md "One margin for both modes"),
    # where a share of the best val loss had to differ: 0.5% per series, 0.1% pooled.
    t.min_delta = 1.0
    t.grad_clip = 1.0  # Global-norm gradient clipping.
    t.warmup_fraction = 0.05  # Share of all steps spent in linear warmup.
    t.warmup_init_factor = 0.01  # Warmup starts at this x learning_rate.
    t.final_lr_factor = 0.01  # Cosine decay ends at this x learning_rate.
    t.reduce_on_plateau = False  # Also halve the lr after a plateau of val loss.
    t.plateau_factor = 0.5  # Reduce-on-plateau multiplier.
    t.plateau_patience = 8  # Reduce-on-plateau patience, in epochs.
    t.teacher_forcing = 0.5  # Per-step probability of feeding the true candle.
    # mse | mae: what the step minimises AND what
    # the val loss, early stopping and the kept model use (cpbjax/losses.py).
    t.loss = "mae"
    # none | persistence: divide each OHLC column's error by its persistence MAE on the
    # coin's train windows, so close and open do not drown high and low.
    t.loss_scale = "persistence"
    t.group_size = 0  # Coins per compiled program; 0 = as many as fit (GPU 64, CPU 4 per device).
    # series: one model per series (coins vmapped) | pooled: ONE model trained on the windows
    # of every series of the run, all in one group (cpbjax/pooled.py, docs/design.md).
    # The GRU's and the transformer's real-data runs are pooled (configs/<model>.py).
    t.share = "series"
    # With train.share=pooled: coins per chunk of the ONE gradient of a step. The chunks'
    # gradients are summed, so a step's memory holds Z·B windows' activations instead of
    # K·B (docs/performance.md "Memory of one epoch"); the same gradient up to float
    # summation order. 0 = every coin in one chunk.
    t.pooled_chunk = 0
    # Once at most half of a program's coins still train, move them into a program of their
    # own size (the stopped ones cost as much as live ones in a vmapped step). Same results
    # up to float rounding, which the MAE loss's sign gradient can grow (docs/design.md).
    t.compact_groups = True

    c.ckpt = k = ml_collections.ConfigDict()
    k.every_epochs = 5  # Save the full group train state this often.
    k.keep = 2  # Checkpoints kept per group.

    c.eval = e = ml_collections.ConfigDict()
    e.save_forecasts = False  # Write forecasts/<SERIES>.npz of every test window.
    # (lower, upper) levels of the calibrated interval fitted on val around every price
    # forecast (cpbjax/intervals.py); () = none.
    e.interval_levels = (0.1, 0.9)
    # With model.baseline=vol_band (ignored without a band): refit the band factors of the
    # trained model on its own errors over the splits before each scored one (train+val
    # for test, as the fitted baselines are); the saved model carries the train+val refit
    # (cpbjax/band_refit.py). It won on an earlier fold on 12 real series, 3 seeds of 3
    # (docs/performance.md "The default-size GRU").
    e.refit_band = True
    e.plots = True  # Write PNG plots under <workdir>/plots/.
    e.plot_windows = 3  # Test windows drawn per series.
    # Processes drawing each finished group's plots while the next group trains (spawned
    # once per run); 0 draws every plot at the end in the run's own process.
    e.plot_workers = 2

    # --mode backtest: rolling-origin folds (cpbjax/data/folds.py, docs/design.md "Backtest").
    c.backtest = b = ml_collections.ConfigDict()
    b.folds = 6  # Test blocks per series, consecutive, ending with the newest window.
    b.step = 0  # Windows (candles) between fold origins = test block size; 0 = the test split's.
    b.window = 0  # Train windows of a fold: 0 = all before its val block (expanding), else the newest this many (sliding).
    b.min_train_windows = (
        0  # A fold with fewer train windows is skipped; 0 = as many as its val block.
    )

    # Hyperparameter sweep (cpbjax/sweep.py, docs/design.md "Sweeps"): every setting of the
    # grid (the product of the non-empty tuples below) x every series trains as one coin of
    # the same compiled programs. () = not swept; other fields cannot be swept.
    c.sweep = w = ml_collections.ConfigDict()
    w.learning_rate = ()  # Peak learning rates, e.g. (3e-4, 1e-3, 3e-3), each replacing train.learning_rate.
    w.weight_decay = ()  # Weight decays, e.g. (0.0, 1e-2), each replacing train.weight_decay.
    # series: each series keeps its own best setting; pooled: all keep the one setting of
    # lowest mean val loss relative to each series' best. Chosen by validation loss only.
    w.select = "series"

    c.predict = p = ml_collections.ConfigDict()
    p.symbols = ()  # --mode predict: symbols to forecast; () = all with a model.
    p.intervals = ()  # --mode predict: intervals; () = all with a model.
    # Forecast from the newest closed candles: binance history is topped up from
    # data.api_url (source binance_rest). False forecasts from the monthly files alone.
    p.fresh = True

    c.logging = g = ml_collections.ConfigDict()
    g.progress = "auto"  # auto | rich | plain: live progress on a TTY, log lines elsewhere.
    g.tensorboard = False  # Also write the epoch scalars as TensorBoard files under <workdir>/tb/.

    c.serve = v = ml_collections.ConfigDict()
    v.host = "127.0.0.1"  # --mode serve: address to bind; only loopback unless you change it.
    v.port = 8000  # --mode serve: TCP port, 1..65535.
    return c


def load(path_and_arg: str) -> ml_collections.ConfigDict:
    """Loads `configs/x.py[:arg]` the way config_flags does, for tests and notebooks."""
    path, _, arg = path_and_arg.partition(":")
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg or None)


def upgrade(saved) -> ml_collections.ConfigDict:
    """Today's schema of a config saved by an earlier cpbjax (a workdir's or an export's
    config.json, a saved model's meta.json config, a run ledger's fingerprint).

    JSON lists come back as the tuples the schema uses; retired fields that hold their
    default are dropped, and one set to anything else is a ConfigError naming it and what
    to use instead (config_history.RETIRED); fields added since take the value that
    reproduces what the saved config did (config_history.ADDED), every other missing
    field today's default. Does not validate.
    """
    plain = saved.to_dict() if isinstance(saved, ml_collections.ConfigDict) else saved

    def tuples(v):
        if isinstance(v, dict):
            return {k: tuples(x) for k, x in v.items()}
        return tuple(tuples(x) for x in v) if isinstance(v, (list, tuple)) else v

    d = tuples(plain)
    config_history.drop_retired(d)
    config_history.fill_added(d)
    return _merge(base_config(), d)


def _merge(c: ml_collections.ConfigDict, saved: dict) -> ml_collections.ConfigDict:
    """`c` with the values of `saved`, group by group."""
    for key, value in saved.items():
        if isinstance(value, dict) and isinstance(c.get(key), ml_collections.ConfigDict):
            _merge(c[key], value)
        else:
            c[key] = value
    return c


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
    _choice(c, "data.source", _names("SOURCES"))
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
    _int_range(c, "data.retries", 0, 20)
    _int_range(c, "data.synthetic_candles", 1, 10_000_000)
    rules.check(
        tuple(d.features[:4]) == ("open", "high", "low", "close"),
        "data.features",
        d.features,
        "a tuple starting with open, high, low, close (the targets)",
    )


def _validate_name_lists(c) -> None:
    """data.symbols, intervals and features: non-empty tuples of known names, no repeats."""
    d, features = c.data, _names("FEATURES")
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
    _choice(c, "data.normalization", ("last_close", "candle_minmax"))
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
    """config.model: the registered model's own fields (its dataclass's rules), then aux."""
    from cpbjax import models  # The registry imports jax: only when a config is validated.

    models.validate_group(c.model, run_entries=_RUN_MODEL_ENTRIES)
    _validate_aux(c)
    _validate_outputs(c)


def _validate_aux(c) -> None:
    m = c.model
    names = m.aux_targets
    rules.check(
        isinstance(names, (tuple, list)),
        "model.aux_targets",
        names,
        "a tuple of auxiliary target names, () for none",
    )
    aux_names = _names("AUX_TARGETS")
    for name in names:
        rules.check(name in aux_names, "model.aux_targets", name, ", ".join(aux_names))
    rules.check(len(set(names)) == len(names), "model.aux_targets", names, "no repeated entries")
    _num_range(c, "model.aux_weight", 0, 1e6)


def _validate_outputs(c) -> None:
    """Rules between the loss, the baseline and the normalisation."""
    m = c.model
    _choice(c, "train.loss", _names("LOSSES"))
    _choice(c, "train.loss_scale", _names("LOSS_SCALES"))
    if m.baseline != "none" or m.window_scale != "none":
        rules.check(
            c.data.normalization == "last_close",
            "data.normalization",
            c.data.normalization,
            "'last_close' with model.baseline or model.window_scale (they read log ranges)",
        )


def _validate_train(c) -> None:
    _choice(c, "train.optimizer", ("adam", "adamw"))
    for field, bounds in _SWEEPABLE_RANGES.items():
        _num_range(c, f"train.{field}", *bounds)
    _int_range(c, "train.batch_size", 1, 65536)
    _int_range(c, "train.epochs", 1, 100_000)
    _int_range(c, "train.patience", 1)
    _num_range(c, "train.min_delta", 0, 1e6)
    _num_range(c, "train.grad_clip", 0, 1e6, lo_open=True)
    _num_range(c, "train.warmup_fraction", 0, 1, hi_open=True)
    _num_range(c, "train.warmup_init_factor", 0, 1)
    _num_range(c, "train.final_lr_factor", 0, 1)
    _num_range(c, "train.plateau_factor", 0, 1, lo_open=True, hi_open=True)
    _int_range(c, "train.plateau_patience", 1)
    _num_range(c, "train.teacher_forcing", 0, 1)
    _int_range(c, "train.group_size", 0)
    _choice(c, "train.share", SHARES)
    _int_range(c, "train.pooled_chunk", 0, 1_000_000)
    _bool(c, "train.reduce_on_plateau")
    _bool(c, "train.compact_groups")


def _check_interval_levels(levels) -> None:
    ok = isinstance(levels, (tuple, list)) and all(rules.is_num(q) for q in levels)
    ok = ok and (not levels or (len(levels) == 2 and 0 < levels[0] < 0.5 < levels[1] < 1))
    allowed = "() or (lower, upper) with 0 < lower < 0.5 < upper < 1"
    rules.check(ok, "eval.interval_levels", levels, allowed)


def _validate_rest(c) -> None:
    _int_range(c, "ckpt.every_epochs", 1)
    _int_range(c, "ckpt.keep", 1)
    _bool(c, "eval.save_forecasts")
    _check_interval_levels(c.eval.interval_levels)
    _bool(c, "eval.refit_band")
    _int_range(c, "eval.plot_windows", 0, 100)
    _int_range(c, "eval.plot_workers", 0, 64)
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


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Checks every field, then the rules between fields (config_rules.check_combinations);
    raises ConfigError on the first bad one. Returns config."""
    _validate_top(config)
    _validate_protocol(config)
    _validate_data(config)
    _validate_model(config)
    _validate_train(config)
    _validate_rest(config)
    _validate_sweep(config)
    _validate_serve(config)
    rules.check_combinations(config, base_config())
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
    distinct allowed values of its train field; anything else is refused with the reason."""
    for field in c.sweep:
        if field != "select" and field not in sweep_grid.FIELDS:
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


def _validate_serve(c) -> None:
    host = c.serve.host
    rules.check(
        isinstance(host, str) and bool(host.strip()), "serve.host", host, "a host name or IP"
    )
    _int_range(c, "serve.port", 1, 65535)


# The variants on small synthetic data, run in minutes on a 2-core CPU (the demo, the tests).
SMALL = ("demo", "tiny")


def apply_variant(
    c: ml_collections.ConfigDict, arg: str | None, deltas: dict
) -> ml_collections.ConfigDict:
    """`c`, a configs/<model>.py body (the default run), changed into variant `arg`.

    First the part every model's variant shares, then the model's own change
    `deltas[arg]` (dotted field -> value, the file's VARIANTS). `demo` is the README's
    offline run: all 40 default series from the synthetic source, 2000 candles and 5
    epochs, so every stage runs in a few minutes on a 2-core CPU. `tiny` is what the
    tests run: 8 synthetic series, 3 epochs. `replaced` is the default real data with the
    replaced system's objective: autoregressive decoding, no baseline, MSE on the raw
    output, no early-stopping margin (its model, size, schedule and learning rate are the
    model's delta): what benchmarks compare like for like with the torch loop.
    """
    if arg in (None, ""):
        return c
    if arg not in (*SMALL, "replaced"):
        raise ConfigError(
            f"config variant {arg!r} is not allowed: expected '', 'demo', 'tiny' or 'replaced'"
        )
    if arg == "replaced":
        c.model.decoding, c.model.baseline = "autoregressive", "none"
        c.train.loss, c.train.loss_scale, c.train.min_delta = "mse", "none", 0.0
    else:
        _small_data(c, arg)
    c.update_from_flattened_dict(deltas[arg])
    return c


def _small_data(c: ml_collections.ConfigDict, arg: str) -> None:
    """demo and tiny: synthetic series, short and few, a short schedule, frequent checkpoints."""
    c.data.source = "synthetic"
    c.data.max_candles = 2000 if arg == "demo" else 1200
    c.data.min_candles = c.data.max_candles // 2
    c.data.synthetic_candles = c.data.max_candles + 200
    c.train.epochs = 5 if arg == "demo" else 3
    c.train.patience = 2
    c.ckpt.every_epochs = 2 if arg == "demo" else 1
    if arg == "tiny":
        c.data.symbols = ("BTCUSDT", "ETHUSDT", "SOLUSDT", "XRPUSDT")
        c.train.batch_size = 32
        c.eval.plot_windows = 1
        # One group of 8 series: nothing trains beside the workers, and spawning two
        # processes (each importing jax and matplotlib) costs the suite more than it saves.
        c.eval.plot_workers = 0
