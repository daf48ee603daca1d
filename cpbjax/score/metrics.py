"""Price-space statistics of forecasts against naive forecasts, with significance (numpy only).

Every number is computed from arrays in price units: the last candle of each window,
the actual next H candles and the predicted next H candles (the contents of a saved
forecasts file), so any metric can be recomputed without jax or a model.

Naive forecasts, on the same windows: persistence (every future OHLC = last close) and
the last candle repeated; each column's skill = 1 - MAE_model / MAE of whichever naive
has the lower MAE on that column and split.

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

import numpy as np
from scipy import special

from cpbjax.columns import CLOSE, COLUMNS

NAIVES = ("persistence", "last_candle")  # Order breaks MAE ties: persistence wins.


def json_float(x):
    """A JSON-ready float; None where the value is undefined (nan, inf)."""
    x = float(x)
    return x if np.isfinite(x) else None


def json_floats(a):
    return [json_float(v) for v in np.asarray(a).ravel()]


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
            "mae": json_float(np.abs(e_NH).mean()),
            "rmse": json_float(np.sqrt((e_NH**2).mean())),
            "mape": json_float(ape_NH.mean()),
            "mae_h": json_floats(np.abs(e_NH).mean(axis=0)),
            "rmse_h": json_floats(np.sqrt((e_NH**2).mean(axis=0))),
            "mape_h": json_floats(ape_NH.mean(axis=0)),
        }
    return out


def next_candles(ohlc_TC, ends_N, horizon) -> np.ndarray:
    """The true next H candles of each window, float64 [N, H, C]."""
    ends_N = np.asarray(ends_N)
    return np.asarray(ohlc_TC, np.float64)[ends_N[:, None] + np.arange(1, horizon + 1)[None, :]]


def naive_forecasts(last_candle_NC, horizon) -> dict:
    """The two naive forecasts, float64 [N, H, 4] each.

    persistence: every future open/high/low/close equals the last close.
    last_candle: the last candle's OHLC repeated H times.
    """
    last = np.asarray(last_candle_NC, np.float64)
    n = len(last)
    return {
        "persistence": np.broadcast_to(last[:, None, CLOSE:], (n, horizon, 4)),
        "last_candle": np.broadcast_to(last[:, None, :], (n, horizon, 4)),
    }


def skill(mae_model, mae_naive):
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
            skill=skill(m["mae"], ref["mae"]),
            skill_h=[skill(a, b) for a, b in zip(m["mae_h"], ref["mae_h"], strict=True)],
        )
    return out


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
    out["statistic"] = json_float(stat)
    # Student's t with n - 1 degrees of freedom: stdtr is its CDF, the very function
    # scipy.stats.t's cdf and sf call, without the 0.4 s import of scipy.stats.
    out["p_value_better"] = float(special.stdtr(n - 1, stat))
    out["p_value_two_sided"] = float(min(1.0, 2.0 * special.stdtr(n - 1, -abs(stat))))
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
        "accuracy": json_float(hit.sum() / total) if total else None,
        "scored": total,
        "up_share": json_float(up.sum() / total) if total else None,
        "accuracy_h": json_floats(acc_h),
        "scored_h": [int(v) for v in n_h],
        "up_share_h": json_floats(up_h),
        "majority_h": json_floats(np.maximum(up_h, 1.0 - up_h)),
        "p_value_h": [t["p_value_better"] for t in tests],
    }


def _direction_test(act_N, pred_N, scored_N, lag) -> dict:
    """HAC test of model hits against the best constant-sign forecaster at one step."""
    act, pred = act_N[scored_N], pred_N[scored_N]
    majority = 1.0 if 2 * (act > 0).sum() >= len(act) else -1.0
    return diebold_mariano((act != pred).astype(float), (act != majority).astype(float), lag)


def close_dm(actual_NHC, pred_NHC, ref_NHC, ref_name) -> dict:
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


def score_prices(last_candle_NC, actual_NHC, pred_NHC) -> dict:
    """Every price-space metric of one split, from the arrays a forecasts file holds.

    Args:
      last_candle_NC: float64 [N, C] OHLC of each window's last input candle.
      actual_NHC, pred_NHC: float64 [N, H, 4] actual and predicted next H candles.

    Returns:
      {"columns": per-column errors, naive errors, best naive and skill,
       "direction": directional accuracy of close, "dm": DM test of close}.
    """
    last = np.asarray(last_candle_NC, np.float64)
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
        "dm": close_dm(actual, pred, naive[best], best),
    }


def window_mae(actual_NHC, pred_NHC) -> np.ndarray:
    """float64 [N, C]: each window's mean absolute error over its H steps, per column; the
    per-window losses a Diebold-Mariano test of two models' forecasts reads (lag H-1)."""
    err = np.asarray(pred_NHC, np.float64) - np.asarray(actual_NHC, np.float64)
    return np.abs(err).mean(axis=1)


def normalized_mse(prep, ends_N, pred_norm_NHC, horizon) -> float:
    """The replaced system's number: MSE against the normalised targets."""
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    y_NHC = prep.targets[idx_NH].astype(np.float64) - prep.anchor[ends_N][:, None, None]
    return float(np.mean((np.asarray(pred_norm_NHC, np.float64) - y_NHC) ** 2))
