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

Indicators are computed on the whole series (they are causal), then the newest
`max_candles` candles after the warm-up are kept, so warm-up rows are dropped,
never zero-filled, and never cost the kept series any candles. Indicators run
across a gap as if the candles were consecutive; windows never span a gap.

Auxiliary targets (config.model.aux_targets, the multi-task head's) are one row per
window, at its end t: realized_vol, the population std of the H close log returns
r_{t+1..t+H}, and bb_position, `features`' Bollinger position (20 periods, 2 std) of
the last forecast candle t+H. Neither reads a candle after t+H, the last OHLC target,
so both inherit its purge. Each is z-scored with the mean/std of its values on the
train windows, then scaled to the RMS of those windows' OHLC targets, so an aux MSE
weighs like the OHLC MSE whatever the normalisation (under last_close the OHLC targets
are log ratios of about 1e-2, and unit-variance aux targets would swamp them).

Splits are chronological over the gap-free windows. Purging is by candle index:
a window of one split is kept only if its last target candle comes before the
last input candle of the next split's first window, so the target candles of
the splits are disjoint however the gaps fall (without gaps this is exactly
"drop the H windows before each boundary"). "Train candles" are the candles
some training window reads (inputs or targets); zscore statistics are fitted on
them alone, so changing any later candle changes nothing in training.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import struct

from cpbjax.config import AUX_TARGETS, INTERVAL_MS
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
      aux: float32 [T, A] auxiliary targets of the window ending at each row (A = 0
        without aux targets; rows that end no window are 0).
      ends: split name -> int64 [N] window end indices t (gap-free, purged).
      norm: the fitted statistics and how to map back: {"kind", "feature_mean",
        "feature_std" (float64 [F], the train split's), and "log_p0" (last_close) or
        "mean", "std" (zscore, float64 [4]); with aux targets also "aux_targets" (their
        names), "aux_mean", "aux_std" (float64 [A])}; saved with a model's meta.json.
      price_mask: float32 [F], 1 on price-valued feature columns.
      notes: the Series notes plus "used_candles" (T) and "windows" (split -> count).
    """

    name: str
    symbol: str
    interval: str
    open_time_ms: np.ndarray
    ohlc: np.ndarray
    inputs: np.ndarray
    targets: np.ndarray
    anchor: np.ndarray
    aux: np.ndarray
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
    aux: jax.Array  # float32 [K, T, A]: aux targets by window end; A = 0 without them
    price_mask: jax.Array  # float32 [F]: 1 on price columns, 0 elsewhere
    train_ends: jax.Array  # int32 [K, N_train]
    train_mask: jax.Array  # bool [K, N_train]
    val_ends: jax.Array  # int32 [K, N_val]
    val_mask: jax.Array  # bool [K, N_val]
    test_ends: jax.Array  # int32 [K, N_test]
    test_mask: jax.Array  # bool [K, N_test]

    def ends(self, split: str) -> tuple[jax.Array, jax.Array]:
        """(ends int32 [K, N_split], mask bool [K, N_split]) of one split."""
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


def _boundaries(n, splits):
    """Split boundaries (b1, b2) for n windows; elementwise when n is an array."""
    n = np.asarray(n, np.int64)
    b1 = np.minimum(np.round(n * splits[0]).astype(np.int64), n)
    b2 = np.minimum(np.round(n * (splits[0] + splits[1])).astype(np.int64), n)
    return b1, b2


def split_ends(ends: np.ndarray, splits, horizon: int) -> dict:
    """Chronological train/val/test split of window ends, purged at each boundary.

    Args:
      ends: int [N] increasing window end indices (gap-free windows).
      splits: (train, val, test) fractions of the N windows.
      horizon: H, the number of target candles after each end.

    Returns:
      split name -> int64 [N_split] ends. A window ending at t has targets t+1..t+H;
      it is kept only if t + H < e, with e the end of the next split's first window.
      So its targets end before that window's last input candle e (the anchor of its
      forecasts) and before its first target e + 1. Without gaps this drops exactly
      the H windows before each boundary; with gaps, only windows that come that close.
    """
    ends = np.asarray(ends, np.int64)
    n = len(ends)
    b1, b2 = (int(b) for b in _boundaries(n, splits))
    parts = {"train": ends[:b1], "val": ends[b1:b2], "test": ends[b2:]}
    for split, boundary in (("train", b1), ("val", b2)):
        if boundary < n:
            part = parts[split]
            parts[split] = part[part + horizon < ends[boundary]]
    return parts


def _train_stats(x_NC: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column mean and population std of the train candles; std 1 where it is 0."""
    sd = x_NC.std(axis=0)
    return x_NC.mean(axis=0), np.where(sd > 0, sd, 1.0)


def _fitted_stats(fitted: dict, mean_key: str, std_key: str, width: int):
    """(mean, std) float64 [width] of a saved `norm`, checked against the column count."""
    mu, sd = np.asarray(fitted[mean_key], np.float64), np.asarray(fitted[std_key], np.float64)
    if mu.shape != (width,) or sd.shape != (width,) or not (sd > 0).all():
        raise ValueError(
            f"saved normalisation {mean_key}/{std_key} do not fit {width} columns "
            f"with std > 0: {mu.tolist()}, {sd.tolist()}"
        )
    return mu, sd


def _normalise(ohlc, feats, names, n_train: int, kind: str, fitted: dict | None = None):
    """Returns (inputs [T,F], targets [T,4], anchor [T], norm) as float64.

    Statistics are fitted on the first `n_train` candles (the train candles) only, or
    taken from `fitted` (the `norm` a training run saved with its model), so a saved
    model sees new data scaled exactly as its training data was.
    """
    price = _price_mask(names).astype(bool)
    if fitted is None:
        mu, sd = _train_stats(feats[:n_train])
    else:
        mu, sd = _fitted_stats(fitted, "feature_mean", "feature_std", len(names))
    # Non-price columns keep this z-score in every mode; zscore keeps it for all columns.
    inputs = (feats - mu) / sd
    norm = {"kind": kind, "feature_mean": mu, "feature_std": sd}
    if kind == "last_close":
        log_p0 = math.log(ohlc[0, 3])  # cancels out of every window; kept for to_prices
        with np.errstate(divide="ignore", invalid="ignore"):  # a band <= 0 is caught later
            inputs[:, price] = np.log(feats[:, price]) - log_p0
        targets = np.log(ohlc) - log_p0
        return inputs, targets, targets[:, 3].copy(), {**norm, "log_p0": log_p0}
    anchor = np.zeros(len(ohlc))
    if kind == "zscore":
        if fitted is None:
            t_mu, t_sd = _train_stats(ohlc[:n_train])
        else:
            t_mu, t_sd = _fitted_stats(fitted, "mean", "std", NUM_TARGETS)
        return inputs, (ohlc - t_mu) / t_sd, anchor, {**norm, "mean": t_mu, "std": t_sd}
    if kind == "candle_minmax":
        low, high = ohlc[:, 2:3], ohlc[:, 1:2]
        rng = np.where(high - low > 0, high - low, 1.0)
        inputs[:, price] = (feats[:, price] - low) / rng
        return inputs, (ohlc - low) / rng, anchor, norm
    raise ValueError(
        f"data.normalization={kind!r} is not allowed: expected last_close, zscore or candle_minmax"
    )


def _realized_vol(close_T, bb_position_T, ends_N, horizon):
    r_T = np.diff(np.log(close_T))  # r_T[i] = log(c[i+1] / c[i]), the return of candle i+1
    return r_T[ends_N[:, None] + np.arange(horizon)].std(axis=1)  # returns of t+1..t+H


def _bb_position(close_T, bb_position_T, ends_N, horizon):
    return bb_position_T[ends_N + horizon]


# Aux target name -> f(close [T], bb_position [T], ends [N], H) -> raw float64 [N].
_AUX_FUNCTIONS = {"realized_vol": _realized_vol, "bb_position": _bb_position}


def _fitted_aux_stats(fitted: dict, names: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) float64 [A] of `names` from a saved `norm`, matched by name."""
    saved = list(fitted.get("aux_targets", ()))
    missing = [n for n in names if n not in saved]
    if missing:
        raise ValueError(
            f"saved normalisation has no statistics of aux targets {missing} "
            f"(it has {saved}): use the model's config.model.aux_targets"
        )
    mu, sd = _fitted_stats(fitted, "aux_mean", "aux_std", len(saved))
    order = [saved.index(n) for n in names]
    return mu[order], sd[order]


def _aux(
    names, close_T, bb_position_T, y_scale: float, ends: dict, horizon: int, fitted: dict | None
):
    """(aux float32 [T, A] indexed by window end, its `norm` entries).

    `y_scale` is the RMS of the train windows' normalised OHLC targets; see the
    module docstring.
    """
    ends_N = np.concatenate([ends[s] for s in SPLITS])  # train windows first
    raw_NA = np.stack(
        [_AUX_FUNCTIONS[n](close_T, bb_position_T, ends_N, horizon) for n in names], axis=1
    )
    if fitted is None:
        mu, sd = _train_stats(raw_NA[: len(ends["train"])])
        sd = sd / (y_scale if y_scale > 0 else 1.0)
    else:
        mu, sd = _fitted_aux_stats(fitted, names)
    aux_TA = np.zeros((len(close_T), len(names)))
    aux_TA[ends_N] = (raw_NA - mu) / sd
    bad = [n for j, n in enumerate(names) if not np.isfinite(aux_TA[:, j]).all()]
    if bad:
        raise SeriesSkipped(f"non-finite aux targets {bad} (model.aux_targets)")
    return aux_TA.astype(np.float32), {"aux_targets": names, "aux_mean": mu, "aux_std": sd}


def _target_rms(targets_T4, anchor_T, ends_N, horizon: int) -> float:
    """RMS of the normalised OHLC targets of the windows ending at ends_N (what `gather` gives)."""
    y_NHC = targets_T4[ends_N[:, None] + np.arange(1, horizon + 1)] - anchor_T[ends_N, None, None]
    return float(np.sqrt(np.mean(np.square(y_NHC))))


def _kept_rows(series: Series, data_cfg, names):
    """(open times, ohlcv, features) of the newest max_candles candles past the warm-up.

    Also returns first_valid, the number of warm-up rows of the whole series.
    """
    feats, first_valid = features_lib.compute(series.ohlcv, names)
    start = max(first_valid, len(series.ohlcv) - data_cfg.max_candles)
    return series.open_time_ms[start:], series.ohlcv[start:], feats[start:], first_valid


def prepare_series(
    series: Series, data_cfg, fitted_norm: dict | None = None, aux_targets=()
) -> PreparedSeries:
    """Features, gap-free windows, split and normalisation for one series.

    Args:
      series: validated candles of one symbol and interval.
      data_cfg: the `config.data` group.
      fitted_norm: a saved model's `norm` (its training statistics) to normalise with;
        None fits them on this series' train split.
      aux_targets: config.model.aux_targets, the aux targets to compute (`aux`).

    Returns:
      The PreparedSeries (host arrays; see the module docstring).

    Raises:
      SeriesSkipped: if fewer than data.min_candles candles remain after the warm-up,
        if a split has no gap-free window, or if a normalised value is not finite.
      ValueError: an unknown aux target, or a fitted_norm that does not fit.
    """
    names, aux_names = tuple(data_cfg.features), tuple(aux_targets)
    L, H = data_cfg.lookback, data_cfg.horizon
    if not set(aux_names) <= set(AUX_TARGETS):
        raise ValueError(f"aux targets {aux_names}: expected names from {AUX_TARGETS}")
    # bb_position's bands need 19 earlier candles: its warm-up is dropped like the inputs'.
    extra = ("bb_position",) if "bb_position" in aux_names else ()
    times, ohlcv, all_feats, warmup = _kept_rows(series, data_cfg, names + extra)
    feats = all_feats[:, : len(names)]
    if len(ohlcv) < data_cfg.min_candles:
        raise SeriesSkipped(
            f"only {len(ohlcv)} usable candles ({len(series.ohlcv)} loaded, the first "
            f"{warmup} are indicator warm-up), need data.min_candles={data_cfg.min_candles}"
        )
    ends = split_ends(
        _contiguous_ends(times, INTERVAL_MS[series.interval], L, H), data_cfg.splits, H
    )
    for split in SPLITS:
        if len(ends[split]) == 0:
            raise SeriesSkipped(f"no gap-free {split} windows of {L}+{H} candles")
    n_train = int(ends["train"][-1]) + H + 1  # every candle a training window reads
    ohlc = ohlcv[:, :4]
    inputs, targets, anchor, norm = _normalise(
        ohlc, feats, names, n_train, data_cfg.normalization, fitted_norm
    )
    _check_finite(inputs, names)
    aux = np.zeros((len(ohlc), 0), np.float32)
    if aux_names:
        y_scale = _target_rms(targets, anchor, ends["train"], H)
        aux, aux_norm = _aux(aux_names, ohlc[:, 3], all_feats[:, -1], y_scale, ends, H, fitted_norm)
        norm = {**norm, **aux_norm}
    notes = dict(series.notes, used_candles=len(ohlc), windows={s: len(e) for s, e in ends.items()})
    return PreparedSeries(
        name=series.name,
        symbol=series.symbol,
        interval=series.interval,
        open_time_ms=times,
        ohlc=ohlc,
        inputs=inputs.astype(np.float32),
        targets=targets.astype(np.float32),
        anchor=anchor.astype(np.float32),
        aux=aux,
        ends=ends,
        norm=norm,
        price_mask=_price_mask(names),
        notes=notes,
    )


def prepare_all(
    series_list: list[Series], data_cfg, fitted_norms: dict | None = None, aux_targets=()
) -> tuple[list[PreparedSeries], dict]:
    """`prepare_series` for each series; one that cannot be used is skipped, not fatal.

    Args:
      series_list: validated series.
      data_cfg: the `config.data` group.
      fitted_norms: optional series name -> saved `norm` (see `prepare_series`).
      aux_targets: config.model.aux_targets (see `prepare_series`).

    Returns:
      (prepared series in input order, series name -> reason it was skipped).
    """
    preps, skipped = [], {}
    for series in series_list:
        try:
            fitted = (fitted_norms or {}).get(series.name)
            preps.append(prepare_series(series, data_cfg, fitted, aux_targets))
        except SeriesSkipped as e:
            skipped[series.name] = str(e)
            logging.warning("%s: skipped: %s", series.name, e)
    return preps, skipped


def _check_finite(inputs_TF: np.ndarray, names) -> None:
    bad = [names[j] for j in np.nonzero(~np.isfinite(inputs_TF).all(axis=0))[0]]
    if bad:
        raise SeriesSkipped(
            f"non-finite normalised values in features {bad} "
            "(under last_close a price feature such as bb_lower must stay > 0)"
        )


def _price_mask(names) -> np.ndarray:
    return np.array([n in features_lib.PRICE_FEATURES for n in names], np.float32)


def padded_sizes(data_cfg) -> dict:
    """Fixed T and per-split window counts for a config, so every group has one shape.

    A prepared series has at most data.max_candles candles, so at most
    n_max = max_candles - L - H + 1 windows. Each split's size is the largest count
    `split_ends` gives that split for any n <= n_max windows (purging only removes),
    so it bounds every series of the run, whatever its length and gaps.

    Returns:
      {"T": max_candles, "train": N_train, "val": N_val, "test": N_test}, each >= 1.
    """
    t_max = data_cfg.max_candles
    n_max = max(t_max - data_cfg.lookback - data_cfg.horizon + 1, 0)
    n = np.arange(n_max + 1)
    b1, b2 = _boundaries(n, data_cfg.splits)
    counts = {"train": b1, "val": b2 - b1, "test": n - b2}
    return {"T": t_max, **{split: max(int(counts[split].max()), 1) for split in SPLITS}}


def _check_fits(preps: list[PreparedSeries], group_size: int, sizes: dict) -> None:
    if not preps or len(preps) > group_size:
        raise ValueError(f"stack_group: {len(preps)} series for group_size={group_size}")
    width, num_aux = preps[0].inputs.shape[1], preps[0].aux.shape[1]
    for p in preps:
        counts = {split: len(p.ends[split]) for split in SPLITS}
        shapes = (p.inputs.shape[1], p.aux.shape[1])
        if (
            len(p.inputs) > sizes["T"]
            or shapes != (width, num_aux)
            or any(counts[s] > sizes[s] for s in SPLITS)
        ):
            raise ValueError(
                f"stack_group: {p.name} has {len(p.inputs)} candles, {p.inputs.shape[1]} "
                f"features, {p.aux.shape[1]} aux targets and windows {counts}, which do not "
                f"fit the padded sizes {sizes} with {width} features and {num_aux} aux "
                "targets: prepare every series with the same config"
            )


def stack_group(preps: list[PreparedSeries], group_size: int, data_cfg, shardings=None):
    """Pads `preps` to `group_size` coins and fixed sizes; places them on the devices.

    Args:
      preps: 1..group_size series prepared with this `data_cfg`.
      group_size: K, the coin axis length of every group in the run.
      data_cfg: the `config.data` group (sizes come from `padded_sizes`).
      shardings: optional GroupArrays of `jax.sharding.Sharding`s, one per field. Each
        process then places only the shards its own devices hold, so the same call
        builds the global arrays of a multi-host run. None: the default device.

    Returns:
      A GroupArrays. Padded coins repeat nothing: they are zeros with all masks
      False, so they add no loss, no gradient and no metric. Padded window slots
      (of real and padded coins) have mask False and end L - 1, so every gather
      stays in bounds.

    Raises:
      ValueError: if there are no series, more than group_size, or one exceeds the
        padded sizes or has another feature width.
    """
    sizes = padded_sizes(data_cfg)
    _check_fits(preps, group_size, sizes)
    k, t, f = group_size, sizes["T"], preps[0].inputs.shape[1]
    host = {
        "inputs": np.zeros((k, t, f), np.float32),
        "targets": np.zeros((k, t, NUM_TARGETS), np.float32),
        "anchor": np.zeros((k, t), np.float32),
        "aux": np.zeros((k, t, preps[0].aux.shape[1]), np.float32),
    }
    for split in SPLITS:
        host[f"{split}_ends"] = np.full((k, sizes[split]), data_cfg.lookback - 1, np.int32)
        host[f"{split}_mask"] = np.zeros((k, sizes[split]), bool)
    for i, p in enumerate(preps):
        n_t = len(p.inputs)
        host["inputs"][i, :n_t] = p.inputs
        host["targets"][i, :n_t] = p.targets
        host["anchor"][i, :n_t] = p.anchor
        host["aux"][i, :n_t] = p.aux
        for split in SPLITS:
            e = p.ends[split]
            host[f"{split}_ends"][i, : len(e)] = e
            host[f"{split}_mask"][i, : len(e)] = True
    host = GroupArrays(price_mask=np.asarray(preps[0].price_mask, np.float32), **host)
    if shardings is None:
        return jax.device_put(host)
    return jax.tree.map(
        lambda a, sharding: jax.make_array_from_callback(a.shape, sharding, lambda i: a[i]),
        host,
        shardings,
    )


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


def gather_aux(aux_TA: jax.Array, ends_B: jax.Array) -> jax.Array:
    """The aux targets of B windows of ONE coin: aux_TA [T, A], ends_B [B] -> [B, A]."""
    return aux_TA[ends_B]


def to_prices(prep: PreparedSeries, ends_N: np.ndarray, pred_NHC: np.ndarray) -> np.ndarray:
    """Maps normalised forecasts back to float64 prices [N, H, 4].

    Args:
      prep: the series the windows come from.
      ends_N: int [N] window end indices into prep (e.g. prep.ends["test"]).
      pred_NHC: [N, H, 4] forecasts in the normalised space `gather` produces.

    Returns:
      float64 [N, H, 4] OHLC prices; exact (up to float64) for last_close.

    Raises:
      ValueError: for candle_minmax, which discards the price level.
    """
    pred = np.asarray(pred_NHC, np.float64)
    kind = prep.norm["kind"]
    if kind == "last_close":
        return prep.ohlc[np.asarray(ends_N), 3][:, None, None] * np.exp(pred)
    if kind == "zscore":
        return pred * prep.norm["std"] + prep.norm["mean"]
    raise ValueError(
        f"{prep.name}: data.normalization='candle_minmax' keeps no price level, so "
        "forecasts cannot be mapped to prices; use last_close or zscore"
    )


def actual_prices(prep: PreparedSeries, ends_N: np.ndarray, horizon: int) -> np.ndarray:
    """The true next H candles of each window, float64 [N, H, 4]."""
    ends_N = np.asarray(ends_N)
    return prep.ohlc[ends_N[:, None] + np.arange(1, horizon + 1)[None, :]]


def latest_window(prep: PreparedSeries, lookback: int) -> np.ndarray:
    """The newest L candles as one normalised window, float32 [1, L, F].

    Raises:
      ValueError: if the newest L candles are fewer than L or span a gap (the
        models never saw such a window, and no candle is invented to fill it).
    """
    t = len(prep.inputs) - 1
    steps = np.diff(prep.open_time_ms[max(t - lookback + 1, 0) :])
    if t + 1 < lookback or np.any(steps != INTERVAL_MS[prep.interval]):
        raise ValueError(
            f"{prep.name}: the newest {lookback} candles (data.lookback) are not "
            f"{lookback} consecutive {prep.interval} candles, so there is no window to "
            "forecast from"
        )
    x_LF = prep.inputs[t - lookback + 1 : t + 1] - prep.anchor[t] * prep.price_mask
    return x_LF[None].astype(np.float32)
