"""End to end on a run trained from a Vision-layout mirror: --mode predict with fresh candles
from a fake exchange, and the Python API (cpbjax.train / load / export / Model.predict)."""

import datetime
import json
import logging
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import band, models, writers
from cpbjax import workdir as workdir_lib
from cpbjax.columns import COLUMNS
from cpbjax.config import schema as config_lib
from cpbjax.data import sources, synthetic, windows
from cpbjax.data.series import INTERVAL_MS
from cpbjax.modes import trained_run
from cpbjax.score import evaluate
from cpbjax.training import checkpoint, memory
from tests import fake_data
from tests.fake_exchange import FakeExchange, running

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = INTERVAL_MS["1h"]
PREDICT = (sys.executable, "launch.py", "--mode=predict")


def _config(mirror: str):
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.source, c.data.base_url, c.data.months = "binance", mirror, 2
    c.data.symbols, c.data.intervals = ("BTCUSDT",), ("1h",)
    c.train.epochs, c.eval.plots = 1, False
    return c


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, mirror, results): tiny GRU trained by cpbjax.train on a 2-month mirror."""
    root = tmp_path_factory.mktemp("api")
    mirror = str(root / "mirror")
    synthetic.write_vision_mirror(mirror, ("BTCUSDT",), ("1h",), fake_data.last_complete_months(2))
    workdir = str(root / "run")
    return workdir, mirror, cpbjax.train(_config(mirror), workdir)


def test_the_saved_model_is_the_one_test_scored_with_its_band_refit(run):
    """Training saves each series' model with its band refit on train+val (eval.refit_band,
    on by default): scored again it has nothing left to refit, and scores as test did."""
    workdir, mirror, results = run
    cfg = config_lib.validate(_config(mirror))
    (series,), _ = sources.load_all(cfg.data)
    prep = windows.prepare_series(series, cfg.data)
    entry = results["series"][prep.name]
    assert len(entry["test"]["band_refit"]["high"]) == cfg.data.horizon
    params, _ = checkpoint.load_series_model(workdir_lib.series_model(workdir, prep.name))
    module = models.build(models.make_config(cfg))
    L, H = cfg.data.lookback, cfg.data.horizon
    again = evaluate.evaluate_model(
        module, params, prep, evaluate.EvalSpec(L, H, refit_band=True)
    ).entry
    np.testing.assert_allclose(again["test"]["band_refit"]["high"], 0, atol=1e-4)
    np.testing.assert_allclose(again["test"]["band_refit"]["low"], 0, atol=1e-4)
    for col in ("high", "low", "close"):
        got, want = again["test"]["columns"][col]["mae"], entry["test"]["columns"][col]["mae"]
        assert got == pytest.approx(want, rel=1e-6)


def _history(mirror: str):
    """The mirror's candles as a UTC-indexed OHLCV DataFrame."""
    (series,), _ = sources.load_all(_config(mirror).data)
    frame = pd.DataFrame(series.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame.index = pd.to_datetime(series.open_time_ms, unit="ms", utc=True)
    return series, frame


def _flat_after(last_close: float):
    """Fresh candles for the fake exchange: flat at the history's last close."""

    def ohlcv(times):
        return np.tile([last_close, last_close, last_close, last_close, 1.0], (len(times), 1))

    return ohlcv


def test_predict_forecasts_from_the_newest_closed_candle_of_a_fake_exchange(run):
    workdir, mirror, _ = run
    series, _ = _history(mirror)
    now_ms = int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000)
    start = int(series.open_time_ms[-1]) + STEP
    times = np.arange(start, now_ms // STEP * STEP + STEP, STEP, dtype=np.int64)  # + open one
    exchange = FakeExchange(times, _flat_after(float(series.ohlcv[-1, 3])))
    with running(exchange) as api_url:
        proc = subprocess.run(
            [*PREDICT, f"--workdir={workdir}", f"--config.data.api_url={api_url}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(workdir, "forecast.json")) as f:
        doc = json.load(f)
    fc = doc["series"]["BTCUSDT-1h"]
    # The newest candle closed when the test started, or the one open then if the hour
    # turned while it ran; never the open one, never an older one.
    assert fc["last_open_time_ms"] in (int(times[-2]), int(times[-1])) and fc["age_intervals"] == 1
    assert fc["forecast"][0]["open_time_ms"] == fc["last_open_time_ms"] + STEP
    assert f"newest closed candle {fc['last_open_time']} (up to date)" in proc.stdout
    assert "wrote" in proc.stdout and "predictions" in proc.stdout
    assert exchange.requests  # the fresh candles did come from the fake exchange


def test_predict_from_monthly_files_alone_says_it_is_stale(run):
    workdir, _, _ = run
    proc = subprocess.run(
        [*PREDICT, f"--workdir={workdir}", "--config.predict.fresh=False"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "STALE" in proc.stderr and "intervals old" in proc.stdout
    assert "--config.predict.fresh=True tops it up" in proc.stderr  # the hint for its source


def test_model_predict_equals_the_run_model_and_its_export(run):
    workdir, mirror, results = run
    assert results["series"]["BTCUSDT-1h"]["status"] in ("trained", "stopped_early")
    _, frame = _history(mirror)
    model = cpbjax.load(os.path.join(workdir, "models", "BTCUSDT-1h"))
    fc = model.predict(frame)
    bounds = [f"{col}_{side}" for side in ("lower", "upper") for col in COLUMNS]
    assert list(fc.columns) == ["step", *COLUMNS, *bounds]
    _check_interval(model, frame, fc, results["series"]["BTCUSDT-1h"]["test"])
    assert fc.index[0] == frame.index[-1] + pd.Timedelta(hours=1) and len(fc) == model.horizon
    assert (fc["high"] >= fc[["open", "close"]].max(axis=1)).all()
    assert (fc["low"] <= fc[["open", "close"]].min(axis=1)).all()
    exported = cpbjax.export(workdir)["BTCUSDT-1h"]
    pd.testing.assert_frame_equal(cpbjax.load(exported).predict(frame), fc, check_exact=True)
    # Only the newest candles matter: a frame of lookback + warm-up rows gives the same
    # forecast, up to float32 rounding (last_close normalises against the frame's first close).
    short = model.predict(frame.iloc[-200:])
    pd.testing.assert_frame_equal(short, fc, check_exact=False, rtol=1e-5)


def test_a_frame_shorter_than_the_interval_scale_is_logged(run, caplog):
    """The interval averages a week of ranges (168 1h candles): fewer give another
    interval, which the user is told; the point forecast is the same."""
    workdir, mirror, _ = run
    _, frame = _history(mirror)
    model = cpbjax.load(os.path.join(workdir, "models", "BTCUSDT-1h"))
    with caplog.at_level(logging.WARNING):
        short = model.predict(frame.iloc[-100:])
    assert "averages the last 168 candles, but only 100 are given" in caplog.text
    full = model.predict(frame)
    pd.testing.assert_series_equal(short["close"], full["close"], check_exact=False, rtol=1e-5)
    assert not np.allclose(short["close_upper"], full["close_upper"], rtol=1e-9)


def _check_interval(model, frame, fc, test_scores) -> None:
    """The calibrated interval the model was saved with (fitted on train+val, scored on
    test) is close * exp(k * s), s = sigma^(1 - w) * m^w with sigma the newest window's
    EWMA log range and m the mean log range of the last week of 1h candles (plain loop)."""
    cal = model.loaded.calibration
    assert cal["levels"] == [0.1, 0.9] and cal["method"] == "sigma_weighted_quantile"
    assert cal["scale"] == {"long_candles": 7 * 24, "long_weight": 0.25}  # the defaults
    assert cal["last_window_end"] < test_scores["first_window_end"]
    assert 0 < test_scores["calibrated_interval"]["columns"]["close"]["coverage"] <= 1
    ohlc = frame[list(COLUMNS)].to_numpy()
    weights = band.EWMA_DECAY ** np.arange(model.lookback)
    logs = [np.log(ohlc[-1 - age, 1] / ohlc[-1 - age, 2]) for age in range(7 * 24)]
    sigma = np.dot(weights, logs[: model.lookback]) / weights.sum()
    s = sigma**0.75 * np.mean(logs) ** 0.25
    k_H2 = np.asarray(cal["k"])[:, 3]  # close: consistent_ohlc never moves it
    for j, side in enumerate(("lower", "upper")):
        expected = fc["close"].to_numpy() * np.exp(k_H2[:, j] * s)
        np.testing.assert_allclose(fc[f"close_{side}"].to_numpy(), expected, rtol=1e-9)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: f.iloc[-5:], "a forecast needs data.lookback"),
        (lambda f: f.drop(f.index[-3]), "newest 30 candles"),
        (lambda f: f.tz_localize(None), "timezone-aware UTC"),
        (lambda f: f.assign(close=f["close"].where(f.index != f.index[-2])), "NaN"),
        (lambda f: f.drop(columns="close"), "lack the columns ['close']"),
        (lambda f: f.iloc[::-1], "strictly increasing"),
        (lambda f: f.iloc[::4], "model forecasts 1h candles"),
        (lambda f: f.assign(high=f["low"] * 0.5), "high below max(open, close)"),
    ],
)
def test_model_predict_names_bad_input(run, damage, message):
    workdir, mirror, _ = run
    _, frame = _history(mirror)
    model = cpbjax.load(os.path.join(workdir, "models", "BTCUSDT-1h"))
    with pytest.raises(ValueError, match=re.escape(message)):
        model.predict(damage(frame))


def test_the_epoch_program_checked_for_memory_is_the_one_that_trains(run):
    """The driver compiles the epoch program before the first epoch to read its memory
    need (timings.json "epoch_memory"); the epochs then run that compilation."""
    workdir, _, _ = run
    timings = writers.read_json(os.path.join(workdir, "timings.json"))
    [program] = timings["epoch_memory"]
    # Its one series padded to a coin per CPU device, all of which the program runs on.
    assert program["coins"] == program["devices"] == jax.local_device_count()
    assert program["per_device"] > 0
    compiles = [c["program"] for c in timings["compiles"]]
    assert compiles.count("jit(run_epoch)") == 1


def test_a_run_too_large_for_the_host_stops_before_its_first_epoch(run, tmp_path, monkeypatch):
    """An epoch program larger than the host's RAM would be killed by the OS mid-epoch
    without a word: the run stops first, naming the need and the fields that lower it."""
    _, mirror, _ = run
    monkeypatch.setattr(memory, "host_memory", lambda: (2**20, 2**20))  # a 1 MiB host
    workdir = tmp_path / "small_host"
    message = (
        r"group-000: one epoch needs about \d+\.\d\d GiB beyond its data, more than the 0\.00 "
        r"GiB of this host's RAM: lower train\.batch_size \(32 windows per coin per step\)"
    )
    with pytest.raises(memory.DoesNotFit, match=message):
        cpbjax.train(_config(mirror), str(workdir))
    assert not (workdir / "metrics.jsonl").exists() or not (workdir / "metrics.jsonl").read_text()
    assert not (workdir / "results.json").exists()


def test_load_names_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a model folder"):
        cpbjax.load(str(tmp_path / "nope"))


def test_forecast_config_tops_up_binance_history_only():
    trained = _config("unused")
    c = trained_run.forecast_config(_config("unused"), trained, ["BTCUSDT-1h"])
    assert c.data.source == "binance_rest" and c.data.min_candles == c.data.lookback
    stale = _config("unused")
    stale.predict.fresh = False
    assert trained_run.forecast_config(stale, trained, ["BTCUSDT-1h"]).data.source == "binance"
    offline = _config("unused")
    offline.data.source = "synthetic"
    assert trained_run.forecast_config(offline, trained, ["BTCUSDT-1h"]).data.source == "synthetic"
