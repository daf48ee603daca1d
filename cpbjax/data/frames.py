"""Candles given as a pandas frame or as JSON records (cpbjax.fit, Model.predict, serve's
POST /forecast): checked and turned into a `Series`, every problem named in one message.

A frame is indexed by timezone-aware UTC open times and has the columns open, high, low,
close and volume (names ignore case; volume may be left out where no feature of
data.features reads it), plus any data.covariates columns (NaN where missing: the
data.covariate_fill rule handles them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cpbjax.data import features, local_files, parsing
from cpbjax.data.series import INTERVAL_MS, Series


def candles_interval(candles) -> str:
    """The interval of `candles` (a DataFrame indexed by open times): the spacing most of
    its neighbouring candles have (gaps aside). ValueError if it is no interval."""
    index = getattr(candles, "index", None)
    if not isinstance(index, pd.DatetimeIndex) or len(index) < 2:
        raise ValueError("candles need a DatetimeIndex of at least 2 open times")
    steps, counts = np.unique(np.diff(index.as_unit("ms").asi8), return_counts=True)
    step = int(steps[np.argmax(counts)])
    named = [name for name, ms in INTERVAL_MS.items() if ms == step]
    if not named:
        raise ValueError(
            f"candles are {pd.Timedelta(step, 'ms')} apart: no interval of {list(INTERVAL_MS)}"
        )
    return named[0]


def check_frame(candles, interval: str, volume_read_by) -> pd.DataFrame:
    """The OHLCV columns of `candles`, lower-cased, after the checks that name a problem;
    `volume_read_by`: the features that read the volume (none: a volume of 0 stands in)."""
    if not isinstance(candles, pd.DataFrame):
        raise TypeError(f"candles must be a pandas DataFrame, not {type(candles).__name__}")
    twice = local_files.columns_twice(candles.columns, parsing.OHLCV)
    if twice:
        both = " and ".join(repr(c) for c in sum(twice.values(), []))
        raise ValueError(f"candles have {both}: one column each, please (names ignore case)")
    frame = candles.rename(columns=str.lower)
    needed = parsing.OHLCV if volume_read_by else parsing.OHLCV[:4]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        why = f"; data.features {list(volume_read_by)} read volume" if volume_read_by else ""
        raise ValueError(f"candles lack the columns {missing} (need {list(needed)}{why})")
    if "volume" not in frame.columns:  # no feature reads it
        frame = frame.assign(volume=0.0)
    index = frame.index
    if not isinstance(index, pd.DatetimeIndex) or index.tz is None:
        raise ValueError("candles need a timezone-aware UTC DatetimeIndex of open times")
    if not index.is_monotonic_increasing or index.has_duplicates:
        raise ValueError("candle open times must be strictly increasing (sorted, no repeats)")
    nan = frame[list(parsing.OHLCV)].isna().any(axis=1)
    if nan.any():
        raise ValueError(f"candles hold NaN, first at {index[nan.to_numpy()][0]}")
    step = np.diff(index.tz_convert("UTC").as_unit("ms").asi8)
    if len(step) and (step != INTERVAL_MS[interval]).all():  # not one pair at the interval
        raise ValueError(
            f"candles are {pd.Timedelta(int(np.median(step)), 'ms')} apart, but the model "
            f"forecasts {interval} candles"
        )
    return frame


def volume_features(data_cfg) -> list[str]:
    """The features of data_cfg.features that read the volume."""
    return [f for f in data_cfg.features if f in features.VOLUME_FEATURES]


def candles_to_series(
    candles: pd.DataFrame, symbol: str, interval: str, volume_read_by, covariate_names=()
) -> Series:
    """A validated Series from an OHLCV DataFrame (see the module docstring).

    `volume_read_by`: the features that read the volume (`volume_features`); with none,
    a frame may leave the volume out. `covariate_names`: data.covariates, columns kept
    (case-insensitive; NaN allowed: data.covariate_fill handles it).

    Raises:
      ValueError, TypeError: naming the problem (columns, index, NaN, interval, an
        invalid candle; a covariate column absent or not numeric: CovariateError).
    """
    frame = check_frame(candles, interval, volume_read_by)
    times = frame.index.tz_convert("UTC").as_unit("ms").asi8
    ohlcv = local_files.ohlcv_floats(frame, "candles")  # a KlineError is a ValueError
    for rule, bad in parsing.invalid_rows(times, ohlcv, INTERVAL_MS[interval]).items():
        if bad.any():
            raise ValueError(f"invalid candle ({rule}) at {parsing.iso(times[bad][0])}")
    series = Series(symbol, interval, times.astype(np.int64), ohlcv)
    if covariate_names:
        twice = local_files.columns_twice(candles.columns, [c.lower() for c in covariate_names])
        if twice:
            raise ValueError(f"candles have the covariate columns {twice} more than once")
        cov_TK = local_files.covariate_floats(frame, covariate_names, "candles")
        series.covariates, series.covariate_names = cov_TK, tuple(covariate_names)
    return series


ECHO_CHARS = 40  # of a bad name or value echoed in a message


def records_frame(records) -> pd.DataFrame:
    """The candle frame of JSON records (serve's POST body's "candles"): a list of
    objects, each with "open_time" (epoch milliseconds, or ISO-8601 text, UTC unless it
    names a zone; the same kind in every record) and number or null fields (null and absent are NaN).

    Raises:
      ValueError: naming the first record that is not an object, lacks open_time, or
        holds a value that is not a number.
    """
    if not isinstance(records, list) or not records:
        raise ValueError('"candles" must be a non-empty list of objects')
    for i, record in enumerate(records):
        if not isinstance(record, dict) or "open_time" not in record:
            raise ValueError(f'candles[{i}] is not an object with an "open_time"')
        for key, value in record.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if key != "open_time" and value is not None and not number:
                raise ValueError(
                    f"candles[{i}][{_cut(key)}] is {_cut(value)}: "
                    "candle fields are numbers (or null)"
                )
    index = _open_times([r["open_time"] for r in records])
    rows = [{k: v for k, v in r.items() if k != "open_time"} for r in records]
    return pd.DataFrame(rows, index=index, dtype=np.float64)


def _open_times(values: list) -> pd.DatetimeIndex:
    """UTC open times of JSON values: all epoch milliseconds or all ISO-8601 texts."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        how = {"unit": "ms"}
    elif all(isinstance(v, str) for v in values):
        how = {"format": "ISO8601"}
    else:
        raise ValueError("every open_time must be epoch milliseconds, or every one ISO-8601 text")
    try:
        return pd.DatetimeIndex(pd.to_datetime(values, utc=True, **how), name="open_time")
    except (ValueError, OverflowError) as e:  # pandas' OutOfBoundsDatetime is a ValueError
        raise ValueError(f"an open_time is not a time: {_cut(str(e))}") from None


def _cut(value) -> str:
    """repr(value) cut to ECHO_CHARS characters."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else text[:ECHO_CHARS] + "..."
