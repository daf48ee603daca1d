"""How much can the synthetic source's announcements move the scores cpbjax reports?

Oracles that know how the covariates were made (cpbjax/data/synthetic.py), reading only
rows a window holds: `vol` is the volatility band (cpbjax/band.py) with each step's sigma
scaled by exp(b_h * d), where d is vol_signal at the window's end (the coming candles'
volatility) less vol_signal ANNOUNCED rows earlier (the window's newest candles');
`vol+flow` also shifts it by c_h * h * flow * sigma (the announced drift over h steps).
b_h and c_h (on a grid, one after the other) and k_h (least absolute deviation) are
fitted per column and step on the fit windows; then the horizon-averaged MAE of high and
low on the scored windows is compared with the better naive forecast (persistence or the
last candle), as results.json does.

The generator's constants can be overridden (e.g. --drift-sd 0 for a source without
drift, --announced 1 for an announcement of the next candle only); the defaults are the
module's own.

Shapes: T candles, N windows, H steps, G grid points.
"""

from __future__ import annotations

import argparse

import numpy as np

from cpbjax import band
from cpbjax.columns import CLOSE, HIGH, LOW
from cpbjax.config import schema
from cpbjax.data import synthetic
from cpbjax.data.series import INTERVAL_MS

LOOKBACK, HORIZON = 30, 10
GRID_G = np.linspace(0.0, 1.5, 16)  # candidate b_h and c_h


def fit_step(y_N, sigma_N, d_N, shift_N):
    """(b, c, k): the grid b, then the grid c, and the LAD k minimising the train error of
    y ~ k * sigma * exp(b * d) + c * shift (one column, one step)."""
    best = (np.inf, 0.0, 0.0, 0.0)
    for b in GRID_G:
        for c in GRID_G if shift_N is not None else [0.0]:
            s_N = sigma_N * np.exp(b * d_N)
            rest_N = y_N - (0.0 if shift_N is None else c * shift_N)
            k = band.weighted_median(rest_N / s_N, s_N)
            err = np.abs(rest_N - k * s_N).sum()
            best = min(best, (err, b, c, k))
    return best[1:]


def forecasts(ohlc, vol_T, flow_T, fit_N, test_N):
    """{name: (high [N, H], low [N, H])} of the test windows, fitted on fit_N."""
    ends = {"fit": fit_N, "test": test_N}
    sigma = {k: band.ewma_range(ohlc, e, LOOKBACK) for k, e in ends.items()}
    d = {k: vol_T[e] - vol_T[e - synthetic.ANNOUNCED] for k, e in ends.items()}
    ratios_NHC = band.future_log_ratios(ohlc, fit_N, HORIZON)
    close_N = ohlc[test_N, CLOSE]
    out = {}
    for name, use_d, use_flow in (("band", 0, 0), ("vol", 1, 0), ("vol+flow", 1, 1)):
        cols = []
        for col, sign in ((HIGH, 1), (LOW, -1)):
            pred_NH = np.zeros((len(test_N), HORIZON))
            for h in range(HORIZON):
                shift = {k: sign * (h + 1) * flow_T[e] * sigma[k] for k, e in ends.items()}
                b, c, k = fit_step(
                    sign * ratios_NHC[:, h, col],
                    sigma["fit"],
                    use_d * d["fit"],
                    shift["fit"] if use_flow else None,
                )
                move = k * sigma["test"] * np.exp(b * use_d * d["test"]) + c * shift["test"]
                pred_NH[:, h] = close_N * np.exp(sign * move)
            cols.append(pred_NH)
        out[name] = cols
    return out


def series_scores(series, train_frac):
    """{name_column: horizon-averaged skill % against the better naive forecast}.

    train_frac: fit on the windows of that fraction of the candles, score the rest; 0:
    the small variants' calendar split (fit before the last 20 days, score the last 10).
    """
    ohlc = series.ohlcv[:, :4]
    vol_T, flow_T = (
        series.covariates[:, series.covariate_names.index(c)] for c in ("vol_signal", "flow")
    )
    n = len(ohlc)
    ends = np.arange(LOOKBACK, n - HORIZON)
    day = 86_400_000 // INTERVAL_MS[series.interval]
    cut_fit, cut_test = (int(train_frac * n),) * 2 if train_frac else (n - 20 * day, n - 10 * day)
    fit_N, test_N = ends[ends + HORIZON < cut_fit], ends[ends >= cut_test]
    actual_NHC = ohlc[test_N[:, None] + np.arange(1, HORIZON + 1)]
    out = {}
    for name, preds in forecasts(ohlc, vol_T, flow_T, fit_N, test_N).items():
        for pred_NH, col, label in zip(preds, (HIGH, LOW), ("high", "low"), strict=True):
            mae = np.abs(pred_NH - actual_NHC[..., col]).mean()
            naive = min(
                np.abs(ohlc[test_N, CLOSE][:, None] - actual_NHC[..., col]).mean(),
                np.abs(ohlc[test_N, col][:, None] - actual_NHC[..., col]).mean(),
            )
            out[f"{name}_{label}"] = 100 * (1 - mae / naive)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--announced", type=int, default=synthetic.ANNOUNCED)
    p.add_argument("--phi", type=float, default=synthetic.PHI)
    p.add_argument("--sd", type=float, default=synthetic.SD)
    p.add_argument("--drift-sd", type=float, default=synthetic.DRIFT_SD)
    p.add_argument("--candles", type=int, default=6000)
    p.add_argument("--symbols", type=int, default=8)
    p.add_argument("--train-frac", type=float, default=0.7)
    a = p.parse_args()
    synthetic.ANNOUNCED, synthetic.PHI, synthetic.SD = a.announced, a.phi, a.sd
    synthetic.DRIFT_SD = a.drift_sd
    rows = [
        series_scores(synthetic.generate(s, i, a.candles, covariates=True), a.train_frac)
        for s in schema.DEFAULT_SYMBOLS[: a.symbols]
        for i in schema.DEFAULT_INTERVALS
    ]
    print(
        f"announced={a.announced} phi={a.phi} sd={a.sd} drift_sd={a.drift_sd} "
        f"train_frac={a.train_frac} series={len(rows)}"
    )
    for col in ("high", "low"):
        band_S = np.array([r[f"band_{col}"] for r in rows])
        print(f"  {col}: band skill median {np.median(band_S):+.2f}")
        for name in ("vol", "vol+flow"):
            gain_S = np.array([r[f"{name}_{col}"] for r in rows]) - band_S
            print(
                f"    {name} - band: median {np.median(gain_S):+.2f} points, "
                f"ahead on {(gain_S > 0).sum()}/{len(gain_S)}"
            )


if __name__ == "__main__":
    main()
