"""Price-space metrics of forecasts against naive and fitted baselines, with significance.

Every number is computed from four arrays per split (the contents of a saved
forecasts file): the last candle of each window, the actual next H candles and
the predicted next H candles, all in price units. The test split is scored
here and nowhere else.

Baselines, on the same windows:
  - naive: persistence (every future OHLC = last close) and the last candle
    repeated; each column's skill = 1 - MAE_model / MAE of whichever naive has the
    lower MAE on that column and split.
  - fitted, on the windows of the splits before the scored one only (train+val
    for test, train for val): a ridge regression (fixed alpha) from the window's
    close log returns and log(high/low) ranges to the H x 4 future log ratios,
    and a band high/low = last close * exp(+-k_h * EWMA of log(high/low)).

Significance, chosen to survive overlapping windows (stride 1, horizon H):
  - Diebold-Mariano for close: the loss differential d_t = mean_h |e_model| -
    mean_h |e_naive| per window; its variance is Newey-West (Bartlett weights)
    with lag H-1, because windows H apart share no target candle; the statistic
    gets the Harvey-Leybourne-Newbold small-sample factor and is compared with a
    Student t with n-1 degrees of freedom. Per step h the same test runs with lag h-1.
  - Directional accuracy, per step h: the same HAC test on 0/1 losses, model hits
    against the best constant-sign forecaster of that split (whose accuracy is
    max(0.5, majority-class rate)). A pooled binomial test over overlapping windows
    would call noise significant; this one does not assume independence.
"""

from __future__ import annotations

import datetime
import functools
import io

import jax
import numpy as np
from scipy import stats

from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.data import windows

COLUMNS = ("open", "high", "low", "close")
NAIVES = ("persistence", "last_candle")  # Order breaks MAE ties: persistence wins.
RIDGE_ALPHA = 10.0  # Fixed ridge penalty on standardised features; never tuned on test.
EWMA_DECAY = 0.9  # Weight ratio between consecutive candles of the window's range EWMA.
CLOSE = 3


# ---------------------------------------------------------------------------
# Forecasting.


@functools.partial(jax.jit, static_argnames=("module", "lookback", "horizon"))
def _forecast_batch(
    module, params, inputs_TF, targets_TC, anchor_T, mask_F, ends_B, lookback, horizon
):
    x_BLF, _ = windows.gather(inputs_TF, targets_TC, anchor_T, mask_F, ends_B, lookback, horizon)
    return module.apply({"params": params}, x_BLF, None, train=False)


def predict_windows(module, params, prep, ends_N, lookback, horizon, batch_size=1024):
    """Deterministic normalised forecasts of the windows ending at `ends_N`.

    Batches are padded to a power of two (capped at batch_size), so series of
    similar length share one compiled program.

    Args:
      module, params: the model, applied with train=False.
      prep: windows.PreparedSeries. ends_N: int [N] window end indices.
      lookback, horizon: L and H. batch_size: the largest batch per call.

    Returns:
      float32 [N, H, 4] normalised forecasts.
    """
    ends_N = np.asarray(ends_N, np.int32)
    n = len(ends_N)
    if n == 0:
        return np.zeros((0, horizon, windows.NUM_TARGETS), np.float32)
    b = min(batch_size, 1 << max(n - 1, 0).bit_length())
    padded = np.concatenate([ends_N, np.full(-n % b, ends_N[-1], np.int32)])
    arrays = [jax.device_put(a) for a in (prep.inputs, prep.targets, prep.anchor, prep.price_mask)]
    outs = [
        np.asarray(_forecast_batch(module, params, *arrays, padded[i : i + b], lookback, horizon))
        for i in range(0, len(padded), b)
    ]
    return np.concatenate(outs)[:n].astype(np.float32)


def forecast(module, params, prep, split, lookback, horizon, batch_size=1024):
    """Forecasts every window of one split of one series.

    Args:
      module: the Linen module; params: its params.
      prep: windows.PreparedSeries. split: "train" | "val" | "test".
      lookback, horizon: L and H the module was built for.
      batch_size: windows per compiled call.

    Returns:
      (ends_N int64, pred_prices_NHC float64 or None for candle_minmax,
       pred_norm_NHC float32).
    """
    ends_N = np.asarray(prep.ends[split], np.int64)
    pred_norm = predict_windows(module, params, prep, ends_N, lookback, horizon, batch_size)
    if prep.norm["kind"] == "candle_minmax":
        return ends_N, None, pred_norm
    return ends_N, windows.to_prices(prep, ends_N, pred_norm), pred_norm


def normalized_mse(prep, ends_N, pred_norm_NHC, horizon) -> float:
    """The replaced system's number: MSE against the normalised targets."""
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    y_NHC = prep.targets[idx_NH].astype(np.float64) - prep.anchor[ends_N][:, None, None]
    return float(np.mean((np.asarray(pred_norm_NHC, np.float64) - y_NHC) ** 2))


# ---------------------------------------------------------------------------
# Errors and naive baselines.


def _num(x):
    """A JSON-ready float; None where the value is undefined (nan, inf)."""
    x = float(x)
    return x if np.isfinite(x) else None


def _nums(a):
    return [_num(v) for v in np.asarray(a).ravel()]


def errors(actual_NHC, pred_NHC, columns=COLUMNS) -> dict:
    """MAE, RMSE and MAPE (%) per column, per step h and over all steps.

    The overall RMSE is pooled (root of the mean squared error over all windows
    and steps); MAE and MAPE are plain means, equal to the mean of their per-step values.
    """
    err = np.asarray(pred_NHC, np.float64) - np.asarray(actual_NHC, np.float64)
    ape = 100.0 * np.abs(err) / np.abs(actual_NHC)
    out = {}
    for j, name in enumerate(columns):
        e_NH, ape_NH = err[..., j], ape[..., j]
        out[name] = {
            "mae": _num(np.abs(e_NH).mean()),
            "rmse": _num(np.sqrt((e_NH**2).mean())),
            "mape": _num(ape_NH.mean()),
            "mae_h": _nums(np.abs(e_NH).mean(axis=0)),
            "rmse_h": _nums(np.sqrt((e_NH**2).mean(axis=0))),
            "mape_h": _nums(ape_NH.mean(axis=0)),
        }
    return out


def naive_forecasts(last_candle_N4, horizon) -> dict:
    """The two naive forecasts, float64 [N, H, 4] each.

    persistence: every future open/high/low/close equals the last close.
    last_candle: the last candle's OHLC repeated H times.
    """
    last = np.asarray(last_candle_N4, np.float64)
    n = len(last)
    return {
        "persistence": np.broadcast_to(last[:, None, CLOSE:], (n, horizon, 4)),
        "last_candle": np.broadcast_to(last[:, None, :], (n, horizon, 4)),
    }


def _skill(mae_model, mae_naive):
    if mae_model is None or not mae_naive:
        return None
    return 1.0 - mae_model / mae_naive


def _with_skill(model: dict, naive_errs: dict) -> dict:
    """Adds per column the best naive (lower MAE), its MAE, and skill against it."""
    out = {}
    for col, m in model.items():
        best = min(NAIVES, key=lambda k: naive_errs[k][col]["mae"])
        ref = naive_errs[best][col]
        out[col] = dict(
            m,
            best_naive=best,
            naive_mae=ref["mae"],
            skill=_skill(m["mae"], ref["mae"]),
            skill_h=[_skill(a, b) for a, b in zip(m["mae_h"], ref["mae_h"], strict=True)],
        )
    return out


# ---------------------------------------------------------------------------
# Significance.


def hac_variance(d_N, lag) -> float:
    """Newey-West long-run variance of d (Bartlett weights 1 - k/(lag+1))."""
    dc = np.asarray(d_N, np.float64) - np.mean(d_N)
    n = len(dc)
    var = dc @ dc / n
    for k in range(1, min(lag, n - 1) + 1):
        var += 2.0 * (1.0 - k / (lag + 1)) * (dc[k:] @ dc[:-k]) / n
    return float(var)


def diebold_mariano(loss_model_N, loss_ref_N, lag) -> dict:
    """Diebold-Mariano test of equal expected loss, with the HLN correction.

    Args:
      loss_model_N, loss_ref_N: per-window losses, in time order.
      lag: HAC lag; h-1 for an h-step forecast (h = lag + 1 in the HLN factor).

    Returns:
      {"statistic", "p_value_better" (one-sided: model loss lower),
       "p_value_two_sided", "n", "lag"}; p-values None below 3 windows.
    """
    d = np.asarray(loss_model_N, np.float64) - np.asarray(loss_ref_N, np.float64)
    n, h = len(d), lag + 1
    out = {
        "statistic": None,
        "p_value_better": None,
        "p_value_two_sided": None,
        "n": int(n),
        "lag": int(lag),
    }
    hln = (n + 1 - 2 * h + h * (h - 1) / n) / n if n else 0.0
    if n < 3 or hln <= 0:
        return out
    var = hac_variance(d, lag)
    mean = float(d.mean())
    if var <= 0:  # No variation: the difference is exactly 0 or a constant.
        stat = 0.0 if mean == 0 else float(np.copysign(np.inf, mean))
    else:
        stat = mean / np.sqrt(var / n) * np.sqrt(hln)
    out["statistic"] = _num(stat)
    out["p_value_better"] = float(stats.t.cdf(stat, n - 1))
    out["p_value_two_sided"] = float(min(1.0, 2.0 * stats.t.sf(abs(stat), n - 1)))
    return out


def direction(last_close_N, actual_close_NH, pred_close_NH) -> dict:
    """Directional accuracy of close against the actual move from the last close.

    A window is scored at step h when neither the actual nor the predicted move
    is exactly zero (ties excluded). up_share is the share of up-moves among the
    scored windows, so an always-"up" forecaster scores exactly up_share.
    """
    act = np.sign(actual_close_NH - last_close_N[:, None])
    pred = np.sign(pred_close_NH - last_close_N[:, None])
    scored = (act != 0) & (pred != 0)
    hit = scored & (act == pred)
    up = scored & (act > 0)
    n_h = scored.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        up_h = up.sum(axis=0) / n_h
        acc_h = hit.sum(axis=0) / n_h
    tests = [_direction_test(act[:, j], pred[:, j], scored[:, j], j) for j in range(act.shape[1])]
    total = int(scored.sum())
    return {
        "accuracy": _num(hit.sum() / total) if total else None,
        "scored": total,
        "up_share": _num(up.sum() / total) if total else None,
        "accuracy_h": _nums(acc_h),
        "scored_h": [int(v) for v in n_h],
        "up_share_h": _nums(up_h),
        "majority_h": _nums(np.maximum(up_h, 1.0 - up_h)),
        "p_value_h": [t["p_value_better"] for t in tests],
    }


def _direction_test(act_N, pred_N, scored_N, lag) -> dict:
    """HAC test of model hits against the best constant-sign forecaster at one step."""
    act, pred = act_N[scored_N], pred_N[scored_N]
    majority = 1.0 if 2 * (act > 0).sum() >= len(act) else -1.0
    return diebold_mariano((act != pred).astype(float), (act != majority).astype(float), lag)


def _close_dm(actual_NHC, pred_NHC, ref_NHC, ref_name) -> dict:
    """DM test of close absolute errors, over window-mean errors (lag H-1) and per step."""
    ae_NH = np.abs(pred_NHC[..., CLOSE] - actual_NHC[..., CLOSE])
    ref_NH = np.abs(ref_NHC[..., CLOSE] - actual_NHC[..., CLOSE])
    horizon = ae_NH.shape[1]
    out = diebold_mariano(ae_NH.mean(axis=1), ref_NH.mean(axis=1), horizon - 1)
    out["baseline"] = ref_name
    out["p_value_better_h"] = [
        diebold_mariano(ae_NH[:, j], ref_NH[:, j], j)["p_value_better"] for j in range(horizon)
    ]
    return out


def score_prices(last_candle_N4, actual_NHC, pred_NHC) -> dict:
    """Every price-space metric of one split, from the arrays a forecasts file holds.

    Args:
      last_candle_N4: float64 [N, 4] OHLC of each window's last input candle.
      actual_NHC, pred_NHC: float64 [N, H, 4] actual and predicted next H candles.

    Returns:
      {"columns": per-column errors, naive errors, best naive and skill,
       "direction": directional accuracy of close, "dm": DM test of close}.
    """
    last = np.asarray(last_candle_N4, np.float64)
    actual = np.asarray(actual_NHC, np.float64)
    pred = np.asarray(pred_NHC, np.float64)
    naive = naive_forecasts(last, actual.shape[1])
    naive_errs = {k: errors(actual, f) for k, f in naive.items()}
    cols = _with_skill(errors(actual, pred), naive_errs)
    for col in COLUMNS:
        cols[col]["naive"] = {k: naive_errs[k][col] for k in NAIVES}
    best = cols["close"]["best_naive"]
    return {
        "columns": cols,
        "direction": direction(last[:, CLOSE], actual[..., CLOSE], pred[..., CLOSE]),
        "dm": _close_dm(actual, pred, naive[best], best),
    }


# ---------------------------------------------------------------------------
# Fitted baselines: ridge on log returns and ranges, volatility-scaled band.


def _window_log_prices(ohlc_T4, ends_N, lookback):
    idx_NL = ends_N[:, None] + np.arange(-lookback + 1, 1)[None, :]
    return np.log(ohlc_T4[idx_NL])  # [N, L, 4]


def future_log_ratios(ohlc_T4, ends_N, horizon):
    """log(OHLC[t+h] / close[t]) of each window, float64 [N, H, 4]."""
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    return np.log(ohlc_T4[idx_NH]) - np.log(ohlc_T4[ends_N, CLOSE])[:, None, None]


def ridge_features(ohlc_T4, ends_N, lookback):
    """Close log returns, log(high/low) ranges and the last candle's shape, [N, P]."""
    logp_NL4 = _window_log_prices(ohlc_T4, ends_N, lookback)
    returns = np.diff(logp_NL4[..., CLOSE], axis=1)  # [N, L-1]
    ranges = logp_NL4[..., 1] - logp_NL4[..., 2]  # [N, L]
    shape = logp_NL4[:, -1, :3] - logp_NL4[:, -1, CLOSE:]  # [N, 3] open/high/low vs close
    return np.concatenate([returns, ranges, shape], axis=1)


def fit_ridge(ohlc_T4, fit_ends_N, lookback, horizon, alpha=RIDGE_ALPHA) -> dict:
    """Closed-form ridge from standardised features to the H x 4 future log ratios.

    The intercept is not penalised (features and targets are centred first).
    """
    x_NP = ridge_features(ohlc_T4, fit_ends_N, lookback)
    y_NK = future_log_ratios(ohlc_T4, fit_ends_N, horizon).reshape(len(fit_ends_N), -1)
    x_mean, x_scale = x_NP.mean(axis=0), x_NP.std(axis=0)
    x_scale = np.where(x_scale > 0, x_scale, 1.0)
    z_NP = (x_NP - x_mean) / x_scale
    y_mean = y_NK.mean(axis=0)
    gram = z_NP.T @ z_NP + alpha * np.eye(z_NP.shape[1])
    coef = np.linalg.solve(gram, z_NP.T @ (y_NK - y_mean))
    return {"x_mean": x_mean, "x_scale": x_scale, "y_mean": y_mean, "coef": coef}


def ridge_predict(fit, ohlc_T4, ends_N, lookback, horizon):
    """Ridge forecasts in prices, float64 [N, H, 4]."""
    z_NP = (ridge_features(ohlc_T4, ends_N, lookback) - fit["x_mean"]) / fit["x_scale"]
    log_ratio = (z_NP @ fit["coef"] + fit["y_mean"]).reshape(len(ends_N), horizon, 4)
    return ohlc_T4[ends_N, CLOSE][:, None, None] * np.exp(log_ratio)


def ewma_range(ohlc_T4, ends_N, lookback, decay=EWMA_DECAY):
    """EWMA of log(high/low) over each window's own L candles (newest weighs most), [N]."""
    logp_NL4 = _window_log_prices(ohlc_T4, ends_N, lookback)
    weights_L = decay ** np.arange(lookback - 1, -1, -1, dtype=np.float64)
    return (logp_NL4[..., 1] - logp_NL4[..., 2]) @ weights_L / weights_L.sum()


def weighted_median(values, weights) -> float:
    """The minimiser of sum(weights * |values - k|) over k."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, 0.5 * cum[-1])])


def fit_vol_band(ohlc_T4, fit_ends_N, lookback, horizon, decay=EWMA_DECAY) -> dict:
    """k_h of high = close * exp(k_h * sigma), low = close * exp(-k_h * sigma).

    Each k_h is the least-absolute-deviation fit in log space, i.e. minimises
    sum_t |log(high[t+h] / close[t]) - k_h * sigma_t|: a weighted median of the
    ratios with weights sigma_t. Windows with sigma = 0 carry no information.
    """
    sigma_N = ewma_range(ohlc_T4, fit_ends_N, lookback, decay)
    ratios_NH4 = future_log_ratios(ohlc_T4, fit_ends_N, horizon)
    ok = sigma_N > 0
    s = sigma_N[ok]
    k_high = [weighted_median(ratios_NH4[ok, j, 1] / s, s) for j in range(horizon)]
    k_low = [weighted_median(-ratios_NH4[ok, j, 2] / s, s) for j in range(horizon)]
    return {"k_high_h": np.array(k_high), "k_low_h": np.array(k_low), "decay": decay}


def vol_band_predict(fit, ohlc_T4, ends_N, lookback):
    """Band forecasts in prices: (high [N, H], low [N, H])."""
    sigma_N1 = ewma_range(ohlc_T4, ends_N, lookback, fit["decay"])[:, None]
    close_N1 = ohlc_T4[ends_N, CLOSE][:, None]
    return close_N1 * np.exp(fit["k_high_h"] * sigma_N1), close_N1 * np.exp(
        -fit["k_low_h"] * sigma_N1
    )


def fit_ends(prep, split):
    """Windows a baseline may be fitted on when scoring `split`: the splits before it.

    Test is scored with a fit on train+val; val with a fit on train alone, so that
    no score is in-sample.
    """
    before = {"train": (), "val": ("train",), "test": ("train", "val")}[split]
    if not before:
        raise ValueError("fitted baselines are scored on 'val' or 'test', not 'train'")
    return np.concatenate([prep.ends[s] for s in before]).astype(np.int64)


def _against_naive(errs: dict, model_cols: dict) -> dict:
    """Adds skill against the column's best naive (the one the model is judged by)."""
    out = {}
    for col, e in errs.items():
        ref = model_cols[col]["naive"][model_cols[col]["best_naive"]]
        out[col] = dict(
            e,
            skill=_skill(e["mae"], ref["mae"]),
            skill_h=[_skill(a, b) for a, b in zip(e["mae_h"], ref["mae_h"], strict=True)],
        )
    return out


def fitted_baselines(prep, split, ends_N, lookback, horizon, model_cols) -> dict:
    """Ridge and volatility-band scores on `split`, fitted on the splits before it."""
    fit_on = fit_ends(prep, split)
    ohlc, actual = prep.ohlc, windows.actual_prices(prep, ends_N, horizon)
    ridge = fit_ridge(ohlc, fit_on, lookback, horizon)
    ridge_pred = ridge_predict(ridge, ohlc, ends_N, lookback, horizon)
    best = model_cols["close"]["best_naive"]
    ref = naive_forecasts(ohlc[ends_N], horizon)[best]
    band = fit_vol_band(ohlc, fit_on, lookback, horizon)
    high, low = vol_band_predict(band, ohlc, ends_N, lookback)
    band_pred = np.stack([high, low], axis=-1)  # [N, H, 2]
    return {
        "ridge": {
            "alpha": RIDGE_ALPHA,
            "fit_windows": int(len(fit_on)),
            "columns": _against_naive(errors(actual, ridge_pred), model_cols),
            "dm": _close_dm(actual, ridge_pred, ref, best),
        },
        "vol_band": {
            "ewma_decay": EWMA_DECAY,
            "fit_windows": int(len(fit_on)),
            "k_high_h": _nums(band["k_high_h"]),
            "k_low_h": _nums(band["k_low_h"]),
            "columns": _against_naive(
                errors(actual[..., 1:3], band_pred, ("high", "low")), model_cols
            ),
        },
    }


# ---------------------------------------------------------------------------
# One series, one split.


def iso_utc(ms) -> str:
    """Epoch milliseconds as an ISO 8601 UTC string, e.g. 2024-01-01T00:00:00Z."""
    t = datetime.datetime.fromtimestamp(int(ms) / 1000, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def evaluate_series(module, params, prep, config, split, forecasts=None) -> dict:
    """All metrics of one series on one split: the results.json series[name][split].

    Args:
      module, params: the trained model (evaluated with train=False).
      prep: windows.PreparedSeries. config: the run config (data.lookback/horizon).
      split: "val" or "test".
      forecasts: optional result of `forecast(...)` for this split, to avoid
        forecasting twice when the caller also saves or plots them.

    Returns:
      The JSON-ready metrics dict (schema: README, "results.json"): windows,
      normalized_mse, and with a price-preserving normalisation also columns,
      direction, dm, ridge and vol_band.
    """
    lookback, horizon = config.data.lookback, config.data.horizon
    if forecasts is None:
        forecasts = forecast(module, params, prep, split, lookback, horizon)
    ends, pred_prices, pred_norm = forecasts
    out = {
        "windows": int(len(ends)),
        "horizon": int(horizon),
        "first_window_end": iso_utc(prep.open_time_ms[ends[0]]),
        "last_window_end": iso_utc(prep.open_time_ms[ends[-1]]),
        "normalized_mse": normalized_mse(prep, ends, pred_norm, horizon),
        "price_space": pred_prices is not None,
    }
    if pred_prices is None:  # candle_minmax keeps no price level: nothing to score.
        return out
    actual = windows.actual_prices(prep, ends, horizon)
    out.update(score_prices(prep.ohlc[ends], actual, pred_prices))
    out.update(fitted_baselines(prep, split, ends, lookback, horizon, out["columns"]))
    return out


# ---------------------------------------------------------------------------
# Saved forecasts.


def forecast_record(prep, ends_N, pred_prices_NHC, horizon) -> dict:
    """The arrays of a forecasts file (see save_forecasts)."""
    if pred_prices_NHC is None:
        raise ValueError(
            f"{prep.name}: no price forecasts to save: data.normalization="
            f"{prep.norm['kind']!r} keeps no price level"
        )
    ends_N = np.asarray(ends_N, np.int64)
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    return {
        "series": np.array(prep.name),
        "symbol": np.array(prep.symbol),
        "interval": np.array(prep.interval),
        "columns": np.array(COLUMNS),
        "last_open_time_ms": prep.open_time_ms[ends_N].astype(np.int64),
        "last_candle": prep.ohlc[ends_N].astype(np.float64),
        "target_open_time_ms": prep.open_time_ms[idx_NH].astype(np.int64),
        "actual": prep.ohlc[idx_NH].astype(np.float64),
        "predicted": np.asarray(pred_prices_NHC, np.float64),
    }


def save_forecasts(workdir, prep, ends_N, pred_prices_NHC, horizon) -> str:
    """Writes <workdir>/forecasts/<SYMBOL>-<INTERVAL>.npz atomically; returns its path.

    Keys: series, symbol, interval, columns (open, high, low, close),
    last_open_time_ms [N], last_candle [N, 4], target_open_time_ms [N, H],
    actual [N, H, 4], predicted [N, H, 4] (prices). `score_prices(last_candle,
    actual, predicted)` recomputes every price-space metric from them.
    """
    record = forecast_record(prep, ends_N, pred_prices_NHC, horizon)
    path = workdir_lib.forecasts_file(workdir, prep.name)
    buf = io.BytesIO()
    np.savez(buf, **record)
    writers.atomic_write(path, buf.getvalue())
    return path


def load_forecasts(path) -> dict:
    """Reads a forecasts file into a dict of arrays."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}
