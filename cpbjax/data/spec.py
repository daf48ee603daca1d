"""`DataSpec`: what training, scoring and the report read of config.data, frozen.

A mode builds it once (`make_spec(config.data)`) and hands it down, so the padded
shapes of a group (cpbjax/data/stacking.py), the compiled epoch (cpbjax/training/group.py)
and the report's data facts never see the mutable ConfigDict. Its fields are named as
config.data's, so the helpers that take the data group read a DataSpec alike.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSpec:
    """The config.data fields read below the modes (see base_config for each)."""

    source: str  # binance | local | synthetic
    symbols: tuple  # the run's symbols, in config order (a coin's key is its position)
    intervals: tuple  # kline intervals, e.g. ("15m", "1h")
    base_url: str  # the binance host or mirror (the report's data facts)
    local_dir: str  # the `local` source's folder
    months: int  # newest monthly files per series; 0 = all
    end: str  # last month used, YYYY-MM; "" = the last complete month
    max_candles: int  # newest candles kept per series; 0 = all (the default padded T)
    synthetic_candles: int  # the `synthetic` source's candles per series
    features: tuple  # F input column names
    covariates: tuple  # past covariate columns, read after the features
    market_series: tuple  # symbols whose return and range columns follow them
    lookback: int  # L
    horizon: int  # H
    splits: tuple  # (train, val, test) fractions
    split_dates: tuple  # (VAL_START, TEST_START) or () for fractional splits
    normalization: str  # last_close (the one value left: the report and meta.json name it)


def make_spec(data_cfg) -> DataSpec:
    """The DataSpec of a run's config.data group."""
    return DataSpec(**{f.name: data_cfg[f.name] for f in dataclasses.fields(DataSpec)})
