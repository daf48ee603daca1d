"""Leak-free windows: split, purge, normalise on the host; gather on the device.

A window ending at candle t has inputs t-L+1..t and targets t+1..t+H (OHLC).
Windows are never materialised: a series is stored once as [T, F] inputs and
[T, C] targets, and `gather` slices a batch of windows from them inside the
jitted step, so host and device memory stay O(K·T·F).

Normalisation (`normalize`) is arranged so that the device only ever subtracts an
anchor: x = inputs - anchor[t] * price_mask, y = targets - anchor[t].

Indicators are computed on the whole series (they are causal), then the newest
`max_candles` candles after the warm-up are kept, so warm-up rows are dropped,
never zero-filled, and never cost the kept series any candles. Indicators run
across a gap as if the candles were consecutive; windows never span a gap.

Splits are chronological over the gap-free windows, by fractions of each series'
windows (data.splits) or by calendar dates shared by every series (data.split_dates,
`split_dates.split_ends`). Fractional purging is by candle index: a window of one split
is kept only if its last target candle comes before the last input candle of the next
split's first window, so the splits' target candles are disjoint however the gaps fall.
"Train candles" are those some training window reads; the non-price features' z-score
statistics are fitted on them alone, so no later candle changes anything in training.

Calendar splits (`split_dates`) purge by time instead. A training-data-only series has
no val or test windows to score, so it is skipped with that reason, except where a
pooled model may learn from it (`prepare_all(keep_train_only=True)`; its notes then hold
the reason under split_dates.TRAIN_ONLY).

Past covariates (data.covariates, cpbjax/data/covariates.py) follow the features in
`inputs`, read over the same L candles; a window whose lookback still misses one after
the fill is dropped before the split, and counted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from cpbjax import band, columns, process_pool
from cpbjax.columns import NUM_TARGETS
from cpbjax.data import covariates as covariates_lib
from cpbjax.data import features as features_lib
from cpbjax.data import normalize, skip_groups, split_dates
from cpbjax.data.series import INTERVAL_MS, Series, SeriesSkipped
from cpbjax.data.split_dates import SPLITS, TrainOnly

EPOCH_SPLITS = ("train", "val")  # the splits a training epoch reads (GroupArrays)


# latest.prepare_latest's notes key of the rows whose covariates are missing (PreparedSeries).
COVARIATE_MISSING = "covariate_missing_rows"


@dataclasses.dataclass
class PreparedSeries:
    """One series ready for training, on the host.

    Attributes:
      name, symbol, interval: identity ("BTCUSDT-1h").
      open_time_ms: int64 [T] open times of the kept candles.
      ohlc: float64 [T, 4] raw prices, used to map forecasts back and to score.
      inputs: float32 [T, F] normalised features, then the K data.covariates columns
        (cpbjax/data/covariates.py; F counts them).
      targets: float32 [T, 4] normalised OHLC targets.
      anchor: float32 [T] value subtracted at each window's last candle.
      ends: split name -> int64 [N] window end indices t (gap-free, purged).
      norm: the fitted statistics and how to map back: {"kind", "feature_mean",
        "feature_std" (float64 [F], the train split's), "log_p0"; with covariates
        "covariates", "covariate_mean", "covariate_std", "covariate_scaling"}; saved with
        a model's meta.json.
      price_mask: float32 [F], 1 on price-valued feature columns.
      notes: the Series notes plus "used_candles" (T) and "windows" (split -> count);
        with covariates "covariate_skipped_windows" (gap-free windows whose lookback
        holds a missing covariate); a forecast's (`latest.prepare_latest`) COVARIATE_MISSING,
        bool [T], the rows with a covariate missing (no window an unseen series' fits
        read holds one, zero_shot.fit_ends).
      hparams: a sweep coin's own hyperparameters, name -> value (cpbjax/config/sweep_grid.py);
        {} for a series trained with the run config's.
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
    hparams: dict = dataclasses.field(default_factory=dict)


def contiguous_ends(open_time_ms: np.ndarray, step_ms: int, lookback: int, horizon: int):
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


def window_ends(rows: KeptRows, interval: str, lookback: int, horizon: int) -> np.ndarray:
    """The ends of the gap-free windows of `rows` whose lookback holds every covariate."""
    ends = contiguous_ends(rows.open_time_ms, INTERVAL_MS[interval], lookback, horizon)
    if rows.covariates.shape[1]:
        ends = covariates_lib.complete_ends(ends, np.isnan(rows.covariates).any(axis=1), lookback)
    return ends


def split_boundaries(n, splits):
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
    b1, b2 = (int(b) for b in split_boundaries(n, splits))
    parts = {"train": ends[:b1], "val": ends[b1:b2], "test": ends[b2:]}
    for split, boundary in (("train", b1), ("val", b2)):
        if boundary < n:
            part = parts[split]
            parts[split] = part[part + horizon < ends[boundary]]
    return parts


def newest_start(num_candles: int, first_valid: int, max_candles: int) -> int:
    """The first row kept: past the warm-up, the newest max_candles (0 = no cap)."""
    return max(first_valid, num_candles - max_candles) if max_candles else first_valid


def series_features(series: Series, names) -> tuple[np.ndarray, int]:
    """`features.compute` on the whole loaded history of `series`: (float64 [T, F], first_valid).

    Always on everything loaded, before any trim to data.max_candles, so the warm-up
    (up to a month of candles for the long-history features) eats older history.
    """
    return features_lib.compute(series.ohlcv, names, series.interval, series.open_time_ms)


def _kept_rows(series: Series, data_cfg, names):
    """(open times [T], ohlcv [T, 5], features [T, F]): the newest max_candles past the warm-up.

    Raises:
      SeriesSkipped: if fewer than data.min_candles candles remain.
    """
    feats_TF, first_valid = series_features(series, names)
    start = newest_start(len(series.ohlcv), first_valid, data_cfg.max_candles)
    times_T, ohlcv_T5 = series.open_time_ms[start:], series.ohlcv[start:]
    if len(ohlcv_T5) < data_cfg.min_candles:
        raise SeriesSkipped(
            f"only {len(ohlcv_T5)} usable candles ({len(series.ohlcv)} loaded, the first "
            f"{first_valid} are indicator warm-up), need data.min_candles={data_cfg.min_candles}"
        )
    return times_T, ohlcv_T5, feats_TF[start:]


def _split_windows(rows: KeptRows, interval: str, data_cfg) -> dict:
    """split name -> int64 [N_split] purged ends of the gap-free windows (`window_ends`).

    Raises:
      SeriesSkipped: if a split has no window.
    """
    L, H, step = data_cfg.lookback, data_cfg.horizon, INTERVAL_MS[interval]
    times_T = rows.open_time_ms
    bounds = split_dates.bounds_ms(data_cfg)
    if bounds is None:
        ends = split_ends(window_ends(rows, interval, L, H), data_cfg.splits, H)
    else:
        ends = split_dates.split_ends(window_ends(rows, interval, L, H), times_T, step, H, bounds)
        if len(ends["train"]) and int(times_T[-1]) + step <= bounds[0]:
            raise TrainOnly(
                "training data only: ends before data.split_dates[0] "
                f"({data_cfg.split_dates[0]}): {len(ends['train'])} train windows, no val or "
                "test window to score",
                ends,
            )
    for split in SPLITS:
        if len(ends[split]) == 0:
            raise split_dates.NoWindows(f"no gap-free {split} windows of {L}+{H} candles", ends)
    return ends


def _normalised(rows, ends: dict, data_cfg, fitted, name: str) -> dict:
    """The normalised PreparedSeries fields: inputs, targets, anchor, norm, price_mask.

    `rows`: `kept_rows`; `name`: the series, named by a covariate error.
    """
    ohlc_TC, feats_TF, names = rows.ohlcv[:, :NUM_TARGETS], rows.features, rows.names
    n_train = int(ends["train"][-1]) + data_cfg.horizon + 1  # every candle training reads
    inputs_TF, targets_TC, anchor_T, norm = normalize.normalise(
        ohlc_TC, feats_TF, names, n_train, data_cfg.normalization, fitted
    )
    normalize.check_finite(inputs_TF, names)
    if rows.covariate_names:  # after the features: inputs [T, F + K]
        cov_TK, cov_norm = covariates_lib.scaled(rows.covariates, n_train, data_cfg, fitted, name)
        inputs_TF, norm = np.concatenate([inputs_TF, cov_TK], axis=1), {**norm, **cov_norm}
        names = (*names, *rows.covariate_names)
    return {
        "inputs": inputs_TF.astype(np.float32),
        "targets": targets_TC.astype(np.float32),
        "anchor": anchor_T.astype(np.float32),
        "norm": norm,
        "price_mask": columns.price_mask(names),  # 0 on every covariate
    }


def prepare_series(
    series: Series, data_cfg, fitted_norm: dict | None = None, keep_train_only=False
) -> PreparedSeries:
    """Features, gap-free windows, split and normalisation for one series.

    Args:
      series: validated candles of one symbol and interval.
      data_cfg: the `config.data` group.
      fitted_norm: a saved model's `norm` (its training statistics) to normalise with;
        None fits them on this series' train split.
      keep_train_only: return a training-data-only series (data.split_dates) with empty
        val and test ends and its reason in notes[TRAIN_ONLY], instead of skipping it.

    Returns:
      The PreparedSeries (host arrays; see the module docstring).

    Raises:
      SeriesSkipped: if fewer than data.min_candles candles remain after the warm-up,
        if a split has no gap-free window (TrainOnly: only train has, and not
        keep_train_only), or if a normalised value is not finite.
      ValueError: a fitted_norm that does not fit.
    """
    rows = kept_rows(series, data_cfg)
    try:
        ends = _split_windows(rows, series.interval, data_cfg)
    except TrainOnly as e:
        if not keep_train_only:
            raise
        prep = with_ends(series, rows, e.ends, data_cfg, fitted_norm)
        prep.notes[split_dates.TRAIN_ONLY] = str(e)
        return prep
    return with_ends(series, rows, ends, data_cfg, fitted_norm)


@dataclasses.dataclass(frozen=True)
class KeptRows:
    """The candles of a series that windows may use: past the warm-up, newest max_candles."""

    open_time_ms: np.ndarray  # int64 [T]
    ohlcv: np.ndarray  # float64 [T, 5]
    features: np.ndarray  # float64 [T, F]: data.features
    names: tuple  # data.features
    covariates: np.ndarray  # float64 [T, K]: the covariates, filled (NaN: still missing)
    covariate_names: tuple  # columns.covariate_names: data.covariates, data.market_series


def kept_rows(series: Series, data_cfg) -> KeptRows:
    """The features of `series` and the rows windows may use (see KeptRows).

    Raises:
      SeriesSkipped: fewer than data.min_candles candles remain after the warm-up.
      CovariateError: a data.covariates column the series does not carry.
    """
    names, cov_names = tuple(data_cfg.features), columns.covariate_names(data_cfg)
    times_T, ohlcv_T5, feats_TF = _kept_rows(series, data_cfg, names)
    cov_TK = np.zeros((len(times_T), 0))
    if cov_names:  # filled on the whole series, so the warm-up's values may carry forward
        cov_TK = covariates_lib.series_columns(series, data_cfg)[len(series.ohlcv) - len(times_T) :]
    return KeptRows(times_T, ohlcv_T5, feats_TF, names, cov_TK, cov_names)


def with_ends(
    series: Series, rows: KeptRows, ends: dict, data_cfg, fitted_norm=None, name=None
) -> PreparedSeries:
    """The PreparedSeries of `rows` split by `ends`, normalised on its own train windows.

    Args:
      series: the series the rows come from (identity and notes).
      rows: `kept_rows(series, ...)`.
      ends: split name -> int64 [N_split] purged window ends into the rows.
      data_cfg: the `config.data` group. fitted_norm: see `prepare_series`.
      name: the PreparedSeries name; default the series name (a backtest fold's is
        "<SERIES>@fold<f>").

    Raises:
      SeriesSkipped: a normalised value is not finite, or the train windows' candles
        are flat (`band.NoRange`).
    """
    ohlc_TC = rows.ohlcv[:, :NUM_TARGETS]
    try:  # Every band fit (the net's start, baselines, refit) reads train: skip before training.
        band.require_range(ohlc_TC, ends["train"], data_cfg.lookback)
    except band.NoRange as e:
        raise SeriesSkipped(str(e)) from None
    fields = _normalised(rows, ends, data_cfg, fitted_norm, name or series.name)
    counts = {split: len(e) for split, e in ends.items()}
    notes = dict(series.notes, used_candles=len(ohlc_TC), windows=counts)
    if rows.covariate_names:
        L, H = data_cfg.lookback, data_cfg.horizon
        gap_free = contiguous_ends(rows.open_time_ms, INTERVAL_MS[series.interval], L, H)
        notes["covariate_skipped_windows"] = len(gap_free) - len(
            window_ends(rows, series.interval, L, H)
        )
    return PreparedSeries(
        name=name or series.name,
        symbol=series.symbol,
        interval=series.interval,
        open_time_ms=rows.open_time_ms,
        ohlc=ohlc_TC,
        ends=ends,
        notes=notes,
        **fields,
    )


# Series prepared side by side (process_pool.numpy_threads): each is its own, the same in
# any order, and mostly numpy that releases the GIL.
PREPARE_THREADS = process_pool.threads()


def prepare_all(
    series_list: list[Series],
    data_cfg,
    fitted_norms: dict | None = None,
    keep_train_only=False,
) -> tuple[list[PreparedSeries], dict]:
    """`prepare_series` for each series; one that cannot be used is skipped, not fatal.

    Args:
      series_list: validated series.
      data_cfg: the `config.data` group.
      fitted_norms: optional series name -> saved `norm` (see `prepare_series`).
      keep_train_only: keep training-data-only series (see `prepare_series`).

    Returns:
      (prepared series in input order, series name -> reason it was skipped).

    Raises:
      ConfigError: with data.split_dates, when one of its splits holds no window of any
        series (`split_dates.check_windows`).
    """

    def prepared(series):  # the PreparedSeries, or why it is skipped
        try:
            fitted = (fitted_norms or {}).get(series.name)
            return prepare_series(series, data_cfg, fitted, keep_train_only)
        except SeriesSkipped as e:
            return e

    preps, skipped, series_windows = [], {}, []
    for series, out in zip(
        series_list, process_pool.numpy_threads(prepared, series_list, PREPARE_THREADS), strict=True
    ):
        if isinstance(out, SeriesSkipped):
            skipped[series.name] = str(out)
            logging.debug("%s: skipped: %s", series.name, out)  # each series: --verbosity=1
            series_windows.append(getattr(out, "ends", {}))  # split -> ends, where they exist
        else:
            preps.append(out)
            series_windows.append(out.ends)
    for line in skip_groups.lines("skipped", skipped.items()):  # one warning per reason
        logging.warning("%s", line)
    if split_dates.bounds_ms(data_cfg) is not None:
        split_dates.check_windows(series_windows, data_cfg)
    return preps, skipped


def to_prices(prep: PreparedSeries, ends_N: np.ndarray, pred_NHC: np.ndarray) -> np.ndarray:
    """Maps normalised forecasts back to float64 prices [N, H, 4].

    Args:
      prep: the series the windows come from.
      ends_N: int [N] window end indices into prep (e.g. prep.ends["test"]).
      pred_NHC: [N, H, 4] forecasts in the normalised space `gather` produces.

    Returns:
      float64 [N, H, 4] OHLC prices; exact up to float64 (log ratios to the last close).
    """
    pred = np.asarray(pred_NHC, np.float64)
    return prep.ohlc[np.asarray(ends_N), 3][:, None, None] * np.exp(pred)
