"""Plain references written out loop by loop, independent of the cpbjax code they check."""

import math

import jax
import numpy as np

from cpbjax import columns
from cpbjax.data import features
from cpbjax.data.series import INTERVAL_MS
from tests.fake_data import H, L


def reference_early_stopping(
    vals, patience, best=np.inf, min_delta=0.0, gain_se=None, improved_epochs=None
):
    """Plain per-coin early stopping: (best, best_epoch, active, diverged, diverged_epoch).

    `best` is the val loss to beat before epoch 1: the untrained model's with a baseline;
    an epoch improves on it only by more than `min_delta` times that epoch's standard error
    of the gain, `gain_se[epoch - 1]` (0 without it), in float32 as the step computes it.
    The epochs that improved are appended to the list `improved_epochs` if one is given.
    """
    best_epoch, bad, active, diverged, diverged_epoch = 0, 0, True, False, 0
    for epoch, val in enumerate(vals, start=1):
        if not active:
            continue
        if not np.isfinite(val):
            active, diverged, diverged_epoch = False, True, epoch
            continue
        se = np.float32(0.0 if gain_se is None else gain_se[epoch - 1])
        bar = best if np.isinf(best) else np.float32(best) - np.float32(min_delta) * se
        if val < bar:
            best, best_epoch, bad = val, epoch, 0
            if improved_epochs is not None:
                improved_epochs.append(epoch)
        else:
            bad += 1
        active = bad < patience
    return best, best_epoch, active, diverged, diverged_epoch


def anchored_windows(prep, ends, lookback, horizon):
    """numpy x [N, L, F], y [N, H, C] of the windows ending at `ends` (last_close anchors)."""
    x = np.stack(
        [prep.inputs[e - lookback + 1 : e + 1] - prep.anchor[e] * prep.price_mask for e in ends]
    )
    y = np.stack([prep.targets[e + 1 : e + horizon + 1] - prep.anchor[e] for e in ends])
    return x.astype(np.float32), y.astype(np.float32)


def plain_window_losses(module, params, prep, ends, data_cfg, loss, scale_C=None):
    """Each window's loss of one model, by a plain loop independent of cpbjax's evaluation
    and training code: per window ending at `ends`, the model's deterministic forward
    pass on that window alone, then in float64 numpy the mean over steps and columns of
    the squared (loss "mse") or absolute ("mae") error, divided per column by `scale_C`
    [C] when given. Returns float64 [N]."""
    forward = jax.jit(lambda p, x: module.apply({"params": p}, x, None, train=False))
    out = []
    for end in ends:
        x_1LF, y_1HC = anchored_windows(prep, [end], data_cfg.lookback, data_cfg.horizon)
        r_HC = np.asarray(forward(params, x_1LF), np.float64)[0] - y_1HC[0]
        if scale_C is not None:
            r_HC = r_HC / np.asarray(scale_C, np.float64)
        out.append(np.mean(np.square(r_HC) if loss == "mse" else np.abs(r_HC)))
    return np.array(out)


def reference_windows(series, prep, names, ends):
    """Normalised windows of `ends` (last_close), from the raw candles, written out plainly
    (float64)."""
    feats, _ = features.compute(series.ohlcv, names)
    offset = len(series.ohlcv) - len(prep.ohlc)  # kept rows are the newest ones
    assert (series.open_time_ms[offset:] == prep.open_time_ms).all()
    feats, ohlc = feats[offset:], series.ohlcv[offset:, :4]
    n_train = prep.ends["train"][-1] + H + 1
    mu, sd = feats[:n_train].mean(axis=0), feats[:n_train].std(axis=0)
    xs, ys = [], []
    for t in ends:
        x = np.empty((L, len(names)))
        for i, row in enumerate(range(t - L + 1, t + 1)):
            for j, name in enumerate(names):
                value = feats[row, j]
                if name not in columns.PRICE_FEATURES:
                    x[i, j] = (value - mu[j]) / sd[j]
                else:
                    x[i, j] = math.log(value / ohlc[t, 3])
        xs.append(x)
        ys.append(np.log(ohlc[t + 1 : t + H + 1] / ohlc[t, 3]))
    return np.stack(xs), np.stack(ys)


def reference_persistence_scale(prep, horizon):
    """stacking.persistence_scale as first written: the float32 errors of every train window
    and step gathered, cast to float64, their absolute mean per column (float32 [C])."""
    ends_N = prep.ends["train"]
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    err_NHC = prep.targets[idx_NH] - prep.targets[ends_N, 3][:, None, None]
    scale_C = np.abs(err_NHC.astype(np.float64)).mean(axis=(0, 1))
    return np.where(scale_C > 0, scale_C, 1.0).astype(np.float32)


def reference_price_jumps(prices):
    """parsing._price_jumps as first written: every price against the rolling median of
    JUMP_WINDOW centred log closes, computed for every series (bool [N])."""
    import pandas as pd  # noqa: PLC0415 (only this reference reads pandas)

    from cpbjax.data import parsing  # noqa: PLC0415

    with np.errstate(divide="ignore", invalid="ignore"):
        usable = np.isfinite(prices) & (prices > 0)
        log_p = np.log(np.where(usable, prices, np.nan))
    reference = pd.Series(log_p[:, 3]).rolling(parsing.JUMP_WINDOW, center=True, min_periods=1)
    distance = np.abs(log_p - reference.median().to_numpy()[:, None])
    return (distance > np.log(parsing.JUMP_FACTOR)).any(axis=1)


# ---------------------------------------------------------------------------------------
# The scoring fits as they were before they were batched (issue #53): one sort per
# column and level, HAR by np.linalg.lstsq of its whole design. The oracles of
# tests/batched_fits_test.py.


def reference_weighted_quantile(values, weights, level):
    """The first value, in ascending order, whose cumulative weight reaches level of the total."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    if not len(cum) or not cum[-1] > 0:
        raise ValueError("no positive weight")
    return float(values[order][np.searchsorted(cum, level * cum[-1])])


def reference_ewma_range(ohlc, ends, lookback, decay=0.9):
    log_range = np.log(ohlc[:, 1]) - np.log(ohlc[:, 2])
    weights = decay ** np.arange(lookback - 1, -1, -1, dtype=np.float64)
    idx = np.asarray(ends)[:, None] + np.arange(-lookback + 1, 1, dtype=np.int32)
    return log_range[idx] @ weights / weights.sum()


def reference_log_ratios(ohlc, ends, horizon):
    idx = np.asarray(ends)[:, None] + np.arange(1, horizon + 1)[None, :]
    return np.log(ohlc[idx]) - np.log(ohlc[ends, 3])[:, None, None]


def reference_fit_vol_band(ohlc, fit_ends, lookback, horizon):
    """(k_high [H], k_low [H]): a sigma-weighted median of each step's ratios / sigma."""
    sigma = reference_ewma_range(ohlc, fit_ends, lookback)
    ratios = reference_log_ratios(ohlc, fit_ends, horizon)
    ok = sigma > 0
    s = sigma[ok]
    k_high = [reference_weighted_quantile(ratios[ok, j, 1] / s, s, 0.5) for j in range(horizon)]
    k_low = [reference_weighted_quantile(-ratios[ok, j, 2] / s, s, 0.5) for j in range(horizon)]
    return np.array(k_high), np.array(k_low)


def reference_score_quantiles(score_NHC, ok_NHC, sigma_N, levels, weighting):
    """k [H, C, J] of intervals.py: per step, column and level, a sort of the valid scores."""
    _, horizon, cols = score_NHC.shape
    k = np.zeros((horizon, cols, len(levels)))
    for h, c in np.ndindex(horizon, cols):
        ok = ok_NHC[:, h, c]
        if not ok.any():
            continue
        scores = score_NHC[ok, h, c]
        for j, q in enumerate(levels):
            if weighting == "sigma":
                k[h, c, j] = reference_weighted_quantile(scores, sigma_N[ok], q)
            else:
                s, n = np.sort(scores), len(scores)
                rank = math.ceil((n + 1) * q) if q >= 0.5 else math.floor((n + 1) * q)
                k[h, c, j] = s[min(max(rank, 1), n) - 1]
    return k


def reference_fit_shift(ohlc, ends, pred_NHC, lookback, horizon):
    """band_refit's shift [H, 2]: sigma-weighted medians of the log errors / sigma."""
    close = ohlc[ends, 3][:, None, None]
    err = reference_log_ratios(ohlc, ends, horizon) - np.log(pred_NHC / close)
    sigma = reference_ewma_range(ohlc, ends, lookback)
    ok = sigma > 0
    shift = np.zeros((horizon, 2))
    score, s = err[ok] / sigma[ok, None, None], sigma[ok]
    for h in range(horizon):
        shift[h, 0] = reference_weighted_quantile(score[:, h, 1], s, 0.5)
        shift[h, 1] = -reference_weighted_quantile(score[:, h, 2], s, 0.5)
    return shift


def reference_har_design(ohlc, times, interval, ends, horizon):
    """HAR's [N, H, 6 + 24] design: 6 log vols at t (recomputed here), one-hot hour of t+h."""
    o, h, lo, c = np.asarray(ohlc, np.float64).T
    per_candle = {
        "parkinson": features.parkinson_var(h, lo),
        "garman_klass": features.garman_klass_var(o, h, lo, c),
    }
    spans, vols = features.window_candles(interval), []
    for est in features.VOL_ESTIMATORS:
        for span in features.SPANS_MS:
            vols.append(features.log_volatility(per_candle[est], spans[span], 1)[ends])
    vols_NX = np.stack(vols, axis=1)
    steps = np.arange(1, horizon + 1, dtype=np.int64) * INTERVAL_MS[interval]
    target = np.asarray(times, np.int64)[ends][:, None] + steps
    hours = (target % 86_400_000) // 3_600_000
    one_hot = (hours[..., None] == np.arange(24)).astype(np.float64)
    vols_NHX = np.broadcast_to(vols_NX[:, None, :], (len(ends), horizon, 6))
    return np.concatenate([vols_NHX, one_hot], axis=-1)


def reference_fit_har(ohlc, times, interval, fit_ends, scored_ends, horizon):
    """(coef [30], k_high [H], k_low [H], high [N, H], low [N, H]): lstsq of the whole
    design, per-step weighted medians, and the band of the scored windows."""
    z = reference_har_design(ohlc, times, interval, fit_ends, horizon)
    idx = fit_ends[:, None] + np.arange(1, horizon + 1)[None, :]
    log_range = np.log(ohlc[idx, 1] / ohlc[idx, 2])
    ok = log_range > 0
    coef = np.linalg.lstsq(z[ok], np.log(log_range[ok]), rcond=None)[0]
    sigma = np.exp(z @ coef)
    ratios = reference_log_ratios(ohlc, fit_ends, horizon)
    k_high = np.array(
        [
            reference_weighted_quantile(ratios[:, j, 1] / sigma[:, j], sigma[:, j], 0.5)
            for j in range(horizon)
        ]
    )
    k_low = np.array(
        [
            reference_weighted_quantile(-ratios[:, j, 2] / sigma[:, j], sigma[:, j], 0.5)
            for j in range(horizon)
        ]
    )
    sigma_scored = np.exp(reference_har_design(ohlc, times, interval, scored_ends, horizon) @ coef)
    close = ohlc[scored_ends, 3][:, None]
    return (
        coef,
        k_high,
        k_low,
        close * np.exp(k_high * sigma_scored),
        close * np.exp(-k_low * sigma_scored),
    )


def reference_ridge_features(ohlc, ends, lookback):
    """Ridge's [N, X] features from each window's gathered log prices."""
    idx = np.asarray(ends)[:, None] + np.arange(-lookback + 1, 1, dtype=np.int32)
    logp = np.log(ohlc)[idx]
    returns = np.diff(logp[..., 3], axis=1)
    ranges = logp[..., 1] - logp[..., 2]
    shape = logp[:, -1, :3] - logp[:, -1, 3:]
    return np.concatenate([returns, ranges, shape], axis=1)


def threefry2x32(key_2, x1, x2):
    """Threefry2x32-20 (Salmon et al. 2011, Random123) of uint32 counter arrays x1, x2 under
    the uint32 key pair key_2, round by round in numpy: (x1', x2')."""
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as the hash means it to
        return _threefry_rounds(key_2, x1, x2)


def _threefry_rounds(key_2, x1, x2):
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    ks = [np.uint32(key_2[0]), np.uint32(key_2[1])]
    ks.append(ks[0] ^ ks[1] ^ np.uint32(0x1BD11BDA))
    x = [np.asarray(x1, np.uint32) + ks[0], np.asarray(x2, np.uint32) + ks[1]]
    for block in range(5):
        for r in rotations[block % 2]:
            x[0] = x[0] + x[1]
            x[1] = (x[1] << np.uint32(r)) | (x[1] >> np.uint32(32 - r))
            x[1] = x[1] ^ x[0]
        x[0] = x[0] + ks[(block + 1) % 3]
        x[1] = x[1] + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x[0], x[1]


def row_hashes(leaves):
    """checkpoint._row_hashes in numpy, leaf by leaf: per row of each leaf's bits as uint32
    [R, M], sum(bits * (2m + 1)) and sum((bits ^ m * 0x9E3779B9) * 0x85EBCA6B) modulo
    2**32, [R, 2]."""
    out = []
    for leaf in leaves:
        x = np.asarray(leaf)
        x = x[None] if x.ndim == 0 else x
        if x.dtype == np.bool_:
            bits = x.astype(np.uint32)
        else:
            bits = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
            bits = bits.astype(np.uint32)
        bits = bits.reshape(x.shape[0], -1)
        m = np.arange(bits.shape[1], dtype=np.uint32)
        h1 = np.sum(bits * (2 * m + 1), axis=1, dtype=np.uint32)
        h2 = np.sum(
            (bits ^ (m * np.uint32(0x9E3779B9))) * np.uint32(0x85EBCA6B), axis=1, dtype=np.uint32
        )
        out.append(np.stack([h1, h2], axis=1))
    return out
