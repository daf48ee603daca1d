"""Tests of cpbjax.data.features against plain row-by-row reference computations."""

import math
import os

import numpy as np
import pytest

from cpbjax import config as config_lib
from cpbjax.data import features

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T = 90


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
    }


REFERENCES = _references(_candles())


def test_every_feature_has_a_reference_and_passes_validation():
    assert set(REFERENCES) == set(features.NAMES)
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py"))
    ohlc = ("open", "high", "low", "close")
    c.data.features = (*ohlc, *(n for n in features.NAMES if n not in ohlc))
    config_lib.validate(c)  # the config accepts exactly the names features.py computes
    c.data.features = ("open", "high", "low", "close", "not_a_feature")
    with pytest.raises(config_lib.ConfigError, match="not_a_feature"):
        config_lib.validate(c)


@pytest.mark.parametrize("name", features.NAMES)
def test_indicator_matches_reference(name):
    expected, warmup = REFERENCES[name]
    expected = np.asarray(expected, np.float64)
    got, first_valid = features.compute(_candles(), (name,))
    assert got.shape == (T, 1)
    assert first_valid == warmup
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


def test_features_are_causal():
    x = _candles()
    base, _ = features.compute(x, features.NAMES)
    changed = x.copy()
    changed[60:, :4] *= 1.7
    changed[60:, 4] += 5.0
    after, _ = features.compute(changed, features.NAMES)
    np.testing.assert_array_equal(after[:60], base[:60])
    assert not np.allclose(after[60:], base[60:])


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown feature"):
        features.compute(_candles(), ("close", "stochastic"))
    with pytest.raises(ValueError, match=r"\[T, 5\]"):
        features.compute(_candles()[:, :4], ("close",))
