"""The forecast's target columns and which feature columns are prices: the names that data,
models and scoring all read, kept in a leaf so that none of them imports another for them."""

from __future__ import annotations

import numpy as np

COLUMNS = ("open", "high", "low", "close")  # the C target columns, in this order
OPEN, HIGH, LOW, CLOSE = range(len(COLUMNS))  # their indices, in targets and in OHLC inputs
NUM_TARGETS = len(COLUMNS)
# Feature columns whose values are prices; windows normalise them like OHLC.
PRICE_FEATURES = frozenset({"open", "high", "low", "close", "bb_upper", "bb_lower"})


# The two columns data.market_series adds per symbol (cpbjax/data/market.py).
MARKET_SUFFIXES = ("_return", "_range")


def market_columns(symbols) -> tuple:
    """The covariate columns of the market series `symbols`: <SYM>_return, <SYM>_range each."""
    return tuple(f"{s}{suffix}" for s in symbols for suffix in MARKET_SUFFIXES)


def covariate_names(data_cfg) -> tuple:
    """The K covariate columns of a window: data.covariates, then data.market_series'
    columns (a config saved before market_series has none)."""
    return (*data_cfg.covariates, *market_columns(getattr(data_cfg, "market_series", ())))


def input_names(data_cfg) -> tuple:
    """The F input columns of a window: data.features, then the covariates."""
    return (*data_cfg.features, *covariate_names(data_cfg))


def price_mask(names) -> np.ndarray:
    """float32 [F]: 1 on the feature columns whose values are prices."""
    return np.array([n in PRICE_FEATURES for n in names], np.float32)
