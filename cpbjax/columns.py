"""The forecast's target columns and which feature columns are prices: the names that data,
models and scoring all read, kept in a leaf so that none of them imports another for them."""

from __future__ import annotations

import numpy as np

COLUMNS = ("open", "high", "low", "close")  # the C target columns, in this order
OPEN, HIGH, LOW, CLOSE = range(len(COLUMNS))  # their indices, in targets and in OHLC inputs
NUM_TARGETS = len(COLUMNS)
# Feature columns whose values are prices; windows normalise them like OHLC.
PRICE_FEATURES = frozenset({"open", "high", "low", "close", "bb_upper", "bb_lower"})


def input_names(data_cfg) -> tuple:
    """The F input columns of a window: data.features, then data.covariates."""
    return (*data_cfg.features, *data_cfg.covariates)


def price_mask(names) -> np.ndarray:
    """float32 [F]: 1 on the feature columns whose values are prices."""
    return np.array([n in PRICE_FEATURES for n in names], np.float32)
