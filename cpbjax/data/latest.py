"""A forecast's input: the newest candles of one series, normalised with the statistics
the model was trained with (no splits, no windows), and its one newest window.

Training and scoring prepare whole series (cpbjax/data/windows.py); a forecast needs only
the last L candles past the indicator warm-up, so it has its own path here.
Shapes: T candles, F features (then the K covariates), L lookback.
"""

from __future__ import annotations

import numpy as np

from cpbjax import columns
from cpbjax.columns import NUM_TARGETS
from cpbjax.data import covariates as covariates_lib
from cpbjax.data import features as features_lib
from cpbjax.data import normalize
from cpbjax.data.series import INTERVAL_MS, Series, SeriesSkipped
from cpbjax.data.split_dates import SPLITS
from cpbjax.data.windows import COVARIATE_MISSING, PreparedSeries, newest_start, series_features


def _check_past_warmup(series: Series, names, past: int, warmup_rows: int, lookback: int):
    """Raises SeriesSkipped when fewer than `lookback` candles are left past the warm-up."""
    if past >= lookback:
        return
    warmup = features_lib.warmup_candles(names, series.interval)
    raise SeriesSkipped(
        f"only {past} candles past the {warmup_rows} of indicator warm-up; a forecast needs "
        f"data.lookback={lookback} past the warm-up of data.features ({warmup + lookback} "
        f"candles of {series.interval} in all)"
    )


def prepare_latest(series: Series, data_cfg, fitted_norm: dict | None) -> PreparedSeries:
    """The newest candles of one series, normalised for a forecast: no splits, no windows.

    A forecast needs only the last L candles past the indicator warm-up
    (`features.warmup_candles`: up to a month of candles), normalised with
    the statistics the model was trained with, so neither data.min_candles nor a
    train/val/test split applies (`ends` are empty). A model saved without its statistics
    (by an earlier cpbjax: fitted_norm None) gets them re-fitted on the candles given.

    Raises:
      SeriesSkipped: fewer than data.lookback candles past the warm-up, a normalised
        value that is not finite, or a covariate missing in the newest window
        (covariates.latest: the K data.covariates columns follow the F features, scaled
        with the saved statistics).
      CovariateError: the series lacks a data.covariates column.
    """
    names, lookback = tuple(data_cfg.features), data_cfg.lookback
    if fitted_norm is not None and "feature_mean" not in fitted_norm:
        fitted_norm = None  # an earlier cpbjax's norm without the fitted statistics
    feats_TF, first_valid = series_features(series, names)
    start = newest_start(len(series.ohlcv), first_valid, data_cfg.max_candles)
    _check_past_warmup(series, names, len(series.ohlcv) - start, first_valid, lookback)
    ohlc_TC = series.ohlcv[start:, :NUM_TARGETS]
    inputs_TF, targets_TC, anchor_T, norm = normalize.normalise(
        ohlc_TC, feats_TF[start:], names, len(ohlc_TC), data_cfg.normalization, fitted_norm
    )
    normalize.check_finite(inputs_TF, names)
    notes = dict(series.notes, used_candles=len(ohlc_TC))
    if cov_names := columns.covariate_names(data_cfg):  # after the features: [T, F + K]
        cov_TK, cov_norm, missing_T = covariates_lib.latest(series, data_cfg, start, fitted_norm)
        inputs_TF, norm = np.concatenate([inputs_TF, cov_TK], axis=1), {**norm, **cov_norm}
        names, notes[COVARIATE_MISSING] = (*names, *cov_names), missing_T
    return PreparedSeries(
        name=series.name,
        symbol=series.symbol,
        interval=series.interval,
        open_time_ms=series.open_time_ms[start:],
        ohlc=ohlc_TC,
        inputs=inputs_TF.astype(np.float32),
        targets=targets_TC.astype(np.float32),
        anchor=anchor_T.astype(np.float32),
        ends={split: np.zeros(0, np.int64) for split in SPLITS},
        norm=norm,
        price_mask=columns.price_mask(names),
        notes=notes,
    )


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
