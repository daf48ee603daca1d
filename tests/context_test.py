"""The context features (cpbjax/data/context.py) against plain loops over candles, causal,
warm-up as declared, and fed to the model unscaled."""

import math

import numpy as np
import pytest

from cpbjax.data import context, features, normalize
from cpbjax.data.series import INTERVAL_MS

DAY = 86_400_000


def candles(interval="1h", days=40, holes=((100, 130), (900, 901)), seed=0):
    """(ohlcv [T, 5], open times [T]) of a random walk with some candles missing."""
    step = INTERVAL_MS[interval]
    n = days * DAY // step
    rng = np.random.default_rng(seed)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.concatenate([[100.0], close[:-1]])
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0, 0.005, n)))
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0, 0.005, n)))
    volume = rng.exponential(10, n) * (rng.random(n) > 0.05)  # some candles without trades
    keep = np.ones(n, bool)
    for a, b in holes:
        keep[a:b] = False
    times = 1_700_000_000_000 // step * step + np.arange(n) * step
    return np.stack([open_, high, low, close, volume], 1)[keep], times[keep]


def loop_sigma(ohlcv, t):
    w = [0.9 ** (29 - i) for i in range(30)]
    r = [math.log(ohlcv[t - 29 + i, 1] / ohlcv[t - 29 + i, 2]) for i in range(30)]
    return sum(a * b for a, b in zip(w, r, strict=True)) / sum(w)


def column(name, ohlcv, times, interval="1h"):
    return context.SeriesContext(ohlcv, interval, times).column(name)


@pytest.mark.parametrize("name,days", [("return_1d", 1), ("return_1w", 7)])
def test_scaled_return_is_the_span_move_over_the_band_range(name, days):
    ohlcv, times = candles()
    got = column(name, ohlcv, times)
    n = days * 24
    for t in (n - 1, n, n + 5, len(ohlcv) - 1):
        if t < max(n, 29):
            assert np.isnan(got[t])
            continue
        want = math.log(ohlcv[t, 3] / ohlcv[t - n, 3]) / (loop_sigma(ohlcv, t) * math.sqrt(n))
        assert got[t] == pytest.approx(want, rel=1e-9)


def loop_time_of_day(ohlcv, times, t, ahead, step):
    """Mean log range at the time of day of candle t+ahead over 30 days, over the 30 days'."""
    by_time = {int(tm): math.log(ohlcv[i, 1] / ohlcv[i, 2]) for i, tm in enumerate(times)}
    per_day = DAY // step
    first = -(-ahead // per_day)
    target = times[t] + ahead * step
    same = [by_time[m] for k in range(first, first + 30) if (m := int(target - k * DAY)) in by_time]
    whole = [by_time[m] for j in range(30 * per_day) if (m := int(times[t] - j * step)) in by_time]
    return math.log((sum(same) / len(same)) / (sum(whole) / len(whole)))


@pytest.mark.parametrize("interval,ahead", [("1h", 1), ("1h", 10), ("15m", 5)])
def test_time_of_day_range_reads_the_same_hour_by_open_time_across_gaps(interval, ahead):
    ohlcv, times = candles(interval, days=35)
    step = INTERVAL_MS[interval]
    got = column(f"range_tod_{ahead}", ohlcv, times, interval)
    per_day = DAY // step
    first_full = np.searchsorted(times, times[0] + (30 * per_day - 1) * step)
    assert np.isnan(got[: first_full - 1]).all()
    for t in (first_full + 1, (first_full + len(times)) // 2, len(times) - 1):
        assert got[t] == pytest.approx(loop_time_of_day(ohlcv, times, t, ahead, step), rel=1e-9)


@pytest.mark.parametrize("name", ["volume_1d", "volume_1m"])
def test_volume_ratios_against_a_loop(name):
    ohlcv, times = candles()
    got = column(name, ohlcv, times)
    v = ohlcv[:, 4]
    for t in (24 * 30 - 1, 24 * 30 + 17, len(v) - 1):
        day = v[t - 23 : t + 1].mean()
        num, den = (v[t], day) if name == "volume_1d" else (day, v[t - 719 : t + 1].mean())
        want = math.log(max(num / den, 1e-3)) if den > 0 else 0.0
        assert got[t] == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_interval_is_log2_of_hours():
    ohlcv, times = candles("15m", days=2, holes=())
    assert (column("interval", ohlcv, times, "15m") == -2.0).all()
    ohlcv, times = candles("1h", days=2, holes=())
    assert (column("interval", ohlcv, times, "1h") == 0.0).all()


def test_every_context_column_is_causal_and_its_warmup_is_declared():
    ohlcv, times = candles(days=45)
    full, first = features.compute(ohlcv, context.NAMES, "1h", times)
    cut = len(ohlcv) - 100
    later = ohlcv.copy()
    later[cut:, :4] *= 3.0  # every later candle changes
    later[cut:, 4] += 50.0
    again, _ = features.compute(later, context.NAMES, "1h", times)
    np.testing.assert_array_equal(full[:cut], again[:cut])
    # The first usable row is where the declared warm-up of the slowest column ends (the
    # missing candles of the fixture come before it, so rows count as candles here).
    assert first == features.warmup_candles(context.NAMES, "1h")


def test_context_columns_reach_the_model_unscaled():
    ohlcv, times = candles(days=45)
    names = ("open", "high", "low", "close", "rsi", *context.NAMES)
    feats, first = features.compute(ohlcv, names, "1h", times)
    feats = feats[first:]
    inputs, *_, norm = normalize.normalise(ohlcv[first:, :4], feats, names, 500, "last_close")
    ctx = [names.index(n) for n in context.NAMES]
    np.testing.assert_array_equal(inputs[:, ctx], feats[:, ctx])
    np.testing.assert_array_equal(norm["feature_mean"][ctx], 0.0)
    np.testing.assert_array_equal(norm["feature_std"][ctx], 1.0)
    rsi = names.index("rsi")  # the other non-price features are still z-scored
    assert abs(inputs[:500, rsi].mean()) < 1e-9


@pytest.mark.parametrize("interval", ["15m", "1h"])
def test_a_series_shorter_than_the_warmup_has_no_defined_row(interval):
    ohlcv, times = candles(interval, days=2, holes=())
    feats, first = features.compute(ohlcv, context.NAMES, interval, times)
    assert first == len(ohlcv)
    month_or_week = [n for n in context.NAMES if n.startswith(("range_tod", "return_1w"))]
    month_or_week.append("volume_1m")
    assert np.isnan(feats[:, [context.NAMES.index(n) for n in month_or_week]]).all()


def test_a_day_interval_has_no_time_of_day_cycle():
    ohlcv, times = candles("1d", days=80, holes=())
    got = column("range_tod_1", ohlcv, times, "1d")
    assert (got == 0.0).all()
