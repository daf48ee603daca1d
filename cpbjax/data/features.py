"""Vectorised indicators (placeholder: the data helper replaces this file)."""

import numpy as np

# Feature columns whose values are prices; windows normalise them like OHLC.
PRICE_FEATURES = frozenset({"open", "high", "low", "close", "bb_upper", "bb_lower"})


def compute(ohlcv_T5: np.ndarray, names: tuple) -> tuple[np.ndarray, int]:
    """Returns (features float64 [T, F], index of the first row with no warm-up NaN)."""
    cols = {"open": 0, "high": 1, "low": 2, "close": 3, "volume": 4}
    return np.stack([ohlcv_T5[:, cols[n]] for n in names], axis=1), 0
