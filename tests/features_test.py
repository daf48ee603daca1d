"""Tests of cpbjax.data.features against plain row-by-row reference computations."""

import datetime
import json
import math
import os

import numpy as np
import pytest

import cpbjax
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import context, features
from cpbjax.modes import predict, trained_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T = 250
# 4h candles: a day, week and month are 6, 42 and 180 of them, so every long-history
# feature has defined rows in a short series. The open times start at 20:00 UTC on a
# Wednesday and cross a leap day and weekends.
INTERVAL = "4h"
STEP_MS = 4 * 3_600_000
OPEN_TIMES = int(datetime.datetime(2024, 2, 28, 20, tzinfo=datetime.timezone.utc).timestamp()) * (
    1000
) + STEP_MS * np.arange(T, dtype=np.int64)


def _candles(seed=0, n=T):
    """Random OHLCV [n, 5] obeying the OHLC invariants."""
    rng = np.random.default_rng(seed)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.02, n)))
    open_ = np.concatenate([[100.0], close[:-1]]) * np.exp(rng.normal(0.0, 0.002, n))
    high = np.maximum(open_, close) * (1.0 + rng.uniform(0.0, 0.02, n))
    low = np.minimum(open_, close) * (1.0 - rng.uniform(0.0, 0.02, n))
    volume = rng.uniform(0.0, 50.0, n)
    return np.stack([open_, high, low, close, volume], axis=1)


def _seeded_average(x, start, period, alpha):
    """SMA of x[start:start+period] at row start+period-1, then y = y + alpha (x - y)."""
    y = [math.nan] * len(x)
    seed_row = start + period - 1
    y[seed_row] = sum(x[start : seed_row + 1]) / period
    for t in range(seed_row + 1, len(x)):
        y[t] = y[t - 1] + alpha * (x[t] - y[t - 1])
    return np.array(y)


def _ref_rsi(c, n=14):
    out = [math.nan] * len(c)
    gains = [max(c[t] - c[t - 1], 0.0) for t in range(1, len(c))]
    losses = [max(c[t - 1] - c[t], 0.0) for t in range(1, len(c))]
    avg_gain, avg_loss = sum(gains[:n]) / n, sum(losses[:n]) / n
    out[n] = 100.0 - 100.0 / (1.0 + avg_gain / avg_loss)
    for t in range(n + 1, len(c)):
        avg_gain = (avg_gain * (n - 1) + gains[t - 1]) / n
        avg_loss = (avg_loss * (n - 1) + losses[t - 1]) / n
        out[t] = 100.0 - 100.0 / (1.0 + avg_gain / avg_loss)
    return np.array(out)


def _ref_window_stats(x, n):
    """Rolling mean and population std of the n values ending at each row."""
    mean, std = [math.nan] * len(x), [math.nan] * len(x)
    for t in range(n - 1, len(x)):
        window = x[t - n + 1 : t + 1]
        mean[t] = sum(window) / n
        std[t] = math.sqrt(sum((w - mean[t]) ** 2 for w in window) / n)
    return np.array(mean), np.array(std)


def _ref_atr(h, lo, c, n=14):
    true_range = [math.nan] + [
        max(h[t] - lo[t], abs(h[t] - c[t - 1]), abs(lo[t] - c[t - 1])) for t in range(1, len(c))
    ]
    return _seeded_average(true_range, 1, n, 1.0 / n)


def _ref_log_vol(per_candle, n):
    """log sqrt(mean of the n per-candle variances ending at each row), plain loop."""
    out = [math.nan] * len(per_candle)
    for t in range(n - 1, len(per_candle)):
        out[t] = math.log(math.sqrt(sum(per_candle[t - n + 1 : t + 1]) / n))
    return out


def _ref_long_history(x):
    o, h, lo, c, v = (list(col) for col in x.T)
    ln2 = math.log(2.0)
    park = [math.log(h[t] / lo[t]) ** 2 / (4 * ln2) for t in range(len(c))]
    gk = [
        0.5 * math.log(h[t] / lo[t]) ** 2 - (2 * ln2 - 1) * math.log(c[t] / o[t]) ** 2
        for t in range(len(c))
    ]
    refs = {}
    for span, n in (("1d", 6), ("1w", 42), ("1m", 180)):
        refs[f"parkinson_{span}"] = (_ref_log_vol(park, n), n - 1)
        refs[f"garman_klass_{span}"] = (_ref_log_vol(gk, n), n - 1)
    day_mean = [math.nan] * 5 + [sum(v[t - 5 : t + 1]) / 6 for t in range(5, len(v))]
    refs["volume_norm_1d"] = (np.array(v) / np.array(day_mean), 5)
    refs["log_range"] = ([math.log(h[t] / lo[t]) for t in range(len(c))], 0)
    when = [datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc) for ms in OPEN_TIMES]
    day = [(w.hour * 3600 + w.minute * 60 + w.second) / 86400 for w in when]
    week = [(w.weekday() + d) / 7 for w, d in zip(when, day, strict=True)]  # Monday = 0
    for name, turns in (("hour", day), ("dow", week)):
        refs[f"{name}_sin"] = ([math.sin(2 * math.pi * f) for f in turns], 0)
        refs[f"{name}_cos"] = ([math.cos(2 * math.pi * f) for f in turns], 0)
    return refs


def _compute(x, names):
    return features.compute(x, names, INTERVAL, OPEN_TIMES[: len(x)])


def _references(x):
    o, h, lo, c, v = (list(col) for col in x.T)
    ema = lambda s, p, start=0: _seeded_average(list(s), start, p, 2.0 / (p + 1))
    macd = ema(c, 12) - ema(c, 26)
    mid, sd = _ref_window_stats(c, 20)
    log_ret = [math.nan] + [math.log(c[t] / c[t - 1]) for t in range(1, len(c))]
    vol_mean, _ = _ref_window_stats(v, 20)
    upper, lower = mid + 2 * sd, mid - 2 * sd
    return {
        "open": (o, 0),
        "high": (h, 0),
        "low": (lo, 0),
        "close": (c, 0),
        "volume": (v, 0),
        "log_return": (log_ret, 1),
        "rsi": (_ref_rsi(c), 14),
        "macd": (macd, 25),
        "macd_signal": (ema(macd, 9, start=25), 33),
        "roc": ([math.nan] * 10 + [100 * (c[t] / c[t - 10] - 1) for t in range(10, len(c))], 10),
        "bb_upper": (upper, 19),
        "bb_lower": (lower, 19),
        "bb_width": (100 * (upper - lower) / mid, 19),
        "bb_position": ((np.array(c) - lower) / (upper - lower), 19),
        "volatility": ([math.nan] + list(_ref_window_stats(log_ret[1:], 20)[1]), 20),
        "atr": (_ref_atr(h, lo, c), 14),
        "volume_norm": (np.array(v) / vol_mean, 19),
        **_ref_long_history(x),
    }


REFERENCES = _references(_candles())


# The context features have their plain loops, across gaps, in tests/context_test.py.
INDICATORS = tuple(n for n in features.NAMES if n not in context.NAMES)


def test_every_feature_has_a_reference_and_passes_validation():
    assert set(REFERENCES) == set(INDICATORS)
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py"))
    ohlc = ("open", "high", "low", "close")
    c.data.features = (*ohlc, *(n for n in features.NAMES if n not in ohlc))
    config_lib.validate(c)  # the config accepts exactly the names features.py computes
    c.data.features = ("open", "high", "low", "close", "not_a_feature")
    with pytest.raises(ConfigError, match="not_a_feature"):
        config_lib.validate(c)


@pytest.mark.parametrize("name", INDICATORS)
def test_indicator_matches_reference(name):
    expected, warmup = REFERENCES[name]
    expected = np.asarray(expected, np.float64)
    got, first_valid = _compute(_candles(), (name,))
    assert got.shape == (T, 1)
    assert first_valid == warmup == features.warmup_candles((name,), INTERVAL)
    assert np.isnan(got[:warmup, 0]).all(), "warm-up rows must be NaN, not filled"
    assert np.isfinite(got[warmup:, 0]).all()
    np.testing.assert_allclose(got[warmup:, 0], expected[warmup:], rtol=1e-10, atol=1e-10)


def test_columns_follow_names_and_first_valid_is_the_longest_warmup():
    names = ("open", "high", "low", "close", "volume_norm", "macd_signal", "rsi")
    got, first_valid = features.compute(_candles(), names)
    assert got.shape == (T, len(names))
    assert first_valid == 33
    for j, name in enumerate(names):
        np.testing.assert_allclose(got[33:, j], np.asarray(REFERENCES[name][0])[33:], rtol=1e-10)


def test_short_series_has_no_valid_row():
    got, first_valid = features.compute(_candles(n=20), ("open", "macd"))
    assert first_valid == 20
    assert np.isnan(got[:, 1]).all()


def test_flat_market_has_defined_values():
    x = np.tile([10.0, 10.0, 10.0, 10.0, 0.0], (40, 1))
    names = ("rsi", "bb_position", "bb_width", "volume_norm", "volatility", "atr")
    got, first_valid = features.compute(x, names)
    assert first_valid == 20
    np.testing.assert_array_equal(got[20:], np.tile([50.0, 0.5, 0.0, 1.0, 0.0, 0.0], (20, 1)))


@pytest.mark.parametrize("t", [0, 37, 190, T - 2])
def test_no_feature_reads_a_candle_after_its_row(t):
    x = _candles()
    base, _ = _compute(x, INDICATORS)
    changed = x.copy()
    factor = np.exp(np.random.default_rng(t).normal(0.0, 0.3, (T - t - 1, 1)))
    changed[t + 1 :, :4] *= factor  # prices of every later candle (invariants kept)
    changed[t + 1 :, [0, 2]] *= 0.99  # and their shape: open and low move further
    changed[t + 1 :, 4] += 5.0
    after, _ = _compute(changed, INDICATORS)
    np.testing.assert_array_equal(after[: t + 1], base[: t + 1])
    # Every column that reads prices or volume does see the later candles' change.
    calendar = [INDICATORS.index(n) for n in features.CALENDAR]
    moved = ~np.isclose(after[t + 1 :], base[t + 1 :], rtol=1e-12, equal_nan=True).all(axis=0)
    assert moved.sum() == len(INDICATORS) - len(calendar)
    assert not moved[calendar].any()


def test_window_candles_follow_the_interval():
    assert features.window_candles("15m") == {"1d": 96, "1w": 672, "1m": 2880}
    assert features.window_candles("1h") == {"1d": 24, "1w": 168, "1m": 720}
    assert features.window_candles("1d") == {"1d": 1, "1w": 7, "1m": 30}
    assert features.warmup_candles(("open", "garman_klass_1m", "rsi"), "15m") == 2879
    assert features.warmup_candles(("open", "macd_signal"), "15m") == 33


def test_a_flat_window_has_the_floored_volatility():
    x = np.tile([10.0, 10.0, 10.0, 10.0, 0.0], (50, 1))
    names = ("parkinson_1d", "garman_klass_1w", "log_range", "volume_norm_1d")
    got, first_valid = _compute(x, names)
    assert first_valid == 41
    floor = math.log(features.VOL_FLOOR)
    np.testing.assert_allclose(got[41:], np.tile([floor, floor, 0.0, 1.0], (9, 1)), rtol=1e-15)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown feature"):
        features.compute(_candles(), ("close", "stochastic"))
    with pytest.raises(ValueError, match=r"\[T, 5\]"):
        features.compute(_candles()[:, :4], ("close",))
    with pytest.raises(ValueError, match="interval"):
        features.compute(_candles(), ("close", "parkinson_1w"))
    with pytest.raises(ValueError, match="open times"):
        features.compute(_candles(), ("close", "hour_sin"), INTERVAL)


LONG_HISTORY_RUN = ("open", "high", "low", "close", *features.LONG_HISTORY)


def _long_history_config():
    """configs/gru.py:tiny on two series with every long-history feature as input.

    15m needs 2879 candles of warm-up before the 1200 it keeps, so the synthetic series
    are that much longer; 1h needs 719.
    """
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.data.symbols, c.data.intervals = ("BTCUSDT",), ("15m", "1h")
    c.data.features = LONG_HISTORY_RUN
    c.data.synthetic_candles = c.data.max_candles + 2879 + 21
    c.train.epochs, c.eval.plots = 1, False
    return c


@pytest.fixture(scope="module")
def long_history_run(tmp_path_factory):
    """(workdir, results.json) of a tiny run trained on the long-history features."""
    workdir = str(tmp_path_factory.mktemp("long_history"))
    return workdir, cpbjax.train(_long_history_config(), workdir)


def test_tiny_run_trains_on_long_history_features_and_keeps_max_candles(long_history_run):
    _, results = long_history_run
    assert set(results["series"]) == {"BTCUSDT-15m", "BTCUSDT-1h"}, results.get("skipped")
    for entry in results["series"].values():
        assert math.isfinite(entry["best_val_loss"])
        # The warm-up came out of the older history, not the kept candles.
        assert entry["test"]["windows"] > 0 and entry["data"]["used_candles"] == 1200


def test_tiny_run_with_long_history_features_predicts(long_history_run):
    workdir, _ = long_history_run
    doc = predict.run_predict(_long_history_config(), workdir)
    assert set(doc["series"]) == {"BTCUSDT-15m", "BTCUSDT-1h"}, doc["skipped"]
    for s in doc["series"].values():
        prices = [[step[k] for k in ("open", "high", "low", "close")] for step in s["forecast"]]
        assert np.shape(prices) == (10, 4) and np.isfinite(prices).all()
    with open(os.path.join(workdir, "forecast.json")) as f:
        assert json.load(f)["series"].keys() == doc["series"].keys()


def test_predict_without_the_warm_up_history_names_it(long_history_run):
    workdir, _ = long_history_run
    c = _long_history_config()
    c.data.synthetic_candles = 2879 + 29  # one candle short of warm-up + lookback at 15m
    c.predict.intervals = ("15m",)
    with pytest.raises(predict.NothingToForecast) as e:
        predict.run_predict(c, workdir)
    assert "past the warm-up of data.features (2909 candles of 15m in all)" in str(e.value)


def test_forecast_config_loads_the_months_the_warm_up_needs():
    c = _long_history_config()
    c.data.source, c.data.months = "binance", 1
    for interval, months in (("15m", 2), ("1h", 2), ("4h", 2), ("1d", 3)):
        c.data.intervals = (interval,)
        # (2879 + 30) 15m candles are 30.3 days: 2 months of at least 28 days.
        got = trained_run.forecast_config(c, c, [f"BTCUSDT-{interval}"]).data
        assert got.months == months == trained_run.history_months(got)
    c.data.months = 12
    assert trained_run.forecast_config(c, c, ["BTCUSDT-1h"]).data.months == 12
    c.data.features, c.data.months = ("open", "high", "low", "close"), 1
    assert trained_run.forecast_config(c, c, ["BTCUSDT-1h"]).data.months == 1  # 30 candles fit


def test_tiny_run_reports_har_beside_vol_band(long_history_run):
    workdir, results = long_history_run
    for entry in results["series"].values():
        har = entry["test"]["har"]
        assert har["fit_windows"] == entry["test"]["vol_band"]["fit_windows"] > 0
        assert set(har["columns"]) == {"high", "low"}
        assert all(math.isfinite(har["columns"][c]["skill"]) for c in ("high", "low"))
    with open(os.path.join(workdir, "results.json")) as f:
        assert "har" in json.load(f)["series"]["BTCUSDT-15m"]["val"]
    with open(os.path.join(workdir, "report.md")) as f:
        report = f.read()
    assert "| HAR high | HAR low |" in report
    baseline_table = report.split("| HAR high | HAR low |")[1].splitlines()
    row = next(line for line in baseline_table if line.startswith("| BTCUSDT-1h |"))
    har = results["series"]["BTCUSDT-1h"]["test"]["har"]["columns"]
    assert row.endswith(f"| {100 * har['high']['skill']:+.2f} | {100 * har['low']['skill']:+.2f} |")
