"""The pooled gradient-boosted anchor of issue #42: LightGBM on the window table's context and
window summary, predicting each column's residual over the band in units of sigma, with
the L1 objective weighted as the product's loss (sigma / the series' persistence MAE).
Scored on val by default (fit on train rows); --report-test scores test (fit on train+val
rows), and --score confirmation scores only the confirmation pairs' series (issue #42's
table: fit on every pair of a mirror table, frame.py --pairs mirror).

  python experiments/global_model/anchor.py runs/gm/tuning.npz [--rows 200000] [--trees 300]
  python experiments/global_model/anchor.py runs/gm/mirror.npz --report-test --score confirmation
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cpbjax.data import pairs  # noqa: E402
from experiments.global_model import score  # noqa: E402


def window_summary(x_NL4) -> np.ndarray:
    """Hand-made window features, all in sigma units: last candle OHLC, returns over 1, 3,
    10, 29 candles, the mean range of the last 1, 3, 10 candles."""
    c = x_NL4[..., 3]
    rng = x_NL4[..., 1] - x_NL4[..., 2]
    cols = [x_NL4[:, -1, 0], x_NL4[:, -1, 1], x_NL4[:, -1, 2]]
    cols += [-c[:, -1 - k] for k in (1, 3, 10, 29)]
    cols += [rng[:, -k:].mean(axis=1) for k in (1, 3, 10)]
    return np.stack(cols, axis=1)


def design(t, rows) -> np.ndarray:
    return np.concatenate(
        [t["ctx"][rows], window_summary(t["x"][rows]), np.log(t["sigma"][rows] + 1e-9)[:, None]],
        axis=1,
    )


def fit_predict(t, fit_rows, pred_rows, k_SH2, scale_S3, args) -> np.ndarray:
    """[N, H, 3] forecasts (log ratios) of pred_rows: the band plus each column's model."""
    import lightgbm as lgb

    H = t["y"].shape[1]
    rng = np.random.default_rng(0)
    sub = rng.choice(fit_rows, size=min(args.rows, len(fit_rows)), replace=False)
    band_fit = score.band_logs(t, k_SH2, sub)
    X_fit, X_pred = design(t, sub), design(t, pred_rows)
    sig = t["sigma"][sub].astype(np.float64)
    pred = score.band_logs(t, k_SH2, pred_rows)
    hs = np.arange(H)
    for j, c in enumerate(score.COLS):
        resid = (t["y"][sub][..., score.COL_INDEX[j]] - band_fit[..., j]) / sig[:, None]  # [n, H]
        w = sig / scale_S3[t["series"][sub], j]
        Xs = np.concatenate([np.repeat(X_fit, H, 0), np.tile(hs, len(sub))[:, None]], 1)
        params = dict(
            objective="l1", learning_rate=0.05, num_leaves=63, min_data_in_leaf=200,
            bagging_fraction=0.8, bagging_freq=1, feature_fraction=0.8, verbose=-1, num_threads=2,
        )  # fmt: skip
        data = lgb.Dataset(Xs, resid.ravel(), weight=np.repeat(w, H))
        model = lgb.train(params, data, num_boost_round=args.trees)
        Xp = np.concatenate([np.repeat(X_pred, H, 0), np.tile(hs, len(pred_rows))[:, None]], 1)
        r = model.predict(Xp).reshape(len(pred_rows), H)
        pred[..., j] += r * t["sigma"][pred_rows][:, None]
        print(f"  {c}: fitted {len(sub)} windows x {H}", flush=True)
    return pred


def main():
    p = argparse.ArgumentParser()
    p.add_argument("table")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--trees", type=int, default=300)
    p.add_argument("--report-test", action="store_true")
    p.add_argument("--score", choices=("all", "confirmation"), default="all")
    args = p.parse_args()
    t = dict(np.load(args.table))
    scored = 2 if args.report_test else 1
    fit_splits = (0, 1) if args.report_test else (0,)
    t0 = time.perf_counter()
    k = score.band_factors(t, fit_splits)
    scale = score.persistence_scale(t)
    fit_rows = np.flatnonzero(np.isin(t["split"], fit_splits))
    rows = np.flatnonzero(t["split"] == scored)
    rows = rows[np.isfinite(k[t["series"][rows]]).all(axis=(1, 2))]  # a series with a band
    if args.score == "confirmation":
        symbols = np.array([str(n).split("-")[0] for n in t["names"]])
        rows = rows[np.isin(symbols[t["series"][rows]], pairs.CONFIRMATION_SYMBOLS)]
    band = score.skills(t, rows, score.band_logs(t, k, rows))
    model = score.skills(t, rows, fit_predict(t, fit_rows, rows, k, scale, args))
    out = {
        "split": "test" if args.report_test else "val",
        "series": len(model),
        "band": score.summary(band),
        "lightgbm": score.summary(model, band),
        "seconds": round(time.perf_counter() - t0),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
