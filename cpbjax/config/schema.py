"""The config schema shared by every configs/*.py file, its variants and its upgrade.

`base_config()` is the schema: every field with its documentation. Each
configs/<model>.py body sets the default run of its model on real data, and
`apply_variant` turns it into a named variant (demo, tiny, replaced). `upgrade()`
brings a config saved by an earlier cpbjax to today's schema. `validate()` checks the
whole config before anything downloads or compiles (cpbjax/config/check.py) and raises
`ConfigError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from cpbjax import config_rules as config_rules
from cpbjax.config import check as config_check
from cpbjax.config import history as config_history
from cpbjax.config.check import SHARES as SHARES
from cpbjax.config_rules import ConfigError
from cpbjax.data.pairs import CONFIRMATION_SYMBOLS as CONFIRMATION_SYMBOLS
from cpbjax.data.pairs import TUNING_SYMBOLS as TUNING_SYMBOLS

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


def __getattr__(name: str):
    """config.SOURCES, MODELS, FEATURES: the names their owners hold now
    (config_check.OWNED_NAMES)."""
    if name in config_check.OWNED_NAMES:
        return config_check.owned_names(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    # Where each verified zip's parsed arrays are kept, keyed by its sha256, so a rerun
    # reads arrays instead of CSV (cpbjax/data/parsed_cache.py): "auto" (or "") =
    # $XDG_CACHE_HOME/cpbjax/parsed, ~/.cache/cpbjax/parsed without it; a path = that
    # folder; "off" = no cache. Never changes the candles a run sees.
    d.parsed_cache = "auto"
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
    d.normalization = "last_close"  # Log ratios to each window's last close (the only one).
    d.download_workers = 8  # Parallel downloads (a local mirror reads at most one per core).
    d.timeout_seconds = 30.0  # One request's deadline: connect, headers and whole body.
    # One Vision file's wall clock: its CHECKSUM and zip requests, retries and waits.
    d.download_deadline_s = 120.0
    d.retries = 5  # Retries per request (broken connections, 5xx); 429 waits are bounded.
    d.synthetic_candles = 6000  # `synthetic` source: candles generated per series.
    # Calendar splits, (VAL_START, TEST_START) as YYYY-MM or YYYY-MM-DD (UTC): train windows
    # end before the first date, val targets lie between, test targets after the second,
    # the same span for every series; windows straddling a date are dropped. A series
    # ending before the first date is training data only. () = data.splits per series.
    d.split_dates = ()
    # Past covariates (docs/design.md "Covariates"): extra numeric columns of each series'
    # candles, read by every window over its own data.lookback candles after the features
    # (the `local` source's files, cpbjax.fit's frames, or synthetic_covariates below);
    # names match columns case-insensitively, other columns are ignored. () = none.
    d.covariates = ()
    # zscore: each covariate scaled by its train split's mean and std (as the non-price
    # features); none: read as given (values already scale-free).
    d.covariate_scaling = "zscore"
    # A missing (NaN) covariate takes the last value at most this many candles (of the
    # interval) before it; a window whose lookback still holds a NaN is skipped, and counted
    # per series (results.json data.covariate_skipped_windows). Never filled with 0.
    d.covariate_fill = 3
    # Cross-series covariates (docs/design.md "Covariates"): per symbol, two covariate
    # columns after data.covariates, <SYM>_return (log close-to-close) and <SYM>_range
    # (log high/low) of its candle at the same open time and interval, NaN where it has
    # none (data.covariate_fill then applies). From OHLCV, so with every source; a symbol
    # not in data.symbols is loaded as an input only. E.g. ("BTCUSDT",); () = none.
    d.market_series = ()
    # `synthetic` source: scale the volatility by an exogenous process, add an exogenous
    # drift, and add the columns vol_signal and flow (their announcements over the coming
    # candles), noise and price_transform (cpbjax/data/synthetic.py).
    d.synthetic_covariates = False

    c.model = m = ml_collections.ConfigDict()
    m.name = "transformer"  # transformer | gru | lstm (see cpbjax/models/__init__.py).
    # direct | autoregressive: on 40 real series direct tied or beat autoregressive on
    # validation, its epochs taking 58-69% of the time (experiments/decoding_modes); the replaced system's was autoregressive.
    m.decoding = "direct"
    # none | vol_band: the network outputs a correction added to this forecast computed
    # from the window (the last close for open/close, plus a range band for high/low). Its
    # output layer starts at zero, so an untrained model IS the baseline. vol_band +
    # train.loss=mae + loss_scale=persistence won on validation on 40 real series
    # (experiments/accuracy_levers). autoregressive decoding needs none.
    m.baseline = "vol_band"
    # none | range: the network sees price inputs in units of the window's EWMA log range,
    # and its output is multiplied back by it (per-window scaling, as RevIN); needs direct.
    m.window_scale = "none"
    # With a model.baseline: the target columns the network corrects; the others forecast
    # the baseline's (the last close for open and close, the band for high and low).
    m.corrected_columns = ("open", "high", "low", "close")
    # >= 1: train this many independently initialised copies of the model side by side in one
    # program (each its own init, dropout and optimizer state) and forecast the mean of
    # their log forecasts; early stopping judges that mean. Costs about that many times one model.
    m.ensemble = 1

    c.train = t = ml_collections.ConfigDict()
    # adam | adamw. adamw, its decay, the batch and the patience below are the replaced
    # system's (the transformer's default run keeps them).
    t.optimizer = "adamw"
    t.learning_rate = 1e-3  # Peak learning rate.
    t.weight_decay = 1e-2  # AdamW decoupled decay, or Adam's L2 term.
    t.batch_size = 128  # Windows per step per coin.
    t.epochs = 50  # Maximum epochs.
    t.patience = 10  # Early stopping: epochs without val improvement.
    # An epoch counts as an improvement (resets patience, becomes the kept model) only if
    # its val loss beats the best by more than min_delta standard errors of the paired val
    # gain (cpbjax/training/early_stopping.py); 0 = any lower val loss. One standard error won out of
    # sample for both train.share modes (experiments/early_stopping_margin),
    # where a share of the best val loss had to differ: 0.5% per series, 0.1% pooled.
    t.min_delta = 1.0
    t.grad_clip = 1.0  # Global-norm gradient clipping.
    t.warmup_fraction = 0.05  # Share of all steps spent in linear warmup.
    t.warmup_init_factor = 0.01  # Warmup starts at this x learning_rate.
    t.final_lr_factor = 0.01  # Cosine decay ends at this x learning_rate.
    t.teacher_forcing = 0.5  # Per-step probability of feeding the true candle.
    # mse | mae: what the step minimises AND what
    # the val loss, early stopping and the kept model use (cpbjax/training/losses.py).
    t.loss = "mae"
    # none | persistence: divide each OHLC column's error by its persistence MAE on the
    # coin's train windows, so close and open do not drown high and low.
    t.loss_scale = "persistence"
    t.group_size = 0  # Coins per compiled program; 0 = as many as fit (GPU 64, CPU 4 per device).
    # series: one model per series (coins vmapped) | pooled: ONE model trained on the windows
    # of every series of the run, all in one group (cpbjax/training/pooled.py, docs/design.md).
    # The GRU's and the transformer's real-data runs are pooled (configs/<model>.py).
    t.share = "series"
    # With train.share=pooled: coins per chunk of the ONE gradient of a step, among the
    # coins each device holds. The chunks' gradients are summed, so a device's step holds
    # Z·B windows' activations instead of (K / devices)·B (docs/performance.md "Memory of one epoch"); the same gradient up to float
    # summation order. 0 = every coin in one chunk.
    t.pooled_chunk = 0
    # Once at most half of a program's coins still train, and the epochs ahead repay a
    # compile (decided from coins and epochs, not wall time), move them into a program of
    # their own size (the stopped ones cost as much as live ones in a vmapped step). Same results
    # up to float rounding, which the MAE loss's sign gradient can grow (docs/design.md).
    t.compact_groups = True
    # Steps per chunk of windows streamed from host memory, for series that do not fit in
    # device memory (cpbjax/training/streaming.py): the host gathers each chunk's windows and puts
    # the next chunk on the devices while they train on this one; the same training as the
    # default. 0 = every series in device memory, windows sliced there.
    t.stream_chunk_steps = 0
    # A trained workdir to start from, '' = none (cpbjax/modes/init_from.py): its pooled params, or
    # for a per-series run each series' own; the model's shape must match. The starting
    # model's val loss is the bar early stopping keeps, so training on other pairs or newer
    # months can only keep or improve it (best_epoch null: it was kept).
    t.init_from = ""

    c.ckpt = k = ml_collections.ConfigDict()
    k.every_epochs = 5  # Save the full group train state this often.
    k.keep = 2  # Checkpoints kept per group.

    c.eval = e = ml_collections.ConfigDict()
    e.save_forecasts = False  # Write forecasts/<SERIES>.npz of every test window.
    # (lower, upper) levels of the calibrated interval fitted on val around every price
    # forecast (cpbjax/score/intervals.py); () = none.
    e.interval_levels = (0.1, 0.9)
    # With model.baseline=vol_band (ignored without a band): refit the band factors of the
    # trained model on its own errors over the splits before each scored one (train+val
    # for test, as the fitted baselines are); the saved model carries the train+val refit
    # (cpbjax/score/band_refit.py). It won on an earlier fold on 12 real series, 3 seeds of 3
    # (experiments/early_stopping_margin).
    e.refit_band = True
    # With model.baseline=vol_band (ignored without a baseline): after training, each series
    # keeps the network's correction on a column (open, high, low, close) unless its val
    # error is above the baseline's by one standard error of the paired gain; such a column
    # forecasts the baseline's (persistence, the band). Saved with the model; results.json lists the
    # fallen-back columns as baseline_columns (cpbjax/score/column_fallback.py).
    e.column_fallback = True
    e.plots = True  # Write PNG plots under <workdir>/plots/.
    e.plot_windows = 3  # Test windows drawn per series.
    # Processes drawing each finished group's plots while the next group trains (spawned
    # once per run); 0 draws every plot at the end in the run's own process.
    e.plot_workers = 2
    # Print the per-series results table when the report is written; cpbjax.fit sets False
    # (a library call logs its summary and leaves the caller's stdout alone).
    e.print_table = True
    # Where scores read from the candles alone (the fitted baselines, the bands an interval
    # is compared with) are kept, so that a rerun on the same data (another model or
    # learning rate, --mode evaluate, a sweep) reads them back instead of refitting
    # (cpbjax/score/baseline_cache.py): "auto" (or "") = $XDG_CACHE_HOME/cpbjax/baselines,
    # ~/.cache/cpbjax/baselines without it; a path = that folder; "off" = no cache.
    # Never changes a score.
    e.baseline_cache = "auto"

    # --mode backtest: rolling-origin folds (cpbjax/data/folds.py, docs/design.md "Backtest").
    c.backtest = b = ml_collections.ConfigDict()
    b.folds = 6  # Test blocks per series, consecutive, ending with the newest window.
    b.step = 0  # Windows (candles) between fold origins = test block size; 0 = the test split's.
    b.window = 0  # Train windows of a fold: 0 = all before its val block (expanding), else the newest this many (sliding).
    b.min_train_windows = (
        0  # A fold with fewer train windows is skipped; 0 = as many as its val block.
    )

    # Hyperparameter sweep (cpbjax/modes/sweep.py, docs/design.md "Sweeps"): every setting of the
    # grid (the product of the non-empty tuples below) x every series trains as one coin of
    # the same compiled programs. () = not swept; other fields cannot be swept.
    c.sweep = w = ml_collections.ConfigDict()
    w.learning_rate = ()  # Peak learning rates, e.g. (3e-4, 1e-3, 3e-3), each replacing train.learning_rate.
    w.weight_decay = ()  # Weight decays, e.g. (0.0, 1e-2), each replacing train.weight_decay.
    # series: each series keeps its own best setting; pooled: all keep the one setting of
    # lowest mean val loss relative to each series' best. Chosen by validation loss only.
    w.select = "series"
    # The most settings a grid may have (checked at validation, before any data is read):
    # each setting trains one model per series, as much work as the run without a sweep.
    w.max_settings = 64

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
    field today's default; a value another field's value ignores takes its default
    (config_rules.IGNORED: nothing it does changes). Does not validate.
    """
    plain = saved.to_dict() if isinstance(saved, ml_collections.ConfigDict) else saved

    def tuples(v):
        if isinstance(v, dict):
            return {k: tuples(x) for k, x in v.items()}
        return tuple(tuples(x) for x in v) if isinstance(v, (list, tuple)) else v

    d = tuples(plain)
    config_history.drop_retired(d)
    config_history.fill_added(d)
    upgraded = _merge(base_config(), d)
    config_rules.reset_ignored(upgraded, base_config())  # values it accepted but ignored
    return upgraded


def _merge(c: ml_collections.ConfigDict, saved: dict) -> ml_collections.ConfigDict:
    """`c` with the values of `saved`, group by group."""
    for key, value in saved.items():
        if isinstance(value, dict) and isinstance(c.get(key), ml_collections.ConfigDict):
            _merge(c[key], value)
        else:
            c[key] = value
    return c


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Checks every field, then the rules between fields; raises ConfigError on the first
    bad one (cpbjax/config/check.py). Returns config, its named symbol lists expanded."""
    return config_check.validate(config, base_config())


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
    if arg not in deltas:
        allowed = ", ".join(repr(v) for v in ("", *deltas))
        raise ConfigError(f"config variant {arg!r} is not allowed: expected {allowed}")
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
