"""Cross-series covariates (data.market_series): a market series' return and range as
covariate columns of every series, aligned by open time.

For each symbol M of data.market_series, every series S gets two covariate columns after
its data.covariates (`columns.market_columns`), read from M's candles at S's interval:

- `<M>_return`: log(close / previous close) of M's candle that opens when S's candle
  opens; NaN on M's first candle and after a gap in M (a return over missing candles is
  no candle's own);
- `<M>_range`: log(high / low) of that candle.

Where M has no candle at S's open time (a gap in M, or before M starts), both are NaN and
data.covariate_fill's rule applies as to any covariate (cpbjax/data/covariates.py). They
come from OHLCV, so every source gives them.

M's own series, when it is in data.symbols, reads its own return and range in its own
columns: M gains no input it does not already read in its candles (it is "excluded" from
its own inputs in that sense), every series of a pooled model keeps the same K, and M is
still trained and scored. A symbol of data.market_series that is not in data.symbols is
loaded from data.source as an input only (not trained, not in results.json); one that
cannot be loaded at some interval of data.intervals is a CovariateError (exit 2).

Shapes: T candles of a series, M candles of a market series.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from cpbjax import columns
from cpbjax.data.series import INTERVAL_MS, CovariateError, Series


def candle_columns(market: Series) -> np.ndarray:
    """float64 [M, 2]: each candle's log close-to-close return (NaN after a gap and on
    the first candle) and log(high / low)."""
    high_M, low_M, close_M = market.ohlcv[:, 1], market.ohlcv[:, 2], market.ohlcv[:, 3]
    follows = np.diff(market.open_time_ms) == INTERVAL_MS[market.interval]
    return_M = np.full(len(close_M), np.nan)
    return_M[1:] = np.where(follows, np.log(close_M[1:] / close_M[:-1]), np.nan)
    return np.stack([return_M, np.log(high_M / low_M)], axis=1)


def aligned(open_time_ms: np.ndarray, market: Series) -> np.ndarray:
    """float64 [T, 2]: `candle_columns(market)` at the open times `open_time_ms` [T],
    NaN where the market has no candle opening then."""
    values_M2 = candle_columns(market)
    at_T = np.searchsorted(market.open_time_ms, open_time_ms)
    safe_T = np.minimum(at_T, len(market.open_time_ms) - 1)
    found_T = market.open_time_ms[safe_T] == open_time_ms
    return np.where(found_T[:, None], values_M2[safe_T], np.nan)


def with_market_columns(series: list[Series], skipped: dict, data_cfg, load) -> list[Series]:
    """`series` with the data.market_series columns after their covariates.

    Args:
      series: the loaded series. skipped: series name -> skip reason (load_all's).
      data_cfg: the `data` config group.
      load: the source's loader `(data_cfg, pairs) -> (loaded, skipped)`, for the market
        pairs that are not in `series`.

    Raises:
      CovariateError: a market series that cannot be loaded at one of data.intervals.
    """
    symbols = tuple(data_cfg.market_series)
    if not symbols:
        return series
    markets = _markets(series, skipped, data_cfg, load)
    names = columns.market_columns(symbols)
    out = []
    for s in series:
        cols = [aligned(s.open_time_ms, markets[f"{m}-{s.interval}"]) for m in symbols]
        cov_TK = np.concatenate([s.covariates, *cols], axis=1)
        out.append(
            dataclasses.replace(s, covariates=cov_TK, covariate_names=(*s.covariate_names, *names))
        )
    return out


def _markets(series: list[Series], skipped: dict, data_cfg, load) -> dict[str, Series]:
    """Series name -> the market series of data.market_series x data.intervals: those in
    `series`, the others loaded as inputs only (without data.covariates, which they do
    not need)."""
    have = {s.name: s for s in series}
    pairs = [(m, i) for m in data_cfg.market_series for i in data_cfg.intervals]
    missing = [(m, i) for m, i in pairs if f"{m}-{i}" not in have and f"{m}-{i}" not in skipped]
    reasons = dict(skipped)
    if missing:
        inputs_cfg = data_cfg.copy_and_resolve_references()
        inputs_cfg.covariates = ()
        loaded, not_loaded = load(inputs_cfg, missing)
        have.update(loaded)
        reasons.update(not_loaded)
        for name in loaded:
            logging.info("data.market_series: %s loaded as an input only (not trained)", name)
    for m, i in pairs:
        if f"{m}-{i}" not in have:
            why = reasons.get(f"{m}-{i}", "the source returned nothing")
            raise CovariateError(
                f"data.market_series {m!r}: no {m}-{i} candles from data.source="
                f"{data_cfg.source!r} ({why}); every series at {i} reads its columns"
            )
    return {f"{m}-{i}": have[f"{m}-{i}"] for m, i in pairs}
