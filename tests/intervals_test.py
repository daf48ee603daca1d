"""Tests of the calibrated interval (cpbjax/score/intervals.py interval_scale, fit_calibration,
fit_before, calibrated_bounds) and of how it travels: evaluate_model, forecast files, forecast.json /
CSV flattening. (Saved models, predict, the API and exports: tests/api_test.py.)"""

import csv
import io
import math
import types

import numpy as np
import pytest

from cpbjax import band
from cpbjax.columns import COLUMNS
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.modes import trained_run
from cpbjax.score import evaluate, forecast, intervals
from tests.fake_data import H, L, Probe, make_prep, probe_params

LEVELS = (0.1, 0.9)


def _garch_like_series(n: int, seed: int) -> types.SimpleNamespace:
    """Candles whose volatility switches regime every 500 candles (a 4x range), so an
    interval that ignores recent volatility would cover too much in calm stretches and
    too little in wild ones. Only the fields fit_calibration reads."""
    rng = np.random.default_rng(seed)
    vol_T = np.repeat(rng.choice([0.002, 0.008], size=n // 500 + 1), 500)[:n]
    close = 100 * np.exp(np.cumsum(vol_T * rng.standard_normal(n)))
    open_ = np.r_[close[0], close[:-1]]
    spread = vol_T[:, None] * np.abs(rng.standard_normal((n, 2)))
    high = np.maximum(open_, close) * np.exp(spread[:, 0])
    low = np.minimum(open_, close) * np.exp(-spread[:, 1])
    times = np.arange(n, dtype=np.int64) * 3_600_000
    return types.SimpleNamespace(ohlc=np.stack([open_, high, low, close], 1), open_time_ms=times)


def _plain_sigma(ohlc, t: int) -> float:
    weights = [band.EWMA_DECAY**age for age in range(L)]
    logs = [math.log(ohlc[t - age, 1] / ohlc[t - age, 2]) for age in range(L)]
    return sum(w * x for w, x in zip(weights, logs, strict=True)) / sum(weights)


def _plain_conformal(scores: list, q: float) -> float:
    """Upper q: the smallest score with at least (n+1)q scores at or below it; lower q:
    the largest with at least (n+1)(1-q) at or above it (the most extreme if none)."""
    n = len(scores)
    if q >= 0.5:
        need = math.ceil((n + 1) * q)
        ok = [s for s in scores if sum(x <= s for x in scores) >= need]
        return min(ok) if ok else max(scores)
    need = math.ceil((n + 1) * (1 - q))
    ok = [s for s in scores if sum(x >= s for x in scores) >= need]
    return max(ok) if ok else min(scores)


def test_fit_calibration_matches_a_plain_loop():
    prep = _garch_like_series(400, seed=0)
    ends = np.arange(L, 400 - H, 7)
    rng = np.random.default_rng(1)
    point = prep.ohlc[ends, 3][:, None, None] * np.exp(
        0.003 * rng.standard_normal((len(ends), H, 4))
    )
    cal = intervals.fit_calibration(prep, ends, point, evaluate.EvalSpec(L, H, LEVELS))
    assert cal["levels"] == list(LEVELS) and cal["fitted_on_windows"] == len(ends)
    k = np.asarray(cal["k"])
    assert k.shape == (H, 4, 2)
    for h in (0, H - 1):
        for c in range(4):
            scores = [
                math.log(prep.ohlc[t + 1 + h, c] / point[i, h, c]) / _plain_sigma(prep.ohlc, t)
                for i, t in enumerate(ends)
            ]
            expected = [_plain_conformal(scores, q) for q in LEVELS]
            np.testing.assert_allclose(k[h, c], expected, rtol=1e-12)
    # The bounds: point * exp(k * sigma) of each window.
    bounds = intervals.calibrated_bounds(cal, prep.ohlc, ends[:3], point[:3], L)
    sigma = _plain_sigma(prep.ohlc, int(ends[2]))
    np.testing.assert_allclose(bounds[2], point[2][..., None] * np.exp(k * sigma), rtol=1e-12)


def test_calibrated_interval_covers_its_level_on_later_windows():
    """Fitted on 3,000 windows, the 80% interval of a persistence forecast covers 80% of the
    next 6,000 windows' outcomes (binomial noise of overlapping windows: about 1 point)."""
    prep = _garch_like_series(9_100, seed=2)
    fit_ends, later = np.arange(L, 3_000), np.arange(3_000, 9_000)
    point = lambda e: np.repeat(prep.ohlc[e, 3][:, None, None], 4, 2).repeat(H, 1)  # noqa: E731
    cal = intervals.fit_calibration(
        prep, fit_ends, point(fit_ends), evaluate.EvalSpec(L, H, LEVELS)
    )
    bounds = intervals.calibrated_bounds(cal, prep.ohlc, later, point(later), L)
    actual = prep.ohlc[later[:, None] + np.arange(1, H + 1)]
    inside = (actual >= bounds[..., 0]) & (actual <= bounds[..., 1])
    coverage = dict(zip(COLUMNS, inside.mean((0, 1)), strict=True))
    for col in ("high", "low", "close"):
        assert abs(coverage[col] - 0.8) < 0.02, coverage
    # The next open equals the last close, so every fit score of open at h = 1 is 0: the
    # tied bounds cover all those outcomes, and split conformal only errs on the safe side.
    assert 0.8 <= coverage["open"] < 0.9, coverage
    # Scaled by the window's volatility: the wild regime's intervals are wider.
    width = (bounds[..., 3, 1] - bounds[..., 3, 0]).mean(1) / prep.ohlc[later, 3]
    sigma = _plain_sigmas(prep, later)
    wild, calm = sigma > np.quantile(sigma, 0.75), sigma < np.quantile(sigma, 0.25)
    assert np.median(width[wild]) > 2 * np.median(width[calm])


def _plain_sigmas(prep, ends) -> np.ndarray:
    return np.array([_plain_sigma(prep.ohlc, int(t)) for t in ends])


def test_sigma_weighting_minimises_the_pinball_loss_in_log_price():
    """weighting="sigma": no other k of the scores does better on the fit windows."""
    prep = _garch_like_series(600, seed=3)
    ends = np.arange(L, 600 - H)
    point = np.repeat(prep.ohlc[ends, 3][:, None, None], 4, 2).repeat(H, 1)
    cal = intervals.fit_calibration(prep, ends, point, evaluate.EvalSpec(L, H, LEVELS), "sigma")
    k_HCJ = np.asarray(cal["k"])
    sigma = _plain_sigmas(prep, ends)
    log_ratio = np.log(prep.ohlc[ends + 1, 3] / point[:, 0, 3])  # close, h = 1
    candidates = log_ratio / sigma  # a pinball minimiser is always one of the scores

    def loss(k, q):
        return intervals.pinball(log_ratio, (k * sigma)[:, None], [q]).sum()

    for j, q in enumerate(LEVELS):
        assert loss(k_HCJ[0, 3, j], q) <= min(loss(k, q) for k in candidates) + 1e-12
        assert np.isclose(candidates, k_HCJ[0, 3, j], rtol=1e-12).any()


def test_evaluate_model_fits_before_each_split_and_saves_the_test_bounds(tmp_path):
    prep = make_prep()
    params = probe_params(2)
    entry, record, cal, _, _ = evaluate.evaluate_model(
        Probe(), params, prep, evaluate.EvalSpec(L, H, LEVELS)
    )
    point = {
        s: forecast.split_forecast(Probe(), params, prep, s, evaluate.EvalSpec(L, H)).prices_NHC
        for s in ("train", "val")
    }
    train_val = np.concatenate([point["train"], point["val"]])
    ends = np.concatenate([prep.ends["train"], prep.ends["val"]])
    assert cal == intervals.fit_calibration(
        prep, ends, train_val, evaluate.EvalSpec(L, H, LEVELS), "sigma"
    )
    on_val = entry["val"]["calibrated_interval"]["fitted_on"]
    assert on_val["fitted_on_windows"] == len(prep.ends["train"])  # val: fitted on train
    block = entry["test"]["calibrated_interval"]
    assert block["central"] == list(LEVELS)
    assert block["fitted_on"]["last_window_end"] == entry["val"]["last_window_end"]
    bounds, actual = record["interval_bounds"], record["actual"]
    np.testing.assert_array_equal(record["interval_levels"], LEVELS)
    for c, col in enumerate(COLUMNS):
        inside = (actual[..., c] >= bounds[..., c, 0]) & (actual[..., c] <= bounds[..., c, 1])
        assert block["columns"][col]["coverage"] == pytest.approx(inside.mean(), abs=1e-12)
        width = (bounds[..., c, 1] - bounds[..., c, 0]).mean()
        assert block["columns"][col]["width"] == pytest.approx(width, rel=1e-12)
    entry, record, cal, _, _ = evaluate.evaluate_model(
        Probe(), params, prep, evaluate.EvalSpec(L, H)
    )
    assert cal is None and "calibrated_interval" not in entry["test"]
    assert "interval_bounds" not in record


def test_forecast_csv_flattens_intervals():
    """Candles with an interval get its columns; those without leave them empty."""
    base = {"step": 1, "open_time": "T", "open_time_ms": 1, **dict.fromkeys(COLUMNS, 2.0)}
    with_iv = {
        **base,
        "interval": {"lower": dict.fromkeys(COLUMNS, 1.5), "upper": dict.fromkeys(COLUMNS, 2.5)},
    }
    series = {
        "A-1h": {"symbol": "A", "interval": "1h", "forecast": [base]},
        "B-1h": {"symbol": "B", "interval": "1h", "forecast": [with_iv, base]},
    }
    rows = list(csv.DictReader(io.StringIO(forecast.forecast_csv(series))))
    assert [r["series"] for r in rows] == ["A-1h", "B-1h", "B-1h"]
    assert rows[0]["close"] == "2.0" and rows[0]["close_lower"] == ""
    assert rows[1]["low_lower"] == "1.5" and rows[1]["high_upper"] == "2.5"
    assert rows[2]["close"] == "2.0" and rows[2]["close_upper"] == ""
    assert forecast.flat_candle(base) == base


@pytest.mark.parametrize("levels", [(0.9, 0.1), (0.1,), (0.1, 0.5), (0.0, 0.9), ("a", "b")])
def test_bad_interval_levels_are_refused(levels):
    c = config_lib.load("configs/gru.py:tiny")
    c.eval.interval_levels = levels
    with pytest.raises(ConfigError, match="eval.interval_levels"):
        config_lib.validate(c)


def test_no_interval_levels_is_allowed():
    c = config_lib.load("configs/gru.py:tiny")
    c.eval.interval_levels = ()
    config_lib.validate(c)


def _with_scale(scale) -> dict:
    return {"levels": [0.1, 0.9], "k": np.zeros((H, 4, 2)).tolist(), "scale": scale}


@pytest.mark.parametrize(
    "calibration, words",
    [
        ({"k": []}, "malformed ('levels')"),
        ({"levels": [0.9, 0.1], "k": np.zeros((H, 4, 2)).tolist()}, "are not (lower, upper)"),
        ({"levels": [0.1, 0.9], "k": np.zeros((H, 4, 3)).tolist()}, f"expected finite [{H}, 4, 2]"),
        ({"levels": [0.1, 0.9], "k": np.full((H, 4, 2), np.nan).tolist()}, "expected finite"),
        (_with_scale({"long_candles": 0, "long_weight": 0.25}), "scale"),
        (_with_scale({"long_candles": 168, "long_weight": 1.0}), "scale"),
        (_with_scale({"long_candles": True, "long_weight": 0.25}), "scale"),
        (_with_scale({"long_candles": 168, "long_weight": False}), "scale"),
        (_with_scale({"long_weight": 0.25}), "scale"),
        (_with_scale([168, 0.25]), "scale"),
    ],
)
def test_a_malformed_saved_calibration_is_named(calibration, words):
    with pytest.raises(ValueError, match=r"m/meta.json: interval_calibration") as e:
        intervals.check_calibration(calibration, H, "m/meta.json")
    assert words in str(e.value)
    good = {"levels": [0.1, 0.9], "k": np.zeros((H, 4, 2)).tolist()}
    assert intervals.check_calibration(good, H, "m") is good
    assert intervals.check_calibration(None, H, "m") is None


def _plain_scale(ohlc, t: int, long_candles: int, weight: float) -> float:
    """sigma^(1 - w) * (mean log range of the long_candles candles up to t)^w, by a loop."""
    first = max(0, t + 1 - long_candles)
    logs = [math.log(ohlc[u, 1] / ohlc[u, 2]) for u in range(first, t + 1)]
    return _plain_sigma(ohlc, t) ** (1 - weight) * (sum(logs) / len(logs)) ** weight


def test_interval_scale_matches_a_plain_loop_and_reads_no_later_candle():
    prep = _garch_like_series(1_200, seed=3)
    scale = {"long_candles": 500, "long_weight": 0.3}
    ends = np.array([L - 1, 100, 499, 500, 1_000])  # the first three: shorter history
    got = intervals.interval_scale(prep.ohlc, ends, L, scale)
    expected = [_plain_scale(prep.ohlc, int(t), 500, 0.3) for t in ends]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    for t in ends:  # wreck every candle after the window's end: the same scale, bit for bit
        later = prep.ohlc.copy()
        noise = np.random.default_rng(int(t)).normal(0, 0.5, (len(later) - t - 1, 1))
        later[t + 1 :] *= np.exp(noise)
        before = intervals.interval_scale(prep.ohlc, [t], L, scale)
        np.testing.assert_array_equal(intervals.interval_scale(later, [t], L, scale), before)
    window_only = intervals.interval_scale(prep.ohlc, ends, L, intervals.WINDOW_ONLY)
    np.testing.assert_array_equal(window_only, band.ewma_range(prep.ohlc, ends, L))


def test_fit_before_blends_the_configured_days_and_the_bounds_use_them():
    """1h candles: 7 days are 168 candles. A calibration saved before the blend (no
    `scale`) is the window's sigma alone."""
    prep = _garch_like_series(2_000, seed=4)
    prep.interval = "1h"
    prep.ends = {"train": np.arange(L, 1_400), "val": np.arange(1_400, 1_700)}
    point = {
        s: np.repeat(prep.ohlc[e, 3][:, None, None], 4, 2).repeat(H, 1)
        for s, e in prep.ends.items()
    }
    cal = intervals.fit_before(
        prep, "test", point, evaluate.EvalSpec(L, H, LEVELS, False, (7.0, 0.25))
    )
    assert cal["scale"] == {"long_candles": 168, "long_weight": 0.25}
    ends = np.concatenate([prep.ends["train"], prep.ends["val"]])
    assert cal == intervals.fit_calibration(
        prep,
        ends,
        np.concatenate(list(point.values())),
        evaluate.EvalSpec(L, H, LEVELS),
        "sigma",
        cal["scale"],
    )
    t, k = 1_800, np.asarray(cal["k"])
    bounds = intervals.calibrated_bounds(cal, prep.ohlc, [t], point["val"][:1], L)
    s = _plain_scale(prep.ohlc, t, 168, 0.25)
    np.testing.assert_allclose(bounds[0], point["val"][0][..., None] * np.exp(k * s), rtol=1e-12)
    old = {key: v for key, v in cal.items() if key != "scale"}
    bounds = intervals.calibrated_bounds(old, prep.ohlc, [t], point["val"][:1], L)
    sigma = _plain_sigma(prep.ohlc, t)
    np.testing.assert_allclose(
        bounds[0], point["val"][0][..., None] * np.exp(k * sigma), rtol=1e-12
    )
    assert intervals.fit_before(
        prep, "test", point, evaluate.EvalSpec(L, H, LEVELS, False, (7.0, 0.0))
    )["scale"] == (intervals.WINDOW_ONLY)


def test_predict_loads_the_days_the_interval_scale_averages():
    c = config_lib.load("configs/gru.py:tiny")
    c.data.intervals = ("1h",)
    assert trained_run.history_months(c.data) == 1
    assert trained_run.history_months(c.data, 60.0) == 3  # 60 days of 28-day files
    c.data.source, c.data.months = "binance", 1
    c.data.lookback = 24 * 40  # 40 days of 1h candles: more than VOL_DAYS
    assert trained_run.forecast_config(c, c, ["BTCUSDT-1h"]).data.months == 2
    c.data.lookback = 24
    months = trained_run.history_months(c.data, intervals.VOL_DAYS)
    assert trained_run.forecast_config(c, c, ["BTCUSDT-1h"]).data.months == months == 1


def test_the_interval_is_also_scored_against_the_band_with_its_own_scale():
    """A persistence forecast's interval IS the band with the interval's scale (same fit,
    same windows): skill 0 against it, while the plain band differs. Without the blend
    there is no second band."""
    prep = _garch_like_series(2_000, seed=5)
    prep.interval = "1h"
    prep.ends = {
        "train": np.arange(L, 1_400),
        "val": np.arange(1_400, 1_700),
        "test": np.arange(1_700, 2_000 - H),
    }
    point = {
        s: np.repeat(prep.ohlc[e, 3][:, None, None], 4, 2).repeat(H, 1)
        for s, e in prep.ends.items()
    }
    cal = intervals.fit_before(
        prep, "test", point, evaluate.EvalSpec(L, H, LEVELS, False, (7.0, 0.25))
    )
    block = intervals.score_calibrated(
        prep, "test", prep.ends["test"], evaluate.EvalSpec(L, H), point["test"], cal
    )
    actual = prep.ohlc[prep.ends["test"][:, None] + np.arange(1, H + 1)]
    bounds = intervals.calibrated_bounds(cal, prep.ohlc, prep.ends["test"], point["test"], L)
    for c, col in enumerate(COLUMNS):
        scores = block["columns"][col]
        own = intervals.pinball(actual[..., c], bounds[..., c, :], LEVELS).mean()
        assert scores["scaled_band_pinball"] == pytest.approx(own, rel=1e-12)
        assert scores["skill_vs_scaled_band"] == pytest.approx(0.0, abs=1e-12)
        assert scores["band_pinball"] != pytest.approx(own, rel=1e-6)
    plain = intervals.fit_before(
        prep, "test", point, evaluate.EvalSpec(L, H, LEVELS, False, (7.0, 0.0))
    )
    block = intervals.score_calibrated(
        prep, "test", prep.ends["test"], evaluate.EvalSpec(L, H), point["test"], plain
    )
    assert "skill_vs_scaled_band" not in block["columns"]["close"]
