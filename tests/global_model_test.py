"""Zero-shot and fine-tuning (issue #42 item 7): a pooled run forecasts a pair it never
saw (cpbjax.load(<workdir>).predict and --mode predict), fitting that pair's own band and
interval on its candles; a per-series run refuses one; train.init_from starts from a
trained workdir and keeps the starting model when no epoch beats it."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import api
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import frames, latest, sources, synthetic, windows
from cpbjax.models import heads
from cpbjax.modes import predict, trained_run
from cpbjax.score import band_refit, forecast, saved, zero_shot
from cpbjax.training import checkpoint
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINED = ("BTCUSDT", "ETHUSDT")


def _config(share: str, symbols=TRAINED, epochs: int = 2):
    """A tiny GRU on synthetic 1h series: the default objective (vol_band, its refit, the
    calibrated interval), small enough to train in seconds."""
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.symbols, c.data.intervals = symbols, ("1h",)
    c.data.synthetic_candles, c.data.max_candles, c.data.min_candles = 700, 600, 300
    c.model.hidden, c.model.num_layers = 8, 1
    c.train.share, c.train.epochs, c.train.patience = share, epochs, epochs
    c.eval.plots = False
    return c


@pytest.fixture(scope="module")
def pooled_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("global") / "pooled")
    cpbjax.train(_config("pooled", epochs=1), workdir)
    return workdir


@pytest.fixture(scope="module")
def series_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("global") / "series")
    cpbjax.train(_config("series", epochs=1), workdir)
    return workdir


def _frame(series) -> pd.DataFrame:
    frame = pd.DataFrame(series.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame.index = pd.to_datetime(series.open_time_ms, unit="ms", utc=True)
    return frame


def _new_pair(n: int = 700) -> pd.DataFrame:
    return _frame(synthetic.generate("NEWUSDT", "1h", n))


def test_a_pooled_run_forecasts_a_pair_it_never_saw_with_its_own_fits(pooled_run):
    run = cpbjax.load(pooled_run)
    assert isinstance(run, api.RunModel)
    candles = _new_pair()
    out = run.predict(candles, symbol="NEWUSDT")
    trained = trained_run.run_config_of(pooled_run)
    assert list(out["step"]) == list(range(1, trained.data.horizon + 1))
    assert {"high_lower", "high_upper"} <= set(out.columns)
    assert np.isfinite(out.to_numpy(float)).all()
    pd.testing.assert_frame_equal(run.predict(candles), out)  # unnamed: the same model
    # Every trained series' folder holds the same network: whichever is the base, the
    # forecast is the same (no series' own band, interval or normalisation enters).
    for path in saved.available_models(pooled_run).values():
        base = trained_run.shared_model(saved.load_model(path))
        again = api.Model(base, "NEWUSDT", "1h").predict(candles)
        np.testing.assert_allclose(again.to_numpy(float), out.to_numpy(float), rtol=2e-6)
    # The band is the new pair's own least-absolute-deviation fit: refit again on the
    # fitted model's windows, nothing is left to move.
    series = frames.candles_to_series(candles, "NEWUSDT", "1h", ())
    prep = latest.prepare_latest(series, trained.data, None)
    base = trained_run.shared_model(
        saved.load_model(next(iter(saved.available_models(pooled_run).values())))
    )
    fitted, n = zero_shot.fit_series(base, prep)
    L, H = trained.data.lookback, trained.data.horizon
    ends = windows.contiguous_ends(prep.open_time_ms, 3_600_000, L, H)
    assert n == len(ends) >= zero_shot.MIN_FIT_WINDOWS
    fc = forecast.forecast_ends(fitted.module, fitted.params, prep, ends, L, H)
    np.testing.assert_allclose(band_refit.fit_shift(prep, {"f": fc}, ("f",), L, H), 0, atol=1e-4)
    assert fitted.calibration["fitted_on_windows"] == n
    for path in saved.available_models(pooled_run).values():
        assert fitted.calibration["k"] != saved.load_model(path).calibration["k"]
    # A pair the run trained on keeps its own saved model.
    btc = _frame(synthetic.generate("BTCUSDT", "1h", 700))
    pd.testing.assert_frame_equal(
        run.predict(btc, symbol="BTCUSDT"),
        cpbjax.load(workdir_lib.series_model(pooled_run, "BTCUSDT-1h")).predict(btc),
    )
    with pytest.raises(ValueError, match=f"at least {zero_shot.MIN_FIT_WINDOWS}"):
        run.predict(candles.iloc[-150:], symbol="NEWUSDT")


def test_predict_mode_forecasts_a_new_symbol_from_a_pooled_workdir(pooled_run):
    cmd = [sys.executable, "launch.py", "--mode=predict", f"--workdir={pooled_run}"]
    cmd.append("--config.data.symbols=('NEWUSDT',)")
    out = subprocess.run(
        cmd, cwd=ROOT, env=helpers.subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    with open(workdir_lib.forecast_json(pooled_run)) as f:
        doc = json.load(f)
    assert list(doc["series"]) == ["NEWUSDT-1h"]
    entry = doc["series"]["NEWUSDT-1h"]
    assert entry["zero_shot"]["fitted_on_windows"] >= zero_shot.MIN_FIT_WINDOWS
    # The same forecast as the Python API's on the same candles.
    c = trained_run.run_config_of(pooled_run)
    c.data.symbols = ("NEWUSDT",)
    (series,), _ = sources.load_all(c.data)
    want = cpbjax.load(pooled_run).predict(_frame(series), symbol="NEWUSDT")
    got = [[candle[k] for k in ("open", "high", "low", "close")] for candle in entry["forecast"]]
    np.testing.assert_allclose(got, want[["open", "high", "low", "close"]], rtol=1e-6)


def test_a_per_series_run_refuses_a_symbol_it_never_saw(series_run):
    with pytest.raises(ValueError, match="NEWUSDT-1h.*pooled workdir"):
        cpbjax.load(series_run).predict(_new_pair(), symbol="NEWUSDT")
    c = trained_run.run_config_of(series_run)
    c.data.symbols = ("NEWUSDT",)
    with pytest.raises(saved.ModelNotFound, match="symbol NEWUSDT.*pooled workdir"):
        predict.run_predict(c, series_run)


def _saved_params(workdir: str) -> dict:
    return {
        name: checkpoint.load_series_model(path)[0]
        for name, path in saved.available_models(workdir).items()
    }


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _worsening(config, source: str):
    """Fine-tuning that only makes the model worse: a learning rate 5000x the tiny one's
    from the first step; the band is not refit after training, so the saved params are
    the kept ones."""
    config.train.init_from, config.train.learning_rate = source, 5.0
    config.train.warmup_fraction, config.eval.refit_band = 0.0, False
    return config


def _epochs(workdir: str) -> list[dict]:
    with open(workdir_lib.metrics_jsonl(workdir)) as f:
        return [json.loads(line) for line in f if '"epoch"' in line]


def test_fine_tuning_a_pooled_run_on_other_pairs_keeps_the_start_it_cannot_beat(
    pooled_run, tmp_path
):
    workdir = str(tmp_path / "tuned")
    results = cpbjax.train(
        _worsening(_config("pooled", ("SOLUSDT", "XRPUSDT")), pooled_run), workdir
    )
    source = _saved_params(pooled_run)
    bands = np.stack([np.asarray(heads.band_factors(p)) for p in source.values()])
    start = heads.with_band(next(iter(source.values())), np.median(bands, 0).astype(np.float32))
    for name, params in _saved_params(workdir).items():
        _assert_same(params, start)  # the pooled network, the median of the source's bands
        entry = results["series"][name]
        assert entry["best_epoch"] is None and entry["started_from"] == pooled_run
        assert "the starting model is kept" in entry["warning"]
    epochs = _epochs(workdir)
    assert epochs and not any(any(e["improved"]) for e in epochs)


def test_zero_epochs_from_a_pooled_run_score_its_network_on_pairs_it_never_saw(
    pooled_run, tmp_path
):
    """train.epochs=0 with train.init_from: the zero-shot scores of issue #42's table, the
    source's network on other pairs, each with its own band refit and interval."""
    workdir = str(tmp_path / "zero_shot")
    config = _config("pooled", ("SOLUSDT", "XRPUSDT"))
    config.train.init_from, config.train.epochs = pooled_run, 0
    results = cpbjax.train(config, workdir)
    network = heads.without_keep(next(iter(_saved_params(pooled_run).values())))
    for name in ("SOLUSDT-1h", "XRPUSDT-1h"):
        entry = results["series"][name]
        assert entry["best_epoch"] is None and entry["epochs_run"] == 0
        assert entry["test"]["windows"] > 0 and entry["started_from"] == pooled_run
        params = heads.without_keep(_saved_params(workdir)[name])
        for path, a in jax.tree_util.tree_leaves_with_path(params):
            if "band" not in jax.tree_util.keystr(path):  # each series' own refit
                b = network
                for key in path:
                    b = b[key.key]
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert _epochs(workdir) == []
    config.train.init_from = ""
    with pytest.raises(ConfigError, match="train.epochs=0.*without train.init_from"):
        config_lib.validate(config)


def test_fine_tuning_a_per_series_run_starts_each_series_from_its_own(series_run, tmp_path):
    workdir = str(tmp_path / "tuned")
    c = _worsening(_config("series", ("ETHUSDT",), epochs=1), series_run)
    results = cpbjax.train(c, workdir)
    assert results["series"]["ETHUSDT-1h"]["best_epoch"] is None
    _assert_same(_saved_params(workdir)["ETHUSDT-1h"], _saved_params(series_run)["ETHUSDT-1h"])


@pytest.mark.parametrize(
    "share, symbols, change, message",
    [
        ("pooled", TRAINED, {}, "trained a model per series.*pooled run starts from a pooled"),
        ("series", ("SOLUSDT",), {}, "has no model of SOLUSDT-1h"),
        ("series", TRAINED, {"hidden": 16}, "its model.hidden is 8 but this run's is 16"),
        ("series", TRAINED, {"lookback": 20}, "its data.lookback is 30 but this run's is 20"),
    ],
)
def test_init_from_refuses_what_it_cannot_start_from(
    series_run, tmp_path, share, symbols, change, message
):
    c = _config(share, symbols, epochs=1)
    c.train.init_from = series_run
    if "hidden" in change:
        c.model.hidden = change["hidden"]
    if "lookback" in change:
        c.data.lookback = change["lookback"]
    with pytest.raises(ConfigError, match=message):
        cpbjax.train(c, str(tmp_path / "tuned"))


def test_init_from_is_a_workdir_path():
    c = _config("pooled")
    c.train.init_from = None
    with pytest.raises(ConfigError, match="train.init_from"):
        config_lib.validate(c)
    c.train.init_from = "no/such/run"
    with pytest.raises(ConfigError, match="not a trained workdir"):
        cpbjax.train(c, "unused")
    old = config_lib.base_config().to_dict()
    del old["train"]["init_from"]
    assert config_lib.upgrade(old).train.init_from == ""
