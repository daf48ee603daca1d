"""A user's own candle files (data.source="local"): CSV or Parquet of one series each,
read into the raw arrays that `parsing.build_series` validates like every source's.

Column names ignore case; a time column of epoch ms, epoch us or ISO strings; OHLCV and
the named data.covariates columns; every problem named with the file, column and row.
Also the column checks that candles given as a frame share (frames.py).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from cpbjax.data.parsing import OHLCV, KlineError, epoch_to_ms, sort_dedupe
from cpbjax.data.series import CovariateError

# Time column names accepted by local files, in order of preference (lower case).
TIME_COLUMNS = ("open_time", "timestamp", "date", "datetime", "time")


def read_local_file(path: str, covariates=(), series: str | None = None):
    """Reads a user's CSV or Parquet file of one series.

    Column names are case-insensitive: a time column (one of TIME_COLUMNS, as epoch
    ms, epoch us or ISO strings; naive times are UTC), open, high, low, close, volume,
    and the named `covariates` (data.covariates); every other column is ignored.

    Returns:
      (open_time_ms int64 [N], values float64 [N, 5 + K]): OHLCV, then the K covariates
      in the order named (NaN where empty); sorted, exact duplicate rows dropped.
    Raises:
      KlineError: unreadable file, missing columns or bad values, naming the file.
      CovariateError: a named covariate column that is absent or not numeric, naming
        `series` (default the file name) and the column.
    """
    name = os.path.basename(path)
    try:
        frame = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise KlineError(f"{name}: cannot read ({e})") from e
    original = list(frame.columns)
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    time_col = next((c for c in TIME_COLUMNS if c in frame.columns), None)
    wanted = [c.lower() for c in covariates]
    twice = columns_twice(original, (*OHLCV, time_col, *wanted))
    if twice:
        raise KlineError(
            f"{name}: columns {sorted(twice)} appear more than once (case-insensitive: "
            f"{', '.join(repr(c) for c in sum(twice.values(), []))})"
        )
    missing = [c for c in OHLCV if c not in frame.columns]
    if time_col is None or missing:
        raise KlineError(
            f"{name}: needs a time column (one of {', '.join(TIME_COLUMNS)}) and "
            f"{', '.join(OHLCV)}; missing {missing or 'the time column'}"
        )
    values = ohlcv_floats(frame, name)
    if covariates:
        cov_NK = covariate_floats(frame, covariates, f"{series or name} ({name})")
        values = np.concatenate([values, cov_NK], axis=1)
    return sort_dedupe(times_to_ms(frame[time_col], name), values, name)


def covariate_floats(frame: pd.DataFrame, covariates, where: str) -> np.ndarray:
    """The named covariate columns of `frame` (lower-case names) as float64 [N, K].

    Raises:
      CovariateError: a column that is absent, or holds a value that is not a number
        (empty cells are NaN, which data.covariate_fill handles), naming `where` and it.
    """
    out = []
    for col in covariates:
        if col.lower() not in frame.columns:
            raise CovariateError(
                f"{where}: data.covariates column {col!r} is absent (columns: "
                f"{', '.join(map(str, frame.columns))})"
            )
        values = frame[col.lower()]
        numbers = pd.to_numeric(values, errors="coerce")
        bad = (numbers.isna() & values.notna()).to_numpy()
        if bad.any() or pd.api.types.is_bool_dtype(values):
            row = int(bad.argmax())
            raise CovariateError(
                f"{where}: data.covariates column {col!r} is not numeric: it holds "
                f"{values.iloc[row]!r} (row {row})"
            )
        out.append(numbers.to_numpy(np.float64))
    return np.stack(out, axis=1)


def columns_twice(columns, wanted) -> dict[str, list]:
    """{lower-case name: the columns it matches} of each wanted name matched twice or more.

    "Open" and "open" both match "open": picking one would be a guess, and taking both
    would give six OHLCV columns.
    """
    matches = {}
    for c in columns:
        matches.setdefault(str(c).strip().lower(), []).append(c)
    return {w: matches[w] for w in wanted if w is not None and len(matches.get(w, [])) > 1}


def ohlcv_floats(frame: pd.DataFrame, name: str) -> np.ndarray:
    """The open..volume columns of `frame` (lower-case names) as float64 [N, 5].

    Raises:
      KlineError: naming the column, the first value that is not a number, and its row.
    """
    try:
        return frame[list(OHLCV)].to_numpy(np.float64)
    except (TypeError, ValueError):
        pass  # find the value to name
    for col in OHLCV:
        values = frame[col]
        bad = (pd.to_numeric(values, errors="coerce").isna() & values.notna()).to_numpy()
        if bad.any():
            row = int(bad.argmax())
            raise KlineError(
                f"{name}: column {col!r} holds {values.iloc[row]!r} (row {row}, index "
                f"{values.index[row]}), which is not a number"
            )
    raise KlineError(f"{name}: the OHLCV columns do not convert to numbers")


def times_to_ms(column: pd.Series, name: str) -> np.ndarray:
    """A time column (datetime, epoch ms/us numbers, or ISO strings) as epoch ms."""
    if pd.api.types.is_numeric_dtype(column):
        if column.isna().any() or not np.array_equal(column, np.floor(column)):
            raise KlineError(f"{name}: time column has missing or fractional epoch values")
        # A float beyond int64 would cast to garbage instead of failing.
        if (column.abs() >= 2.0**63).any():
            raise KlineError(f"{name}: time column has epoch values beyond 64 bits")
        return epoch_to_ms(column.to_numpy(np.int64), name)
    # pandas keeps integers beyond int64 as Python ints in an object column.
    if pd.api.types.infer_dtype(column, skipna=True) in ("integer", "mixed-integer-float"):
        raise KlineError(f"{name}: time column has epoch values beyond 64 bits")
    try:
        stamps = pd.to_datetime(column, utc=True, format="ISO8601")
    except (ValueError, TypeError, OverflowError) as e:
        raise KlineError(f"{name}: time column is neither epoch numbers nor ISO times") from e
    if stamps.isna().any():
        raise KlineError(f"{name}: time column has missing values")
    return epoch_to_ms(stamps.dt.as_unit("ms").astype(np.int64).to_numpy(), name)
