"""Tests of --mode export (cpbjax.export, cpbjax.report.model_card): folders that predict as the run does."""

import functools
import os

import jax
import numpy as np
import pytest

from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.data import sources, windows
from cpbjax.modes import driver
from cpbjax.modes import export as portable
from cpbjax.report import model_card
from cpbjax.score import forecast, saved
from cpbjax.training import checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config():
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
    c.train.epochs, c.eval.plots = 1, False
    # Two z-scored inputs, so the normalisation statistics the export carries change its
    # forecasts (under last_close the OHLC inputs need none), and no baseline, so the kept
    # model reads them (one epoch rarely beats the vol_band baseline, and the untrained
    # model that then stays forecasts the band of the price range alone); the run's own
    # test forecasts are saved to compare the export's with.
    c.data.features = ("open", "high", "low", "close", "volume_norm", "rsi")
    c.model.baseline = "none"
    c.eval.save_forecasts = True
    return config_lib.validate(c)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("export") / "run")
    driver.train_and_evaluate(_config(), workdir)
    return workdir, portable.run_export(_config(), workdir)


@functools.cache
def _series(name):
    return {s.name: s for s in sources.load_all(_config().data)[0]}[name]


def test_export_folder_holds_weights_config_norm_metrics_and_card(exported):
    workdir, done = exported
    assert sorted(done) == ["BTCUSDT-1h", "ETHUSDT-1h"]
    folder = done["BTCUSDT-1h"]
    assert folder == os.path.join(workdir, "export", "BTCUSDT-1h")
    for name in ("params.msgpack", "config.json", "normalization.json", "metrics.json"):
        assert os.path.getsize(os.path.join(folder, name)) > 0
    entry = writers.read_json(os.path.join(workdir, "results.json"))["series"]["BTCUSDT-1h"]
    assert writers.read_json(os.path.join(folder, "metrics.json")) == entry
    with open(os.path.join(folder, "README.md")) as f:
        card = f.read()
    close = entry["test"]["columns"]["close"]["skill"]
    assert f"{100 * close:+.2f}%" in card  # the card quotes the measured test skill
    assert "Intended use and limits" in card and entry["data"]["first"] in card
    # The interval the export carries, and its measured test coverage.
    _, meta = checkpoint.load_series_model(os.path.join(workdir, "models", "BTCUSDT-1h"))
    assert writers.read_json(os.path.join(folder, "interval.json")) == meta["interval_calibration"]
    coverage = entry["test"]["calibrated_interval"]["columns"]["close"]["coverage"]
    assert "80% interval (levels 0.1 and 0.9" in card and f"close {100 * coverage:.1f}%" in card


def test_exported_model_predicts_exactly_what_the_runs_model_predicts(exported):
    workdir, done = exported
    for name, folder in done.items():
        run_model = saved.load_model(os.path.join(workdir, "models", name))
        exp_model = portable.load_export(folder)
        params, _ = checkpoint.load_series_model(os.path.join(workdir, "models", name))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(exp_model.params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert exp_model.trained.to_dict() == run_model.trained.to_dict()
        d = run_model.trained.data
        prep = windows.prepare_series(_series(name), d, fitted_norm=exp_model.norm)
        ends = prep.ends["test"]
        outs = [
            forecast.predict_windows(m.module, m.params, prep, ends, d.lookback, d.horizon)
            for m in (run_model, exp_model)
        ]
        np.testing.assert_array_equal(outs[0], outs[1])


def test_export_alone_forecasts_the_runs_saved_test_forecasts(exported):
    """The export folder alone (its params, config and normalization.json) forecasts on the
    run's candles what the run saved for each test window (forecasts/<SERIES>.npz), so
    the export carries the statistics the model was trained with, not merely its own."""
    workdir, done = exported
    for name, folder in done.items():
        model = portable.load_export(folder)
        assert model.norm is not None  # the export's statistics, not a refit on these candles
        d = model.trained.data
        prep = windows.prepare_series(_series(name), d, fitted_norm=model.norm)
        run_fc = forecast.load_forecasts(workdir_lib.forecasts_file(workdir, name))
        # The run's test windows, found by the open time of their last input candle.
        ends = np.searchsorted(prep.open_time_ms, run_fc["last_open_time_ms"])
        np.testing.assert_array_equal(prep.open_time_ms[ends], run_fc["last_open_time_ms"])
        assert len(ends) == len(prep.ends["test"])
        fc = forecast.forecast_ends(model.module, model.params, prep, ends, d.lookback, d.horizon)
        np.testing.assert_allclose(fc.prices_NHC, run_fc["predicted"], rtol=1e-6)


def test_serialized_forward_runs_without_the_model_code(exported):
    workdir, done = exported
    folder = done["ETHUSDT-1h"]
    model = portable.load_export(folder)
    with open(os.path.join(folder, "forward.jax_export"), "rb") as f:
        forward = jax.export.deserialize(f.read())
    d = model.trained.data
    x = np.random.default_rng(0).standard_normal((3, d.lookback, len(d.features))).astype("f4")
    expected = model.module.apply({"params": model.params}, x, None, train=False)
    np.testing.assert_allclose(forward.call(model.params, x), expected, rtol=1e-6, atol=1e-7)


def test_export_without_models_names_the_folder(tmp_path):
    with pytest.raises(saved.ModelNotFound, match="no saved model under"):
        portable.run_export(_config(), str(tmp_path))


def test_the_model_card_says_when_the_untrained_baseline_was_kept():
    with_band = {"baseline": "vol_band"}
    assert model_card._best_epoch({"best_epoch": 7}, with_band) == "7"
    assert "untrained baseline" in model_card._best_epoch({"best_epoch": None}, with_band)
    assert model_card._best_epoch({"best_epoch": None}, {"baseline": "none"}) == "none"
