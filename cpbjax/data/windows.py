"""Leak-free windows: split, purge, normalise on the host; gather on the device.

A window ending at candle t has inputs t-L+1..t and targets t+1..t+H (OHLC).
Windows are never materialised: a series is stored once as [T, F] inputs and
[T, C] targets, and `gather` slices a batch of windows from them inside the
jitted step, so host and device memory stay O(K·T·F).

Normalisation is arranged so that the device only ever subtracts an anchor:
  x[t-L+1..t] = inputs[...] - anchor[t] * price_mask      (price columns only)
  y[t+1..t+H] = targets[...] - anchor[t]
  - last_close: inputs/targets of price columns hold log(p / p0) and
    anchor[t] = log(close[t] / p0), so windows are log ratios to the window's own
    last close. Nothing is fitted, and predictions map back exactly.
  - zscore: each column is standardised with mean/std of the TRAIN candles only;
    anchor = 0.
  - candle_minmax: the replaced system's per-candle (x - low) / (high - low);
    anchor = 0. Lossy: the price level is gone, so no price-space metric exists.
Non-price features (volume, RSI, ...) are z-scored with train-split statistics in
every mode.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from cpbjax.data import features as features_lib
from cpbjax.data.series import Series, SeriesSkipped

SPLITS = ("train", "val", "test")
NUM_TARGETS = 4  # OHLC.


@dataclasses.dataclass
class PreparedSeries:
    """One series ready for training, on the host.

    Attributes:
      name, symbol, interval: identity ("BTCUSDT-1h").
      open_time_ms: int64 [T] open times of the kept candles.
      ohlc: float64 [T, 4] raw prices, used to map forecasts back and to score.
      inputs: float32 [T, F] normalised features (see module docstring).
      targets: float32 [T, 4] normalised OHLC targets.
      anchor: float32 [T] value subtracted at each window's last candle.
      ends: split name -> int64 [N] window end indices t (gap-free, purged).
      norm: how to map back: {"kind", "log_p0"} or {"kind", "mean", "std"}.
      price_mask: float32 [F], 1 on price-valued feature columns.
      notes: the Series notes plus window counts.
    """

    name: str
    symbol: str
    interval: str
    open_time_ms: np.ndarray
    ohlc: np.ndarray
    inputs: np.ndarray
    targets: np.ndarray
    anchor: np.ndarray
    ends: dict
    norm: dict
    price_mask: np.ndarray
    notes: dict


@struct.dataclass
class GroupArrays:
    """K series padded to common sizes and placed on the device (a pytree).

    Padded coins and padded window slots have mask False; their ends point at a
    valid index (L-1) so gathers stay in bounds.
    """

    inputs: jax.Array  # float32 [K, T, F]
    targets: jax.Array  # float32 [K, T, C]
    anchor: jax.Array  # float32 [K, T]
    price_mask: jax.Array  # float32 [F]: 1 on price columns, 0 elsewhere
    train_ends: jax.Array  # int32 [K, N_train]
    train_mask: jax.Array  # bool [K, N_train]
    val_ends: jax.Array  # int32 [K, N_val]
    val_mask: jax.Array  # bool [K, N_val]
    test_ends: jax.Array  # int32 [K, N_test]
    test_mask: jax.Array  # bool [K, N_test]

    def ends(self, split: str) -> tuple[jax.Array, jax.Array]:
        return getattr(self, f"{split}_ends"), getattr(self, f"{split}_mask")


def _contiguous_ends(open_time_ms: np.ndarray, step_ms: int, lookback: int, horizon: int):
    """Window ends t whose L+H candles t-L+1..t+H have no gap between them."""
    span = lookback + horizon
    if len(open_time_ms) < span:
        return np.zeros(0, np.int64)
    # breaks[i] = 1 where candle i+1 does not directly follow candle i.
    breaks = (np.diff(open_time_ms) != step_ms).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(breaks)])
    starts = np.arange(len(open_time_ms) - span + 1)
    ok = cum[starts + span - 1] == cum[starts]
    return starts[ok] + lookback - 1


def split_ends(ends: np.ndarray, splits, horizon: int) -> dict:
    """Chronological train/val/test split of window ends, purged at each boundary.

    The H windows just before each boundary are dropped, so no target candle of
    one split is also a target candle of the next split.
    """
    n = len(ends)
    b1 = int(round(n * splits[0]))
    b2 = int(round(n * (splits[0] + splits[1])))
    # Purge by time, not by count, so gaps near a boundary cannot reintroduce overlap:
    # a window ending at t uses targets up to t+H, and must end before the next split's
    # first window's first target (its end + 1).
    train = ends[:b1][ends[:b1] + horizon <= ends[b1]] if b1 < n else ends[:b1]
    val = ends[b1:b2][ends[b1:b2] + horizon <= ends[b2]] if b2 < n else ends[b1:b2]
    return {"train": train, "val": val, "test": ends[b2:]}


def _normalise(ohlc, feats, names, train_rows, kind):
    """Returns (inputs [T,F], targets [T,4], anchor [T], norm) as float64."""
    price = _price_mask(names).astype(bool)
    inputs = np.empty_like(feats)
    # Non-price features: train-split z-score in every mode.
    mu = feats[train_rows].mean(axis=0)
    sd = feats[train_rows].std(axis=0) + 1e-12
    inputs[:, ~price] = (feats[:, ~price] - mu[~price]) / sd[~price]
    if kind == "last_close":
        log_p0 = math.log(ohlc[train_rows][0, 3])
        inputs[:, price] = np.log(feats[:, price]) - log_p0
        targets = np.log(ohlc) - log_p0
        anchor = targets[:, 3].copy()
        return inputs, targets, anchor, {"kind": kind, "log_p0": log_p0}
    anchor = np.zeros(len(ohlc))
    if kind == "zscore":
        inputs[:, price] = (feats[:, price] - mu[price]) / sd[price]
        t_mu, t_sd = ohlc[train_rows].mean(axis=0), ohlc[train_rows].std(axis=0) + 1e-12
        targets = (ohlc - t_mu) / t_sd
        return inputs, targets, anchor, {"kind": kind, "mean": t_mu, "std": t_sd}
    low, high = ohlc[:, 2:3], ohlc[:, 1:2]
    rng = np.where(high - low > 0, high - low, 1.0)
    inputs[:, price] = (feats[:, price] - low) / rng
    targets = (ohlc - low) / rng
    return inputs, targets, anchor, {"kind": kind}


def prepare_series(series: Series, data_cfg) -> PreparedSeries:
    """Features, gap-free windows, split and normalisation for one series.

    Raises:
      SeriesSkipped: if too few candles or windows remain.
    """
    names = tuple(data_cfg.features)
    L, H = data_cfg.lookback, data_cfg.horizon
    ohlcv = series.ohlcv[-data_cfg.max_candles :]
    times = series.open_time_ms[-data_cfg.max_candles :]
    feats, first = features_lib.compute(ohlcv, names)
    ohlcv, times, feats = ohlcv[first:], times[first:], feats[first:]
    if len(ohlcv) < data_cfg.min_candles:
        raise SeriesSkipped(
            f"only {len(ohlcv)} usable candles after indicator warm-up, "
            f"need data.min_candles={data_cfg.min_candles}"
        )
    from cpbjax.config import INTERVAL_MS  # noqa: PLC0415 (avoid a cycle at import)

    ends = split_ends(_contiguous_ends(times, INTERVAL_MS[series.interval], L, H),
                      data_cfg.splits, H)  # fmt: skip
    for split in SPLITS:
        if len(ends[split]) == 0:
            raise SeriesSkipped(f"no gap-free {split} windows of {L}+{H} candles")
    # Candles a training window can touch: statistics are fitted on these alone.
    train_rows = np.arange(ends["train"][-1] + H + 1)
    ohlc = ohlcv[:, :4]
    inputs, targets, anchor, norm = _normalise(
        ohlc, feats, names, train_rows, data_cfg.normalization
    )
    if not (np.isfinite(inputs).all() and np.isfinite(targets).all()):
        bad = sorted({names[j] for j in np.nonzero(~np.isfinite(inputs).all(axis=0))[0]})
        raise SeriesSkipped(f"non-finite values after normalisation in features {bad}")
    notes = dict(series.notes, windows={s: int(len(e)) for s, e in ends.items()})
    return PreparedSeries(
        name=series.name, symbol=series.symbol, interval=series.interval,
        open_time_ms=times, ohlc=ohlc, inputs=inputs.astype(np.float32),
        targets=targets.astype(np.float32), anchor=anchor.astype(np.float32),
        ends=ends, norm=norm, price_mask=_price_mask(names), notes=notes,
    )  # fmt: skip


def _price_mask(names) -> np.ndarray:
    return np.array([n in features_lib.PRICE_FEATURES for n in names], np.float32)


def padded_sizes(data_cfg) -> dict:
    """Fixed T and per-split N for a config, so every group has one shape."""
    t_max = data_cfg.max_candles
    n = max(t_max - data_cfg.lookback - data_cfg.horizon + 1, 1)
    sizes = {"T": t_max}
    for split, frac in zip(SPLITS, data_cfg.splits, strict=True):
        sizes[split] = int(math.ceil(frac * n)) + 1
    return sizes


def stack_group(preps: list[PreparedSeries], group_size: int, data_cfg, sharding=None):
    """Pads `preps` to `group_size` coins and fixed sizes; places them on the device.

    Returns a GroupArrays. Padded coins repeat nothing: they are zeros with all
    masks False, so they add no loss, no gradient and no metric.
    """
    sizes = padded_sizes(data_cfg)
    k, t = group_size, sizes["T"]
    f = preps[0].inputs.shape[1]
    host = {
        "inputs": np.zeros((k, t, f), np.float32),
        "targets": np.zeros((k, t, NUM_TARGETS), np.float32),
        "anchor": np.zeros((k, t), np.float32),
    }
    for split in SPLITS:
        host[f"{split}_ends"] = np.full((k, sizes[split]), data_cfg.lookback - 1, np.int32)
        host[f"{split}_mask"] = np.zeros((k, sizes[split]), bool)
    for i, p in enumerate(preps):
        n_t = len(p.inputs)
        host["inputs"][i, :n_t] = p.inputs
        host["targets"][i, :n_t] = p.targets
        host["anchor"][i, :n_t] = p.anchor
        for split in SPLITS:
            e = p.ends[split]
            host[f"{split}_ends"][i, : len(e)] = e
            host[f"{split}_mask"][i, : len(e)] = True
    arrays = {key: jax.device_put(v, sharding) for key, v in host.items()}
    return GroupArrays(price_mask=jnp.asarray(preps[0].price_mask), **arrays)


def gather(inputs_TF, targets_TC, anchor_T, price_mask_F, ends_B, lookback: int, horizon: int):
    """Slices B windows of ONE coin on the device.

    Args:
      inputs_TF: float32 [T, F]; targets_TC: float32 [T, C]; anchor_T: float32 [T].
      price_mask_F: float32 [F]. ends_B: int32 [B] window end indices.
    Returns:
      x_BLF: float32 [B, L, F] inputs; y_BHC: float32 [B, H, C] targets.
    """
    in_idx_BL = ends_B[:, None] + jnp.arange(-lookback + 1, 1)[None, :]
    out_idx_BH = ends_B[:, None] + jnp.arange(1, horizon + 1)[None, :]
    anchor_B = anchor_T[ends_B]
    x_BLF = inputs_TF[in_idx_BL] - anchor_B[:, None, None] * price_mask_F
    y_BHC = targets_TC[out_idx_BH] - anchor_B[:, None, None]
    return x_BLF, y_BHC


def to_prices(prep: PreparedSeries, ends_N: np.ndarray, pred_NHC: np.ndarray) -> np.ndarray:
    """Maps normalised forecasts back to float64 prices [N, H, 4].

    Raises:
      ValueError: for candle_minmax, which discards the price level.
    """
    pred = np.asarray(pred_NHC, np.float64)
    kind = prep.norm["kind"]
    if kind == "last_close":
        return prep.ohlc[ends_N, 3][:, None, None] * np.exp(pred)
    if kind == "zscore":
        return pred * prep.norm["std"] + prep.norm["mean"]
    raise ValueError(
        "data.normalization='candle_minmax' keeps no price level, so forecasts "
        "cannot be mapped to prices; use last_close or zscore"
    )


def actual_prices(prep: PreparedSeries, ends_N: np.ndarray, horizon: int) -> np.ndarray:
    """The true next H candles of each window, float64 [N, H, 4]."""
    return prep.ohlc[ends_N[:, None] + np.arange(1, horizon + 1)[None, :]]


def latest_window(prep: PreparedSeries, lookback: int) -> np.ndarray:
    """The newest L candles as one normalised window, float32 [1, L, F]."""
    t = len(prep.inputs) - 1
    x_LF = prep.inputs[t - lookback + 1 : t + 1] - prep.anchor[t] * prep.price_mask
    return x_LF[None].astype(np.float32)
