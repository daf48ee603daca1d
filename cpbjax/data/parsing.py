"""Kline parsing (Binance CSV zips, local CSV/Parquet) and validation of one series.

Every source funnels its raw candles through `build_series`, so the rules are the
same everywhere: rows sorted, exact duplicates dropped, conflicting duplicates an
error, invalid candles skipped or dropped per `data.bad_rows`, gaps counted and
never filled, and too-short series skipped with their reason.
"""

from __future__ import annotations

import datetime
import io
import os
import zipfile

import numpy as np
import pandas as pd

from cpbjax.data.series import INTERVAL_MS, Series, SeriesSkipped

OHLCV = ("open", "high", "low", "close", "volume")
# Epoch values above this are microseconds: 1e14 us is 1973, 1e14 ms is year 5138.
_US_THRESHOLD = 1e14
# Time column names accepted by local files, in order of preference (lower case).
TIME_COLUMNS = ("open_time", "timestamp", "date", "datetime", "time")


class KlineError(ValueError):
    """A file that cannot be read as klines; the message names the file."""


def iso(ms: int) -> str:
    """Epoch milliseconds as an ISO UTC string, e.g. 2024-03-05T10:00:00Z."""
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_to_ms(raw: np.ndarray, name: str) -> np.ndarray:
    """Converts epoch ms or us (detected from the magnitude, one unit per file) to ms.

    Raises:
      KlineError: if the file mixes ms and us values.
    """
    raw = np.asarray(raw, np.int64)
    is_us = raw > _US_THRESHOLD
    if is_us.all():
        return raw // 1000
    if is_us.any():
        raise KlineError(f"{name}: open_time mixes milliseconds and microseconds in one file")
    return raw


def read_kline_csv(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Parses a Binance kline CSV (12 columns, headerless or with a header row).

    Args:
      data: the CSV bytes.
      name: the file name, used in error messages.
    Returns:
      (open_time_ms int64 [N], ohlcv float64 [N, 5]), sorted, exact duplicates dropped.
    Raises:
      KlineError: unreadable values, too few columns, mixed time units, or two
        different rows with the same open_time.
    """
    first_field = data[: data.find(b",")].strip().strip(b'"').lstrip(b"\xef\xbb\xbf")
    header = not first_field.lstrip(b"-").isdigit()
    dtypes = {0: np.int64, **{j: np.float64 for j in range(1, 6)}}
    try:
        frame = pd.read_csv(
            io.BytesIO(data),
            header=None,
            skiprows=int(header),
            usecols=range(6),
            dtype=dtypes,
            engine="c",
        )
    except (ValueError, pd.errors.ParserError) as e:
        raise KlineError(f"{name}: not a 12-column kline CSV ({e})") from e
    times = epoch_to_ms(frame[0].to_numpy(), name)
    return sort_dedupe(times, frame.iloc[:, 1:6].to_numpy(np.float64), name)


def read_kline_zip(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Parses the single CSV inside a Binance Vision zip; see `read_kline_csv`.

    Raises:
      KlineError: not a zip, no CSV member, or a bad CSV.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = [m for m in z.namelist() if m.lower().endswith(".csv")]
            if len(members) != 1:
                raise KlineError(f"{name}: expected one CSV inside, found {members}")
            csv = z.read(members[0])
    except zipfile.BadZipFile as e:
        raise KlineError(f"{name}: not a valid zip ({e})") from e
    return read_kline_csv(csv, name)


def sort_dedupe(times: np.ndarray, ohlcv: np.ndarray, name: str):
    """Sorts rows by time and drops exact duplicates.

    Raises:
      KlineError: two different rows share an open_time.
    """
    order = np.argsort(times, kind="stable")
    times, ohlcv = times[order], ohlcv[order]
    same_time = np.flatnonzero(times[1:] == times[:-1])
    if len(same_time) == 0:
        return times, ohlcv
    # NaN != NaN, so compare bit patterns: identical rows, NaNs included, are duplicates.
    same_row = (ohlcv[same_time].view(np.int64) == ohlcv[same_time + 1].view(np.int64)).all(1)
    if not same_row.all():
        first = times[same_time[~same_row][0]]
        count = int((~same_row).sum())
        raise KlineError(f"{name}: {count} open_time(s) with different rows, first at {iso(first)}")
    keep = np.ones(len(times), bool)
    keep[same_time + 1] = False
    return times[keep], ohlcv[keep]


def read_local_file(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Reads a user's CSV or Parquet file of one series.

    Column names are case-insensitive: a time column (one of TIME_COLUMNS, as epoch
    ms, epoch us or ISO strings; naive times are UTC) and open, high, low, close,
    volume.

    Returns:
      (open_time_ms int64 [N], ohlcv float64 [N, 5]), sorted, exact duplicates dropped.
    Raises:
      KlineError: unreadable file, missing columns or bad values, naming the file.
    """
    name = os.path.basename(path)
    try:
        frame = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise KlineError(f"{name}: cannot read ({e})") from e
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    time_col = next((c for c in TIME_COLUMNS if c in frame.columns), None)
    missing = [c for c in OHLCV if c not in frame.columns]
    if time_col is None or missing:
        raise KlineError(
            f"{name}: needs a time column (one of {', '.join(TIME_COLUMNS)}) and "
            f"{', '.join(OHLCV)}; missing {missing or 'the time column'}"
        )
    try:
        ohlcv = frame[list(OHLCV)].to_numpy(np.float64)
    except ValueError as e:
        raise KlineError(f"{name}: non-numeric OHLCV values ({e})") from e
    return sort_dedupe(_times_to_ms(frame[time_col], name), ohlcv, name)


def _times_to_ms(column: pd.Series, name: str) -> np.ndarray:
    """A time column (datetime, epoch ms/us numbers, or ISO strings) as epoch ms."""
    if pd.api.types.is_numeric_dtype(column):
        if column.isna().any() or not np.array_equal(column, np.floor(column)):
            raise KlineError(f"{name}: time column has missing or fractional epoch values")
        return epoch_to_ms(column.to_numpy(np.int64), name)
    try:
        stamps = pd.to_datetime(column, utc=True, format="ISO8601")
    except (ValueError, TypeError) as e:
        raise KlineError(f"{name}: time column is neither epoch numbers nor ISO times") from e
    if stamps.isna().any():
        raise KlineError(f"{name}: time column has missing values")
    return stamps.dt.as_unit("ms").astype(np.int64).to_numpy()


def invalid_rows(times: np.ndarray, ohlcv: np.ndarray, step_ms: int) -> dict[str, np.ndarray]:
    """Bool masks [N] of the candles each validation rule rejects, by rule description."""
    o, h, low, c, v = ohlcv.T
    prices = ohlcv[:, :4]
    with np.errstate(invalid="ignore"):
        return {
            "non-positive or non-finite price": ~(np.isfinite(prices) & (prices > 0)).all(1),
            "negative or non-finite volume": ~(np.isfinite(v) & (v >= 0)),
            "high below max(open, close)": h < np.maximum(o, c),
            "low above min(open, close)": low > np.minimum(o, c),
            "open_time off the interval grid": times % step_ms != 0,
        }


def months_of(times: np.ndarray) -> list[str]:
    """The distinct UTC months (YYYY-MM) of sorted epoch-ms times."""
    months = np.unique(times.astype("datetime64[ms]").astype("datetime64[M]"))
    return [str(m) for m in months]


def gap_stats(times: np.ndarray, step_ms: int) -> tuple[int, int]:
    """(missing candles in total, longest run of missing candles) between sorted times."""
    missing = np.diff(times) // step_ms - 1
    missing = missing[missing > 0]
    return int(missing.sum()), int(missing.max()) if len(missing) else 0


def build_series(symbol: str, interval: str, parts, data_cfg, notes: dict | None = None):
    """Merges parsed files of one series, validates them and returns the Series.

    All validated candles are kept (windows.py takes the newest data.max_candles).

    Args:
      symbol, interval: the series identity.
      parts: list of (open_time_ms [N], ohlcv [N, 5]) from the series' files.
      data_cfg: the `data` config group (bad_rows, min_candles).
      notes: facts from the source (months, failed_months, ...), copied into notes.
    Returns:
      A Series whose notes add candles, first, last, gaps, longest_gap, dropped_rows.
    Raises:
      SeriesSkipped: no candles, invalid candles under skip_series, or too few left.
      KlineError: two files disagree on the candle at one open_time.
    """
    name = f"{symbol}-{interval}"
    if not parts:
        raise SeriesSkipped("no candles")
    times, ohlcv = sort_dedupe(
        np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), name
    )
    step = INTERVAL_MS[interval]
    times, ohlcv, dropped = _apply_bad_rows(times, ohlcv, step, data_cfg.bad_rows)
    if len(times) < data_cfg.min_candles:
        raise SeriesSkipped(
            f"only {len(times)} usable candles, need data.min_candles={data_cfg.min_candles}"
        )
    gaps, longest = gap_stats(times, step)
    notes = dict(notes or {})
    notes.update(
        candles=len(times),
        first=iso(times[0]),
        last=iso(times[-1]),
        gaps=gaps,
        longest_gap=longest,
        dropped_rows=dropped,
    )
    notes.setdefault("months", months_of(times))
    notes.setdefault("failed_months", {})
    return Series(symbol, interval, times, ohlcv, notes)


def _apply_bad_rows(times, ohlcv, step_ms: int, policy: str):
    """Applies data.bad_rows; returns (times, ohlcv, dropped count)."""
    masks = invalid_rows(times, ohlcv, step_ms)
    bad = np.logical_or.reduce(list(masks.values()))
    if not bad.any():
        return times, ohlcv, 0
    if policy == "drop_rows":
        return times[~bad], ohlcv[~bad], int(bad.sum())
    counts = ", ".join(f"{int(m.sum())} {rule}" for rule, m in masks.items() if m.any())
    raise SeriesSkipped(
        f"{int(bad.sum())} invalid candles ({counts}), first at {iso(times[bad][0])}; "
        f"data.bad_rows={policy}"
    )
