"""K prepared series stacked into one padded group, and windows gathered from it on the device.

Every group of a run is padded to the same fixed sizes (`padded_sizes`), so one compiled
program serves them all. `gather` slices a batch of windows of one coin inside the jitted
step: windows are never materialised, so memory stays O(K·T·F). (A run whose series do
not fit in device memory streams its windows instead: the host gathers them with the
same `gather`, cpbjax/training/streaming.py.)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from flax import struct

from cpbjax import band, process_pool
from cpbjax.data import split_dates
from cpbjax.data.series import INTERVAL_MS
from cpbjax.data.windows import (
    EPOCH_SPLITS,
    NUM_TARGETS,
    SPLITS,
    PreparedSeries,
    split_boundaries,
)


@struct.dataclass
class GroupArrays:
    """K series padded to common sizes: what the compiled epoch reads (a pytree).

    Only the train and val windows: the epoch never reads the test split, so it never
    reaches the devices. Padded coins and padded window slots have mask False; their
    ends point at a valid index (L-1) so gathers stay in bounds.
    """

    inputs: jax.Array  # float32 [K, T, F]
    targets: jax.Array  # float32 [K, T, C]
    anchor: jax.Array  # float32 [K, T]
    price_mask: jax.Array  # float32 [F]: 1 on price columns, 0 elsewhere
    # float32 [K, C]: each column's persistence MAE over the coin's train windows, the
    # divisor of train.loss_scale=persistence (1 for padded coins).
    target_scale: jax.Array
    band: jax.Array  # float32 [K, H, 2]: the vol band's (high, low) factors fitted on train
    train_ends: jax.Array  # int32 [K, N_train]
    train_mask: jax.Array  # bool [K, N_train]
    val_ends: jax.Array  # int32 [K, N_val]
    val_mask: jax.Array  # bool [K, N_val]
    # name -> float32 [K]: per-coin hyperparameters of a sweep (PreparedSeries.hparams,
    # cpbjax/config/sweep_grid.py; 0 for padded coins); {} otherwise, so no leaf is added.
    hparams: dict = struct.field(default_factory=dict)

    def ends(self, split: str) -> tuple[jax.Array, jax.Array]:
        """(ends int32 [K, N_split], mask bool [K, N_split]) of one split."""
        return getattr(self, f"{split}_ends"), getattr(self, f"{split}_mask")


# Padded lengths come in multiples of this many candles, so runs whose longest series
# differ a little still share compiled programs (and the compile cache).
LENGTH_BUCKET = 512


def padded_length(preps: list[PreparedSeries], data_cfg) -> int:
    """T of a run's groups: its longest series rounded up to LENGTH_BUCKET, at most
    data.max_candles. Padding far past the data would only compute empty windows."""
    longest = max(len(p.inputs) for p in preps)
    bucketed = -(-longest // LENGTH_BUCKET) * LENGTH_BUCKET
    return min(data_cfg.max_candles, bucketed) if data_cfg.max_candles else bucketed


def padded_sizes(data_cfg, t_max: int | None = None) -> dict:
    """Fixed T and per-split window counts, so every group of a run has one shape.

    A prepared series has at most t_max candles (default data.max_candles; see
    `padded_length`), so at most n_max = t_max - L - H + 1 windows. Each split's size is
    the largest count `split_ends` gives that split for any n <= n_max windows (purging
    only removes), so it bounds every series of the run, whatever its length and gaps.

    Returns:
      {"T": t_max, "train": N_train, "val": N_val, "test": N_test}, each >= 1.
    """
    t_max = data_cfg.max_candles if t_max is None else t_max
    n_max = max(t_max - data_cfg.lookback - data_cfg.horizon + 1, 0)
    if split_dates.bounds_ms(data_cfg) is not None:
        return {"T": t_max, **_calendar_sizes(data_cfg, n_max)}
    n = np.arange(n_max + 1)
    b1, b2 = split_boundaries(n, data_cfg.splits)
    counts = {"train": b1, "val": b2 - b1, "test": n - b2}
    return {"T": t_max, **{split: max(int(counts[split].max()), 1) for split in SPLITS}}


def _calendar_sizes(data_cfg, n_max: int) -> dict:
    """Per-split window bounds under data.split_dates: train and test may hold every window;
    val windows have their targets inside the val span, so at most its candles of the
    run's shortest interval."""
    val_start, test_start = split_dates.bounds_ms(data_cfg)
    step = min(INTERVAL_MS[i] for i in data_cfg.intervals)
    val = min(n_max, (test_start - val_start) // step)
    return {"train": max(n_max, 1), "val": max(val, 1), "test": max(n_max, 1)}


def _check_fits(preps: list[PreparedSeries], group_size: int, sizes: dict) -> None:
    if not preps or len(preps) > group_size:
        raise ValueError(f"stack_group: {len(preps)} series for group_size={group_size}")
    if any(p.hparams.keys() != preps[0].hparams.keys() for p in preps):
        raise ValueError("stack_group: the series carry different hparams names")
    width = preps[0].inputs.shape[1]
    for p in preps:
        counts = {split: len(p.ends[split]) for split in SPLITS}
        if (
            len(p.inputs) > sizes["T"]
            or p.inputs.shape[1] != width
            or any(counts[s] > sizes[s] for s in SPLITS)
        ):
            raise ValueError(
                f"stack_group: {p.name} has {len(p.inputs)} candles, {p.inputs.shape[1]} "
                f"features and windows {counts}, which do not fit the padded sizes {sizes} "
                f"with {width} features: prepare every series with the same config"
            )


def persistence_scale(prep: PreparedSeries, horizon: int) -> np.ndarray:
    """Mean |target - last close| of each OHLC column over the train windows, float32 [C].

    The normalised persistence forecast is the window's last close (targets[end, 3]), so
    this is the error a forecast must beat, per column. 1 where it is 0 or undefined.
    """
    ends_N = prep.ends["train"]
    if not len(ends_N):
        return np.ones(NUM_TARGETS, np.float32)
    idx_NH = ends_N[:, None] + np.arange(1, horizon + 1)[None, :]
    # In place on the one gathered copy: the float32 errors, their float64 sum in (n, h)
    # order and its mean are those of the plain expression, without three temporaries.
    err_NHC = prep.targets[idx_NH]
    err_NHC -= prep.targets[ends_N, 3][:, None, None]
    np.abs(err_NHC, out=err_NHC)
    total_C = np.add.reduce(err_NHC.reshape(-1, NUM_TARGETS), axis=0, dtype=np.float64)
    scale_C = total_C / idx_NH.size
    return np.where(scale_C > 0, scale_C, 1.0).astype(np.float32)


def band_factors(prep: PreparedSeries, lookback: int, horizon: int) -> np.ndarray:
    """band.fit_vol_band's (k_high, k_low) per step on the train windows, float32 [H, 2].

    A series whose train windows have no range keeps `default_band` (windows.with_ends
    skips such a series; a prep built otherwise, e.g. in a test, still stacks).
    """
    try:
        fit = band.fit_vol_band(prep.ohlc, prep.ends["train"].astype(np.int64), lookback, horizon)
    except band.NoRange:
        return default_band(horizon)
    return np.stack([fit["k_high_h"], fit["k_low_h"]], axis=-1).astype(np.float32)


def default_band(horizon: int) -> np.ndarray:
    """sqrt(h) / 2 for high and low, [H, 2]: models.heads.ForecastOutput's init."""
    return np.repeat(0.5 * np.sqrt(np.arange(1.0, horizon + 1))[:, None], 2, 1).astype(np.float32)


# Series whose fits (`persistence_scale`, `band_factors`) run side by side
# (process_pool.numpy_threads); each series' fit is its own, the same in any order.
FIT_THREADS = process_pool.threads()


def _series_fits(preps: list[PreparedSeries], lookback: int, horizon: int) -> list[tuple]:
    """(persistence_scale [C], band_factors [H, 2]) of each series, FIT_THREADS at a time."""

    def fits(p):
        return persistence_scale(p, horizon), band_factors(p, lookback, horizon)

    return process_pool.numpy_threads(fits, preps, FIT_THREADS)


def _host_arrays(preps: list[PreparedSeries], k: int, sizes: dict, data_cfg):
    """The GroupArrays of `stack_group` as numpy arrays: K coins, padded to `sizes`."""
    t, f, h = sizes["T"], preps[0].inputs.shape[1], data_cfg.horizon
    host = {
        "inputs": np.zeros((k, t, f), np.float32),
        "targets": np.zeros((k, t, NUM_TARGETS), np.float32),
        "anchor": np.zeros((k, t), np.float32),
        "target_scale": np.ones((k, NUM_TARGETS), np.float32),
        "band": np.repeat(default_band(h)[None], k, 0),
    }
    for split in EPOCH_SPLITS:
        host[f"{split}_ends"] = np.full((k, sizes[split]), data_cfg.lookback - 1, np.int32)
        host[f"{split}_mask"] = np.zeros((k, sizes[split]), bool)
    fits = _series_fits(preps, data_cfg.lookback, h)
    for i, (p, (target_scale_C, band_H2)) in enumerate(zip(preps, fits, strict=True)):
        n_t = len(p.inputs)
        for field in ("inputs", "targets", "anchor"):
            host[field][i, :n_t] = getattr(p, field)
        host["target_scale"][i], host["band"][i] = target_scale_C, band_H2
        for split in EPOCH_SPLITS:
            e = p.ends[split]
            host[f"{split}_ends"][i, : len(e)] = e
            host[f"{split}_mask"][i, : len(e)] = True
    price_mask = np.asarray(preps[0].price_mask, np.float32)
    return GroupArrays(price_mask=price_mask, hparams=_stack_hparams(preps, k), **host)


def _stack_hparams(preps: list[PreparedSeries], k: int) -> dict:
    """GroupArrays.hparams: each name of the coins' hparams -> float32 [K] (0 when padded)."""
    hparams = {name: np.zeros(k, np.float32) for name in preps[0].hparams}
    for i, p in enumerate(preps):
        for name, value in p.hparams.items():
            hparams[name][i] = value
    return hparams


def stack_group(
    preps: list[PreparedSeries], group_size: int, data_cfg, t_max: int | None = None
) -> GroupArrays:
    """Pads `preps` to `group_size` coins and fixed sizes, as host (numpy) arrays.

    group.GroupTrainer.stack places the result on the coin-sharded devices.

    Args:
      preps: 1..group_size series prepared with this `data_cfg`.
      group_size: K, the coin axis length of every group in the run.
      data_cfg: the `config.data` group (sizes come from `padded_sizes`).
      t_max: the run's padded length T (`padded_length`); default data.max_candles.

    Returns:
      A GroupArrays. Padded coins repeat nothing: they are zeros with all masks
      False, so they add no loss, no gradient and no metric. Padded window slots
      (of real and padded coins) have mask False and end L - 1, so every gather
      stays in bounds.

    Raises:
      ValueError: if there are no series, more than group_size, or one exceeds the
        padded sizes or has another feature width.
    """
    sizes = padded_sizes(data_cfg, t_max)
    _check_fits(preps, group_size, sizes)
    return _host_arrays(preps, group_size, sizes, data_cfg)


class WindowSource(NamedTuple):
    """The device arrays of ONE series that its windows are sliced from (`gather`)."""

    inputs_TF: jax.Array  # float32 [T, F]
    targets_TC: jax.Array  # float32 [T, C]
    anchor_T: jax.Array  # float32 [T]
    price_mask_F: jax.Array  # float32 [F]


def window_source(prep) -> WindowSource:
    """The WindowSource of a PreparedSeries (host arrays)."""
    return WindowSource(prep.inputs, prep.targets, prep.anchor, prep.price_mask)


def gather(source: WindowSource, ends_B, lookback: int, horizon: int):
    """Slices B windows of ONE coin: on the device (jax arrays, inside the jitted step), or
    on the host (numpy arrays, cpbjax/training/streaming.py) with the same float32 arithmetic, so
    both give the same bits.

    Args:
      source: the coin's arrays. ends_B: int32 [B] window end indices; any leading axes
        (ends [J, B] give [J, B, L, F] and [J, B, H, C]).
    Returns:
      x_BLF: float32 [B, L, F] inputs; y_BHC: float32 [B, H, C] targets.
    """
    out_idx_BH = ends_B[..., None] + np.arange(1, horizon + 1, dtype=np.int32)
    y_BHC = source.targets_TC[out_idx_BH] - source.anchor_T[ends_B][..., None, None]
    return gather_inputs(source, ends_B, lookback), y_BHC


def gather_inputs(source: WindowSource, ends_B, lookback: int):
    """`gather`'s inputs alone, float32 [B, L, F]: the windows of a forecast, whose
    targets may lie past the newest candle."""
    anchor_B = source.anchor_T[ends_B]
    return (
        source.inputs_TF[band.window_index(ends_B, lookback)]
        - anchor_B[..., None, None] * source.price_mask_F
    )
