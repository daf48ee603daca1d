"""Scores of issue #42's experiment: the band fitted per series, skill against the better naive
forecast in price units, per series and column, with the product's own definitions
(cpbjax/score/metrics.py, cpbjax/score/baselines.py), on the window table of frame.py.

Forecasts here are log ratios to the window's last close, [N, H, 3] for (high, low, close);
a learner's output is a residual over the band in units of sigma.
"""

from __future__ import annotations

import numpy as np

from cpbjax import band

COLS = ("high", "low", "close")
COL_INDEX = (1, 2, 3)  # in OHLC


def band_factors(t, fit_splits) -> np.ndarray:
    """[S, H, 2] per series the band's k_high_h, k_low_h: least absolute deviation on the
    series' windows of `fit_splits` (band.fit_vol_band's rule); NaN for a series
    with none."""
    out = []
    for i in range(len(t["names"])):
        m = (t["series"] == i) & np.isin(t["split"], fit_splits) & (t["sigma"] > 0)
        s, y = t["sigma"][m].astype(np.float64), t["y"][m]
        if not m.any():  # no window to fit on (a series listed after the fit span)
            out.append(np.full((t["y"].shape[1], 2), np.nan))
            continue
        k = [
            [band.weighted_median(y[:, h, 1] / s, s) for h in range(y.shape[1])],
            [band.weighted_median(-y[:, h, 2] / s, s) for h in range(y.shape[1])],
        ]
        out.append(np.array(k).T)
    return np.stack(out)


def band_logs(t, k_SH2, rows) -> np.ndarray:
    """The band's forecasts [N, H, 3] (log ratios) of `rows`; close is persistence (0)."""
    s = t["sigma"][rows][:, None]
    k = k_SH2[t["series"][rows]]
    return np.stack([k[..., 0] * s, -k[..., 1] * s, np.zeros_like(s * k[..., 0])], axis=-1)


def persistence_scale(t, split=0) -> np.ndarray:
    """[S, 3] the persistence MAE (log space) of each series and column on `split`: the
    loss's per-column divisor, as train.loss_scale=persistence."""
    out = np.ones((len(t["names"]), 3))
    for i in range(len(t["names"])):
        m = (t["series"] == i) & (t["split"] == split)
        if m.any():
            out[i] = np.abs(t["y"][m][..., COL_INDEX]).mean(axis=(0, 1))
    return out


def skills(t, rows, pred_NH3) -> dict:
    """series name -> column -> skill (1 - MAE / MAE of the better naive), price units."""
    close = t["close"][rows][:, None]
    actual = close[..., None] * np.exp(t["y"][rows][..., COL_INDEX].astype(np.float64))
    last = np.exp(t["x"][rows][:, -1, :].astype(np.float64) * t["sigma"][rows][:, None]) * close
    pred = close[..., None] * np.exp(pred_NH3)
    out = {}
    for i in np.unique(t["series"][rows]):
        m = t["series"][rows] == i
        name, cols = str(t["names"][i]), {}
        for j, c in enumerate(COLS):
            a = actual[m][..., j]
            mae = np.abs(pred[m][..., j] - a).mean()
            naive = min(
                np.abs(close[m] - a).mean(), np.abs(last[m][:, COL_INDEX[j]][:, None] - a).mean()
            )
            cols[c] = 1 - mae / naive
        out[name] = cols
    return out


def summary(by_series: dict, ref: dict | None = None) -> dict:
    """Median skill (%) per column, and with `ref` (the band's) the median of the per-series
    difference in points."""
    out = {}
    for c in COLS:
        v = [s[c] for s in by_series.values()]
        out[c] = round(100 * float(np.median(v)), 2)
        if ref is not None and c != "close":
            d = [by_series[n][c] - ref[n][c] for n in by_series]
            out[f"{c}-band"] = round(100 * float(np.median(d)), 2)
    return out
