"""The Python API: train a run, load a trained model, forecast the next candles from a DataFrame.

    import cpbjax
    results = cpbjax.train("configs/gru.py:demo", "runs/demo")   # what launch.py runs
    models = cpbjax.fit({"BTCUSDT-1h": candles_df})              # or from frames
    model = cpbjax.load("runs/demo/models/BTCUSDT-1h")            # or an exported folder
    forecast = model.predict(candles_df)                         # the next H candles
    run = cpbjax.load("runs/pooled")                              # a whole (pooled) run
    forecast = run.predict(new_pair_df, symbol="NEWUSDT")         # any pair, zero-shot
    folders = cpbjax.export("runs/demo")                          # portable model folders

`candles_df` is an ordinary pandas OHLCV frame (columns open, high, low, close, volume;
volume may be left out where no feature of data.features reads it; fit also keeps the
data.covariates columns, NaN where missing) indexed by timezone-aware UTC open times. The model's saved normalisation is applied, and the
forecast candles are made consistent (high >= max(open, close), low <= min(open, close);
see forecast.consistent_ohlc).
"""

from __future__ import annotations

import io
import os
import tempfile

import ml_collections
import numpy as np
import pandas as pd
from absl import logging

from cpbjax import config_rules as rules
from cpbjax import runtime, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config import sweep_grid
from cpbjax.data import frames as frames_lib
from cpbjax.data import local_files, parsing, windows
from cpbjax.data.series import INTERVAL_MS, CovariateError, Series, SeriesSkipped
from cpbjax.modes import driver, sweep, trained_run
from cpbjax.modes import export as export_mode
from cpbjax.report import tables
from cpbjax.score import forecast, saved, zero_shot
from cpbjax.training import sharing

# The config `fit` trains with when given none: the GRU's default run.
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "gru.py")


def train(config: str | ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains and evaluates every series of a config, as `python launch.py` does.

    Args:
      config: a ConfigDict, or a config path with an optional variant, e.g.
        "configs/gru.py:demo".
      workdir: the run folder (rerunning resumes it).

    Returns:
      The results dict written to <workdir>/results.json (with a sweep, that of the
      chosen settings; the whole grid is in <workdir>/sweep.json).
    """
    if isinstance(config, str):
        config = config_lib.load(config)
    runtime.configure(config_lib.validate(config))
    if sweep_grid.is_sweep(config):
        sweep.run_sweep(config, workdir)  # results.json holds the chosen settings
        return writers.read_json(workdir_lib.results_json(workdir))
    return driver.train_and_evaluate(config, workdir)


def fit(
    frames: dict[str, pd.DataFrame] | pd.DataFrame,
    config: str | ml_collections.ConfigDict | None = None,
    workdir: str | None = None,
) -> dict[str, Model]:
    """Trains and evaluates on pandas frames of candles, as `train` does from a data source.

    Every frame is checked as `Model.predict` checks its frame, then written to
    <workdir>/frames/<SERIES>.parquet, which the run reads as its `local` data source: the
    workdir is an ordinary run that resumes and that every --mode reads.

    Args:
      frames: {series name: frame}, names <SYMBOL>-<INTERVAL> such as "BTCUSDT-1h", or
        one long frame whose `series` column names each row's series (in sorted order,
        which sets each series' seed); each as `Model.predict` takes it (a missing volume
        is written as 0, allowed only where no feature reads it), with the config's
        data.covariates columns (docs/guide.md "Bring your own data").
      config: as `train` takes; None: the GRU's default run (configs/gru.py). The
        frames set its data source and series (data.symbols x data.intervals: a pair
        without a frame is skipped with its reason).
      workdir: the run folder; None: a new temporary folder (logged; nothing is printed).

    Returns:
      series name -> its trained Model, in the frames' order; a series the run skipped
      (e.g. fewer candles than data.min_candles) is logged with its reason and left out.

    Raises:
      ValueError, TypeError: a bad frame (named by its series, as Model.predict names
        the problem), a bad config value (ConfigError), or frames that differ from
        those of the run already in `workdir`. driver.NothingTrained: no series trained.
    """
    config = _fit_config(config)
    series = _frames_series(frames, frames_lib.volume_features(config.data), config.data.covariates)
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix="cpbjax-fit-")
        logging.info("cpbjax.fit: the run's folder is %s", workdir)
    config.data.local_dir = _write_frames(series, workdir)
    config.data.symbols = tuple(dict.fromkeys(s.symbol for s in series.values()))
    config.data.intervals = tuple(dict.fromkeys(s.interval for s in series.values()))
    trained = _train_logged(config, workdir, series)
    return {n: load(workdir_lib.series_model(workdir, n)) for n in series if n in trained}


def _train_logged(config, workdir: str, series: dict[str, Series]) -> dict:
    """`train` on fit's `series`: its results' series. The candles data.max_candles cuts,
    the workdir and the summary are logged; the results table is not printed
    (eval.print_table=False): a library call leaves the caller's stdout alone."""
    _log_cut(series, config.data)
    config.eval.print_table = False
    results = train(config, workdir)
    logging.info(
        "cpbjax.fit: trained %d of %d series in %s (report %s)",
        len(results["series"]),
        len(series),
        workdir,
        workdir_lib.report_md(workdir),
    )
    for line in tables.summary_lines(results):
        logging.info("cpbjax.fit: %s", line)
    return results["series"]


def _log_cut(series: dict[str, Series], data_cfg) -> None:
    """Warns in one line of the candles data.max_candles leaves out of training (the
    newest max_candles past the indicator warm-up are kept; a variant such as :tiny sets
    a low cap), which a caller who handed fit whole frames would not expect."""
    if not data_cfg.max_candles:
        return
    cut = {}
    for name, s in series.items():
        _, first_valid = windows.series_features(s, data_cfg.features)
        start = windows.newest_start(len(s.ohlcv), first_valid, data_cfg.max_candles)
        if start > first_valid:
            cut[name] = start - first_valid
    if cut:
        shown = ", ".join(f"{n} {c:,}" for n, c in list(cut.items())[:3])
        logging.warning(
            "cpbjax.fit: data.max_candles=%d keeps the newest %d candles of each series past "
            "the indicator warm-up: %s candles of %d series left out (%s%s); "
            "data.max_candles=0 keeps them all",
            data_cfg.max_candles,
            data_cfg.max_candles,
            f"{sum(cut.values()):,}",
            len(cut),
            shown,
            f" and {len(cut) - 3} more" if len(cut) > 3 else "",
        )


def _fit_config(config) -> ml_collections.ConfigDict:
    """A copy of fit's `config` that reads the `local` source, the other sources' fields
    at their defaults (they would be refused as ignored)."""
    if config is None:
        config = config_lib.load(DEFAULT_CONFIG)
    elif isinstance(config, str):
        config = config_lib.load(config)
    else:
        config = config.copy_and_resolve_references()
    config.data.source = "local"
    rules.reset_ignored(config, config_lib.base_config())
    return config


def _frames_series(frames, volume_read_by, covariate_names=()) -> dict[str, Series]:
    """{series name: its validated Series} of fit's `frames` (a dict or a long frame)."""
    if isinstance(frames, pd.DataFrame):
        if "series" not in frames.columns:
            raise ValueError("a long frame needs a 'series' column naming each row's series")
        groups = frames.groupby("series", dropna=False)  # sorted: rows may come in any order
        frames = {name: part.drop(columns="series") for name, part in groups}
    if not isinstance(frames, dict) or not frames:
        raise TypeError("frames must be a non-empty dict {series name: DataFrame} or a DataFrame")
    out = {}
    for name, frame in frames.items():
        symbol, interval = saved.parse_series(str(name))
        if interval not in INTERVAL_MS:
            raise ValueError(f"series name {name!r} is not <SYMBOL>-<INTERVAL>, e.g. BTCUSDT-1h")
        try:
            out[str(name)] = frames_lib.candles_to_series(
                frame, symbol, interval, volume_read_by, covariate_names
            )
        except (ValueError, TypeError) as e:
            raise type(e)(f"{name}: {e}") from None
    return out


def _write_frames(series: dict[str, Series], workdir: str) -> str:
    """Writes each Series to workdir_lib.frames_file; returns their folder. A file already
    there must hold the same candles (and covariates): a resumed run reads its own data."""
    paths = {name: workdir_lib.frames_file(workdir, name) for name in series}
    for name, path in paths.items():
        if os.path.exists(path):
            s = series[name]
            times, values = local_files.read_local_file(path, s.covariate_names, name)
            same = np.array_equal(values, _frame_values(s), equal_nan=True)
            if not (np.array_equal(times, s.open_time_ms) and same):
                raise ValueError(f"{path} holds other candles of {name}: fit into a new workdir")
    for name, path in paths.items():
        s = series[name]
        table = pd.DataFrame(_frame_values(s), columns=[*parsing.OHLCV, *s.covariate_names])
        table.insert(0, "open_time", s.open_time_ms)
        buf = io.BytesIO()
        table.to_parquet(buf, index=False)
        writers.atomic_write(path, buf.getvalue())
    return workdir_lib.frames_dir(workdir)


def _frame_values(s: Series) -> np.ndarray:
    """float64 [T, 5 + K]: a series' OHLCV, then its covariates (a frames file's columns)."""
    return np.concatenate([s.ohlcv, s.covariates], axis=1)


def export(workdir: str, config: str | ml_collections.ConfigDict | None = None) -> dict:
    """Writes <workdir>/export/<SERIES>/ for every trained series (see cpbjax/modes/export.py).

    Args:
      workdir: a trained run. config: optional; its predict.symbols / predict.intervals
        restrict the series (default: the run's own config.json, i.e. all series).

    Returns:
      series name -> export folder.
    """
    if config is None:
        config = config_lib.upgrade(writers.read_json(workdir_lib.config_json(workdir)))
    elif isinstance(config, str):
        config = config_lib.load(config)
    return export_mode.run_export(config, workdir)


def load(path: str) -> Model | RunModel:
    """A trained series model: <workdir>/models/<SERIES>/ or an --mode export folder; or a
    whole trained run, <workdir> (a `RunModel`: any series of a pooled run).

    Either folder is first verified against its manifest: one that does not match (a
    flipped bit, an edited meta.json field, a folder named after another series) is a
    ValueError naming the file; a saved model from before manifests loads with a warning.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not a model folder")
    if os.path.isdir(workdir_lib.models_dir(path)):  # a run's folder, not one model's
        return RunModel(path)
    if export_mode.is_export(path):  # verified against its manifest, which names the series
        loaded, name = export_mode.load_export(path), export_mode.exported_series(path)
    else:
        loaded, name = saved.load_model(path), os.path.basename(os.path.normpath(path))
    symbol, interval = saved.parse_series(name)
    if interval not in INTERVAL_MS:
        raise ValueError(f"{path}: the folder name is not <SYMBOL>-<INTERVAL>, e.g. BTCUSDT-1h")
    return Model(loaded, symbol, interval)


class Model:
    """One trained series model: `predict` forecasts from the newest candles given."""

    def __init__(self, loaded: saved.LoadedModel, symbol: str, interval: str):
        self.loaded, self.symbol, self.interval = loaded, symbol, interval

    @property
    def config(self) -> ml_collections.ConfigDict:
        """The config the model was trained with."""
        return self.loaded.trained

    @property
    def lookback(self) -> int:
        return self.config.data.lookback

    @property
    def horizon(self) -> int:
        return self.config.data.horizon

    def predict(self, candles: pd.DataFrame) -> pd.DataFrame:
        """The next H candles after the newest row of `candles`.

        A covariate model (data.covariates) reads those columns of `candles` too, filled
        as in training (data.covariate_fill) and scaled with its saved statistics.

        Returns:
          A DataFrame indexed by the forecast candles' UTC open times, with columns
          step (1..H), open, high, low, close (prices); a model with a calibrated
          interval adds open_lower ... close_upper.
          The interval's width averages the range of the last week of candles (the
          saved calibration's `scale`); from fewer it is logged as not the interval
          that test scored.

        Raises:
          ValueError, TypeError: bad input, naming the problem (too few candles, a gap
            in the newest L candles, the wrong interval, NaN, ...; a data.covariates
            column absent or not numeric, or still missing in the newest L candles after
            data.covariate_fill); or a forecast of NaN or inf prices
            (forecast.NonFiniteForecast, naming the series), never returned.
        """
        model, d = self.loaded, self.config.data
        try:
            series = frames_lib.candles_to_series(
                candles, self.symbol, self.interval, frames_lib.volume_features(d), d.covariates
            )
            doc = zero_shot.from_candles(model, series)
        except (SeriesSkipped, CovariateError) as e:
            reason, name = str(e), f"{self.symbol}-{self.interval}"
            named = reason if reason.startswith(name) else f"{name}: {reason}"
            raise ValueError(named) from None
        out = pd.DataFrame([forecast.flat_candle(c) for c in doc["forecast"]])
        out = out.drop(columns=["open_time"])
        out.index = pd.to_datetime(out.pop("open_time_ms"), unit="ms", utc=True)
        out.index.name = "open_time"
        return out


# The symbol a RunModel forecast is named by when predict() is given none.
UNNAMED = "UNNAMED"


class RunModel:
    """Every series of one trained run (`load(<workdir>)`).

    `predict(candles, symbol)` forecasts with the series' own saved model where the run
    has one; a pooled run (train.share=pooled) forecasts any other pair or interval with
    its shared model, fitting that series' normalisation, band and interval on the
    candles given (cpbjax/score/zero_shot.py). A per-series run has no model for a series it
    did not train: a ValueError names it.
    """

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.available = saved.available_models(workdir)
        self.pooled = sharing.from_config(trained_run.run_config_of(workdir).train).one_model

    def model_for(self, symbol: str | None, interval: str) -> Model:
        """The Model that forecasts symbol-interval (see the class docstring)."""
        name = f"{symbol or UNNAMED}-{interval}"
        if name in self.available:
            return Model(saved.load_model(self.available[name]), symbol, interval)
        if not self.pooled:
            raise ValueError(
                f"{name}: no model in {self.workdir}, which trained a model per series "
                f"(train.share='series'){trained_run.UNSEEN_HINT}"
            )
        base = saved.load_model(next(iter(self.available.values())))
        return Model(trained_run.shared_model(base), symbol or UNNAMED, interval)

    def predict(self, candles: pd.DataFrame, symbol: str | None = None) -> pd.DataFrame:
        """`Model.predict` of the candles' series: `symbol` (None: one the run never saw)
        at the candles' interval (`candles_interval`)."""
        return self.model_for(symbol, frames_lib.candles_interval(candles)).predict(candles)
