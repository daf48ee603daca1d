"""Tests of the HAR baseline (cpbjax.score.baselines) against a plain-loop, np.linalg.lstsq reference."""

import datetime
import math

import numpy as np
import pytest

from cpbjax.data import synthetic
from cpbjax.score import baselines

H = 10
INTERVAL = "1h"
SPANS = (24, 168, 720)  # 1 day, week and month of 1h candles


@pytest.fixture(scope="module")
def candles():
    """(ohlc [900, 4], open times [900]) of one synthetic 1h series."""
    s = synthetic.generate("BTCUSDT", INTERVAL, 900, seed=3)
    return s.ohlcv[:, :4].copy(), s.open_time_ms


# Windows from the first one with L = 30 candles through both the expanding month (before
# row 719) and the full one; scored windows come later.
FIT_ENDS = np.arange(29, 700)
SCORED_ENDS = np.arange(720, 880)


def _ref_vols(ohlc, t):
    """The 6 log volatilities at window end t: the mean over what there is, up to n candles."""
    ln2, row = math.log(2.0), []
    for estimator in ("parkinson", "garman_klass"):
        for n in SPANS:
            total, count = 0.0, 0
            for i in range(max(0, t - n + 1), t + 1):
                o, hi, lo, c = ohlc[i]
                var = math.log(hi / lo) ** 2 / (4 * ln2)
                if estimator == "garman_klass":
                    var = 0.5 * math.log(hi / lo) ** 2 - (2 * ln2 - 1) * math.log(c / o) ** 2
                total, count = total + var, count + 1
            row.append(math.log(math.sqrt(total / count)))
    return row


def _ref_regressors(vols, times, t, h):
    """Row of the design for window end t, step h: its 6 log vols, then 24 hour dummies."""
    when = datetime.datetime.fromtimestamp((times[t] + h * 3_600_000) / 1000, datetime.UTC)
    return vols + [1.0 if when.hour == hour else 0.0 for hour in range(24)]


def _ref_lad(ratios, sigmas):
    """argmin_k sum |ratio - k * sigma| by trying every candidate ratio / sigma."""
    candidates = ratios / sigmas
    costs = np.abs(ratios[None, :] - candidates[:, None] * sigmas[None, :]).sum(axis=1)
    return candidates[np.argmin(costs)]


def _ref_har(ohlc, times, fit_ends, scored_ends):
    """(high [N, H], low [N, H]) of a HAR fitted and applied with plain loops."""
    vols = {t: _ref_vols(ohlc, t) for t in (*fit_ends, *scored_ends)}
    design = {
        (t, h): _ref_regressors(vols[t], times, t, h) for t in fit_ends for h in range(1, H + 1)
    }
    rows, ys = [], []
    for (t, h), row in design.items():
        log_range = math.log(ohlc[t + h, 1] / ohlc[t + h, 2])
        if log_range > 0:
            rows.append(row)
            ys.append(math.log(log_range))
    coef = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)[0]
    k_high, k_low = [], []
    for h in range(1, H + 1):
        sig = np.array([math.exp(np.dot(design[t, h], coef)) for t in fit_ends])
        close = ohlc[fit_ends, 3]
        k_high.append(_ref_lad(np.log(ohlc[fit_ends + h, 1] / close), sig))
        k_low.append(_ref_lad(-np.log(ohlc[fit_ends + h, 2] / close), sig))
    high, low = np.zeros((len(scored_ends), H)), np.zeros((len(scored_ends), H))
    for i, t in enumerate(scored_ends):
        for h in range(1, H + 1):
            sig = math.exp(
                np.dot(design.get((t, h)) or _ref_regressors(vols[t], times, t, h), coef)
            )
            high[i, h - 1] = ohlc[t, 3] * math.exp(k_high[h - 1] * sig)
            low[i, h - 1] = ohlc[t, 3] * math.exp(-k_low[h - 1] * sig)
    return high, low


def test_har_matches_a_plain_loop_lstsq_reference(candles):
    ohlc, times = candles
    flat = ohlc.copy()
    # Five fitted target candles with high == low: left out of the regression only.
    flat[100:105, [0, 1, 2]] = flat[100:105, [3]]
    fit = baselines.fit_har(flat, times, INTERVAL, FIT_ENDS, H)
    high, low = baselines.har_predict(fit, flat, times, INTERVAL, SCORED_ENDS, H)
    ref_high, ref_low = _ref_har(flat, times, FIT_ENDS, SCORED_ENDS)
    np.testing.assert_allclose(high, ref_high, rtol=1e-9)
    np.testing.assert_allclose(low, ref_low, rtol=1e-9)
    close = flat[SCORED_ENDS, 3][:, None]
    assert (high > close).mean() > 0.9 and (low < close).mean() > 0.9  # a band around close


def _moved_after(ohlc, t, seed):
    """ohlc with every candle after row t scaled by its own random factor."""
    changed = ohlc.copy()
    rng = np.random.default_rng(seed)
    changed[t + 1 :] *= np.exp(rng.normal(0.0, 0.05, (len(ohlc) - t - 1, 1)))
    changed[t + 1 :, 1] *= 1.01  # and wider ranges
    return changed


def test_har_never_reads_a_candle_after_the_window_end(candles):
    ohlc, times = candles
    fit = baselines.fit_har(ohlc, times, INTERVAL, FIT_ENDS, H)
    last_read = FIT_ENDS.max() + H  # the newest target candle of a fitted window
    refit = baselines.fit_har(_moved_after(ohlc, last_read, 0), times, INTERVAL, FIT_ENDS, H)
    for key in ("coef", "k_high_h", "k_low_h"):
        np.testing.assert_array_equal(refit[key], fit[key])
    nudged = ohlc.copy()
    nudged[last_read, 1] *= 1.05  # the newest fitted candle itself does move the fit
    assert not np.array_equal(
        baselines.fit_har(nudged, times, INTERVAL, FIT_ENDS, H)["k_high_h"], fit["k_high_h"]
    )
    for t in (29, 200, 750, 880):  # a forecast from t reads candles <= t only
        ends = np.array([t])
        before = baselines.har_predict(fit, ohlc, times, INTERVAL, ends, H)
        after = baselines.har_predict(fit, _moved_after(ohlc, t, t), times, INTERVAL, ends, H)
        np.testing.assert_array_equal(np.stack(after), np.stack(before))
