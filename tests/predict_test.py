"""Tests of --mode predict and --mode evaluate (cpbjax/modes/predict.py, evaluate.py, saved.py) on a tiny workdir."""

import csv
import glob
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from cpbjax import models, writers
from cpbjax.columns import COLUMNS
from cpbjax.config import schema as config_lib
from cpbjax.data import latest, sources, windows
from cpbjax.data.series import INTERVAL_MS
from cpbjax.modes import evaluate as evaluate_mode
from cpbjax.modes import facts, predict, trained_run
from cpbjax.score import forecast, saved
from cpbjax.training import checkpoint

SYMBOLS = ("BTCUSDT", "ETHUSDT")


def _config():
    c = config_lib.load("configs/gru.py:tiny")
    c.data.symbols = SYMBOLS
    c.data.intervals = ("1h",)
    c.eval.plot_windows = 1
    return c


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A workdir with one saved (untrained) model per series and a results.json."""
    path = str(tmp_path_factory.mktemp("run"))
    config = _config()
    module = models.build(models.make_config(config))
    x = np.zeros((1, config.data.lookback, len(config.data.features)), np.float32)
    params = jax.jit(module.init)(jax.random.key(0), x, None)["params"]
    for symbol in SYMBOLS:
        checkpoint.save_series_model(
            os.path.join(path, "models", f"{symbol}-1h"), params, {"config": config.to_dict()}
        )
    writers.write_json(os.path.join(path, "config.json"), config)
    writers.write_results(
        path,
        {
            "run": {},
            "skipped": {"SOLUSDT-1h": "only 5 usable candles"},
            "series": {
                f"{s}-1h": {
                    "status": "trained",
                    "epochs_run": 3,
                    "best_val_loss": 0.1,
                    "train_seconds": 1.0,
                    "test": {"stale": True},
                }
                for s in SYMBOLS
            },
        },
    )
    return path


# ---------------------------------------------------------------------------
# Selecting series.

AVAILABLE = ("BTCUSDT-15m", "BTCUSDT-1h", "ETHUSDT-1h")


def test_select_all_and_by_symbol_or_interval():
    assert saved.select_series(AVAILABLE, (), ())[0] == list(AVAILABLE)
    assert saved.select_series(AVAILABLE, ("BTCUSDT",), ())[0] == ["BTCUSDT-15m", "BTCUSDT-1h"]
    assert saved.select_series(AVAILABLE, (), ("1h",))[0] == ["BTCUSDT-1h", "ETHUSDT-1h"]
    assert saved.select_series(AVAILABLE, ("ETHUSDT",), ("1h",))[0] == ["ETHUSDT-1h"]


@pytest.mark.parametrize(
    "symbols, intervals, named",
    [
        (("ETHUSDT",), ("15m",), "ETHUSDT-15m"),
        (("SOLUSDT",), (), "symbol SOLUSDT"),
        ((), ("4h",), "interval 4h"),
    ],
)
def test_select_missing_lists_available(symbols, intervals, named):
    with pytest.raises(saved.ModelNotFound) as e:
        saved.select_series(AVAILABLE, symbols, intervals)
    assert named in str(e.value)
    assert "BTCUSDT-15m, BTCUSDT-1h, ETHUSDT-1h" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_select_excuses_series_skipped_in_training():
    names, skipped = saved.select_series(
        AVAILABLE, ("BTCUSDT", "SOLUSDT"), ("1h",), excused={"SOLUSDT-1h": "too short"}
    )
    assert names == ["BTCUSDT-1h"]
    assert skipped == {"SOLUSDT-1h": "no model (skipped in training: too short)"}


def test_no_models_folder(tmp_path):
    with pytest.raises(saved.ModelNotFound, match="train with --workdir"):
        saved.available_models(str(tmp_path))


# ---------------------------------------------------------------------------
# --mode predict.


@pytest.mark.parametrize(
    "source, says, not_says",
    [
        ("synthetic", "the data is generated", "binance_rest"),
        ("local", "data.local_dir's files end there", "binance_rest"),
        ("binance", "--config.predict.fresh=True tops it up", "binance_rest"),
        ("binance_rest", "the exchange (data.api_url) gave no newer closed candles", "fresh=True"),
    ],
)
def test_the_stale_hint_fits_the_source(source, says, not_says, caplog):
    step = INTERVAL_MS["1h"]
    last = 1_750_000_000_000 // step * step
    entry = {
        "symbol": "BTCUSDT",
        "interval": "1h",
        "last_open_time": "2025-06-15T15:00:00Z",
        "last_open_time_ms": last,
        "forecast": [{}] * 10,
    }
    with caplog.at_level(logging.WARNING):
        assert predict.freshness(entry, last + 5 * step, source) == 5
    (warning,) = [r.getMessage() for r in caplog.records]
    head = "BTCUSDT-1h: STALE: the newest candle (2025-06-15T15:00:00Z) is 5 intervals old"
    assert warning.startswith(f"{head}, so 4 forecast steps are already past: "), warning
    assert says in warning and not_says not in warning, warning
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert predict.freshness(entry, last + step, source) == 1  # just closed: not stale
    assert not caplog.records


def test_predict_continues_the_grid_and_matches_the_model(workdir):
    config = _config()
    config.predict.intervals = ("1h",)
    doc = predict.run_predict(config, workdir)
    with open(os.path.join(workdir, "forecast.json")) as f:
        assert json.load(f) == json.loads(json.dumps(doc))
    assert sorted(doc["series"]) == ["BTCUSDT-1h", "ETHUSDT-1h"]
    series = {s.name: s for s in sources.load_all(config.data)[0]}
    step = INTERVAL_MS["1h"]
    L, H = config.data.lookback, config.data.horizon
    for name, fc in doc["series"].items():
        last_ms = int(series[name].open_time_ms[-1])
        assert fc["last_open_time_ms"] == last_ms
        times = [c["open_time_ms"] for c in fc["forecast"]]
        assert times == [last_ms + step * h for h in range(1, H + 1)]
        assert all(t % step == 0 for t in times)
        assert fc["forecast"][0]["open_time"].endswith("Z")
        # Saved without an interval calibration (as by an earlier cpbjax): no interval.
        assert "interval" not in fc["forecast"][0] and "interval_levels" not in fc
        # Independently: the model applied to the newest window, mapped to prices.
        module, params, trained, *_ = saved.load_model(os.path.join(workdir, "models", name))
        prep = windows.prepare_series(series[name], trained.data)
        y = np.asarray(module.apply({"params": params}, latest.latest_window(prep, L), None))
        o, h, lo, c = (series[name].ohlcv[-1, 3] * np.exp(y[0].astype(np.float64))).T
        # Made consistent: high above and low below the candle body, nothing else moved.
        expected = np.stack([o, np.max([o, h, c], 0), np.min([o, lo, c], 0), c], axis=1)
        got = np.array([[c[k] for k in ("open", "high", "low", "close")] for c in fc["forecast"]])
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    with open(os.path.join(workdir, "forecast.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * H
    assert float(rows[0]["close"]) == doc["series"][rows[0]["series"]]["forecast"][0]["close"]


def _scored(best_epoch) -> dict:
    """A results.json entry whose test skills are known: every column's model MAE is 3,
    the band's high and low MAEs 4 and 2 (skill 1 - 3/4 and 1 - 3/2)."""
    columns = {c: {"mae": 3.0, "skill": 0.125 * j} for j, c in enumerate(COLUMNS)}
    band = {"columns": {"high": {"mae": 4.0, "skill": 0.5}, "low": {"mae": 2.0, "skill": 0.5}}}
    test = {"windows": 7, "columns": columns, "vol_band": band}
    return {"status": "trained", "best_epoch": best_epoch, "test": test}


def test_forecast_files_say_how_good_each_model_was(workdir, tmp_path):
    """forecast.json and .csv carry each series' test skill against the better naive
    forecast and against the band, and whether the kept model is the untrained baseline;
    prices have 8 significant digits; the run names its workdir, not a path, and a
    synthetic run lists no Binance location."""
    run = str(tmp_path / "my-run")
    shutil.copytree(workdir, run)
    results = writers.read_json(os.path.join(run, "results.json"))
    results["series"].update({"BTCUSDT-1h": _scored(None), "ETHUSDT-1h": _scored(3)})
    writers.write_results(run, results)
    doc = predict.run_predict(_config(), run)
    skill = {
        "windows": 7,
        "vs_naive": {"open": 0.0, "high": 0.125, "low": 0.25, "close": 0.375},
        "vs_band": {"high": 0.25, "low": -0.5},
    }
    for name, kept in (("BTCUSDT-1h", True), ("ETHUSDT-1h", False)):
        assert doc["series"][name]["test_skill"] == skill
        assert doc["series"][name]["kept_baseline"] is kept
    assert doc["run"]["workdir"] == "my-run"
    assert doc["run"]["data"] == {"source": "synthetic", "max_candles": 1200}
    with open(os.path.join(run, "forecast.csv")) as f:
        rows = list(csv.DictReader(f))
    btc = next(r for r in rows if r["series"] == "BTCUSDT-1h")
    assert btc["test_skill_vs_naive_close"] == "0.375" and btc["test_skill_vs_band_low"] == "-0.5"
    assert btc["kept_baseline"] == "True"
    # Every price at 8 significant digits, within rounding of the model's own forecast.
    raw = _raw_forecasts(run, _config())
    for name, fc in doc["series"].items():
        prices = [[c[k] for k in COLUMNS] for c in [fc["last_candle"], *fc["forecast"]]]
        assert all(float(f"{p:.8g}") == p for row in prices for p in row)
        want = [[c[k] for k in COLUMNS] for c in [raw[name]["last_candle"], *raw[name]["forecast"]]]
        np.testing.assert_allclose(prices, want, rtol=5.01e-8, atol=0)


def test_a_damaged_results_json_leaves_the_forecast_without_its_skill(workdir, tmp_path, caplog):
    run = str(tmp_path / "run")
    shutil.copytree(workdir, run)
    with open(os.path.join(run, "results.json"), "w") as f:
        f.write('{"series": ')
    doc = predict.run_predict(_config(), run)
    for fc in doc["series"].values():
        assert fc["test_skill"] is None and fc["kept_baseline"] is None and fc["forecast"]
    assert "results.json is not valid JSON" in caplog.text


def _raw_forecasts(workdir, config) -> dict:
    """forecast.next_candles of every saved model: the prices before rounding."""
    loaded, cfg, _ = trained_run.load_for_forecast(config, workdir)
    preps, _ = trained_run.prepare(cfg, loaded, latest=True)
    d = cfg.data
    return {
        n: forecast.next_candles(m.module, m.params, preps[n], d.lookback, d.horizon)
        for n, m in loaded.items()
    }


def test_the_run_facts_list_the_data_fields_of_the_source():
    config = _config()
    config.data.source, config.data.base_url, config.data.end = "binance", "/mirror", "2024-02"
    scored = facts.scored_workdir(config, "/somewhere/runs/demo/")
    assert scored["workdir"] == "demo"
    assert scored["data"] == {
        "source": "binance",
        "base_url": "/mirror",
        "months": 12,
        "end": "2024-02",
        "max_candles": 1200,
    }


def test_models_saved_with_their_norm_are_scaled_with_it(workdir):
    """A non-price feature: the training run's statistics map the new data, not re-fitted
    ones."""
    config = _config()
    config.data.features = ("open", "high", "low", "close", "volume")
    name = "BTCUSDT-1h"
    module, params, *_ = saved.load_model(os.path.join(workdir, "models", name))
    trained = config_lib.load("configs/gru.py:tiny")
    trained.data.features = config.data.features
    fitted = {
        "kind": "last_close",
        "feature_mean": [10.0, 11.0, 9.0, 10.0, 5.0],
        "feature_std": [2.0, 2.0, 2.0, 2.0, 4.0],
    }
    loaded = {name: saved.LoadedModel(module, params, trained, fitted)}
    preps, skipped = trained_run.prepare(config, loaded)
    assert not skipped
    prep = preps[name]
    raw = {s.name: s for s in sources.load_all(config.data)[0]}[name].ohlcv
    volume = raw[len(raw) - len(prep.ohlc) :, 4]  # the kept candles are the newest
    np.testing.assert_allclose(prep.inputs[:, 4], (volume - 5.0) / 4.0, rtol=1e-5)
    assert prep.norm["feature_mean"].tolist() == fitted["feature_mean"]


def test_predict_unknown_interval_is_a_clear_error(workdir):
    config = _config()
    config.predict.intervals = ("4h",)
    with pytest.raises(saved.ModelNotFound, match=r"interval 4h.*BTCUSDT-1h, ETHUSDT-1h"):
        predict.run_predict(config, workdir)


# ---------------------------------------------------------------------------
# --mode evaluate.


def test_evaluate_writes_metrics_and_report(workdir):
    config = _config()
    config.data.symbols = ("BTCUSDT", "ETHUSDT", "SOLUSDT")
    config.data.synthetic_candles = 1300  # other data than training saw
    config.eval.save_forecasts = True
    results = evaluate_mode.run_evaluate(config, workdir)
    (path,) = glob.glob(os.path.join(workdir, "eval-*.json"))
    stem = os.path.basename(path)[:-5]
    assert writers.read_json(path) == json.loads(json.dumps(results))
    assert results["skipped"] == {
        "SOLUSDT-1h": "no model (skipped in training: only 5 usable candles)"
    }
    entry = results["series"]["BTCUSDT-1h"]
    assert entry["status"] == "trained" and "stale" not in entry["test"]
    for split in ("val", "test"):
        assert entry[split]["columns"]["close"]["mae"] > 0
        assert entry[split]["windows"] == entry["data"]["windows"][split]
    assert os.path.exists(os.path.join(workdir, f"{stem}.md"))
    assert os.path.exists(os.path.join(workdir, "plots", stem, "skill.png"))
    assert os.path.exists(os.path.join(workdir, stem, "forecasts", "ETHUSDT-1h.npz"))


def test_evaluate_series_without_model_is_a_clear_error(workdir):
    config = _config()
    config.data.symbols = ("BTCUSDT", "XRPUSDT")
    with pytest.raises(saved.ModelNotFound, match="XRPUSDT-1h; series with a model: BTCUSDT-1h"):
        evaluate_mode.run_evaluate(config, workdir)
