"""Past covariates: the covariate columns of a series, filled, checked and scaled.

The K columns are data.covariates, then data.market_series' columns
(cpbjax/data/market.py; `columns.covariate_names`).

A Series carries its covariates row for row with its candles (float64 [T, K], NaN where
missing; cpbjax/data/series.py). Windows read them after the features, over the same
data.lookback candles as the prices, so nothing after a window's last candle is read
(cpbjax/data/windows.py; docs/design.md "Covariates"). Here:

- fill: a NaN takes the last value at most data.covariate_fill candles of the interval
  before it (by open time, so a gap counts its missing candles); never 0;
- complete_ends: a window whose lookback still holds a NaN is skipped;
- latest: a forecast's covariates, the newest window's all present;
- scaled: data.covariate_scaling=zscore with the train candles' mean and std, or none;
  a column with no two different values on train is a CovariateError.

Shapes: T candles, K covariates, N windows.
"""

from __future__ import annotations

import numpy as np

from cpbjax import columns
from cpbjax.data.parsing import iso
from cpbjax.data.series import INTERVAL_MS, CovariateError, Series, SeriesSkipped


def series_columns(series: Series, data_cfg) -> np.ndarray:
    """float64 [T, K]: the covariate columns of `series`, filled (`fill`).

    Raises:
      CovariateError: the series does not carry a named column (a source that has none,
        or a frame without the data.market_series columns that load_all adds).
    """
    names = columns.covariate_names(data_cfg)
    if tuple(series.covariate_names) != names:
        missing = [n for n in names if n not in series.covariate_names]
        market = set(columns.market_columns(data_cfg.market_series))
        if missing and missing[0] in market:
            raise CovariateError(
                f"{series.name}: the model reads data.market_series="
                f"{tuple(data_cfg.market_series)}, whose candles a frame does not carry: "
                "forecast with --mode predict or serve's GET, which load them from the run's data "
                "source"
            )
        raise CovariateError(
            f"{series.name}: data.covariates column {missing[0] if missing else names!r} is "
            f"absent: the series carries {list(series.covariate_names)} (covariates need "
            "data.source=local or cpbjax.fit frames)"
        )
    step = INTERVAL_MS[series.interval]
    return fill(series.covariates, series.open_time_ms, step, data_cfg.covariate_fill)


def fill(cov_TK: np.ndarray, open_time_ms: np.ndarray, step_ms: int, limit: int) -> np.ndarray:
    """`cov_TK` with each NaN replaced by the column's last value at most `limit` candles
    (limit * step_ms of open time) before it; a NaN with none stays NaN."""
    t_T = np.arange(len(cov_TK))[:, None]
    # last_TK[t, k]: the newest row <= t where column k has a value, -1 where none has.
    last_TK = np.maximum.accumulate(np.where(np.isnan(cov_TK), -1, t_T), axis=0)
    found = last_TK >= 0
    src_TK = np.where(found, last_TK, 0)
    age_TK = open_time_ms[:, None] - open_time_ms[src_TK]
    ok = found & (age_TK <= limit * step_ms)
    values = np.take_along_axis(cov_TK, src_TK, axis=0)
    return np.where(ok, values, np.nan)


def complete_ends(ends_N: np.ndarray, missing_T: np.ndarray, lookback: int) -> np.ndarray:
    """The window ends t of `ends_N` whose lookback rows t-L+1..t hold every covariate
    (`missing_T`: bool [T], True on a row where some covariate is NaN)."""
    # cum[i]: the rows with a covariate missing before row i.
    cum = np.concatenate([[0], np.cumsum(np.asarray(missing_T, np.int64))])
    ends_N = np.asarray(ends_N, np.int64)
    return ends_N[cum[ends_N + 1] == cum[ends_N + 1 - lookback]]


def scaled(cov_TK: np.ndarray, n_train: int, data_cfg, fitted: dict | None, where: str):
    """(scaled float64 [T, K], norm entries) of the filled covariates.

    zscore: (x - mean) / std with the first `n_train` candles' (the train candles')
    statistics over the values present, or a saved model's (`fitted`); none: x as given
    (mean 0, std 1 saved). A row still NaN is read by no kept window (complete_ends); it
    holds the column's mean there (0 after scaling) only so that a padded, masked window
    slot computes finite numbers.

    Raises:
      CovariateError: fitting, a column with fewer than two different values on train,
        naming `where` (the series) and the column.
    """
    names = columns.covariate_names(data_cfg)
    if fitted is None:
        mu_K, sd_K = _train_stats(cov_TK[:n_train], names, where)
        if data_cfg.covariate_scaling == "none":
            mu_K, sd_K = np.zeros_like(mu_K), np.ones_like(sd_K)
    else:
        mu_K = np.asarray(fitted["covariate_mean"], np.float64)
        sd_K = np.asarray(fitted["covariate_std"], np.float64)
        if mu_K.shape != (len(names),) or sd_K.shape != (len(names),) or not (sd_K > 0).all():
            raise ValueError(f"saved covariate_mean/covariate_std do not fit {names}")
    out_TK = (np.where(np.isnan(cov_TK), mu_K, cov_TK) - mu_K) / sd_K
    norm = {"covariates": names, "covariate_mean": mu_K, "covariate_std": sd_K}
    return out_TK, {**norm, "covariate_scaling": data_cfg.covariate_scaling}


def _train_stats(train_NK: np.ndarray, names, where: str):
    """(mean, population std) float64 [K] of the values present on train."""
    for k, name in enumerate(names):
        present = train_NK[:, k][~np.isnan(train_NK[:, k])]
        if len(present) == 0 or present.min() == present.max():
            held = f"only {present[0]!r}" if len(present) else "no value"
            raise CovariateError(
                f"{where}: data.covariates column {name!r} is constant on the train split "
                f"({held} in its {len(train_NK)} train candles): it cannot inform the model"
            )
    return np.nanmean(train_NK, axis=0), np.nanstd(train_NK, axis=0)


def latest(series: Series, data_cfg, start: int, fitted_norm: dict | None):
    """The covariates of a forecast's candles, rows start.. of `series`
    (latest.prepare_latest): (scaled float64 [T', K], norm entries, bool [T'] rows with a
    covariate missing after `fill`).

    Scaled with the model's saved statistics (`fitted_norm`, never re-fitted); None (a
    pooled run's model on a series it never saw, zero_shot.py): fitted on these candles,
    as that series' feature statistics are.

    Raises:
      CovariateError: the series lacks a named column (`series_columns`).
      SeriesSkipped: a covariate still missing in the newest data.lookback candles,
        naming the column and the open time.
    """
    names, lookback = columns.covariate_names(data_cfg), data_cfg.lookback
    cov_TK = series_columns(series, data_cfg)[start:]
    missing_LK = np.isnan(cov_TK[-lookback:])
    if missing_LK.any():
        row, k = np.argwhere(missing_LK)[-1]  # the newest missing value
        open_ms = series.open_time_ms[start:][len(cov_TK) - lookback + row]
        raise SeriesSkipped(
            f"data.covariates column {names[k]!r} has no value at {iso(int(open_ms))}, in "
            f"the newest data.lookback={lookback} candles a forecast reads (a NaN is carried "
            f"forward at most data.covariate_fill={data_cfg.covariate_fill} candles)"
        )
    if fitted_norm is not None and tuple(fitted_norm["covariates"]) != names:
        raise ValueError(f"saved covariates {fitted_norm['covariates']} are not {names}")
    scaled_TK, norm = scaled(cov_TK, len(cov_TK), data_cfg, fitted_norm, series.name)
    return scaled_TK, norm, np.isnan(cov_TK).any(axis=1)
