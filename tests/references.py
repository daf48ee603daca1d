"""Plain references written out loop by loop, independent of the cpbjax code they check."""

import math

import jax
import numpy as np

from cpbjax import columns
from cpbjax.data import features
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
