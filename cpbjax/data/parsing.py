"""Kline parsing (Binance CSV zips; a user's CSV/Parquet: local_files.py) and validation.

Every source funnels its raw candles through `build_series`, so the rules are the
same everywhere: rows sorted, exact duplicates dropped, conflicting duplicates an
error, invalid candles skipped or dropped per `data.bad_rows`, gaps counted and
never filled, and too-short series skipped with their reason.
"""

from __future__ import annotations

import calendar
import datetime
import io
import zipfile
import zlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from cpbjax.data.series import INTERVAL_MS, Series, SeriesSkipped

OHLCV = ("open", "high", "low", "close", "volume")
# Epoch values above this are microseconds: 1e14 us is 1973, 1e14 ms is year 5138.
_US_THRESHOLD = 1e14
# Accepted open_time range in ms, [1970, 3000): a time outside it is a unit or data error,
# and keeping it out means every accepted time can be printed as an ISO date.
_MAX_MS = 32_503_680_000_000
# Decompressed-size cap of one kline CSV: a Binance row is ~130 bytes (~140 in us), so
# 512 bytes per candle is generous; the floor covers tiny files (one 1d candle a day).
MAX_ROW_BYTES = 512
MIN_CSV_BYTES = 1 << 20
_CHUNK_BYTES = 1 << 16
# Errors zipfile lets through from a damaged member (bad deflate data, cut stream,
# unsupported or encrypted compression) besides BadZipFile; a CRC-matching CHECKSUM
# does not rule them out, since it covers whatever bytes the mirror published. A local
# header offset that points before the file start surfaces as ValueError ("negative seek
# value") from zipfile's reader.
_DAMAGED_MEMBER = (zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError)
# A price more than this factor away from its neighbourhood is a bad print or a unit
# error, not a market move; the reference is the median close of JUMP_WINDOW candles
# centred on it, so a spike of up to JUMP_WINDOW // 2 candles is caught whole and the
# candles around it are not.
JUMP_FACTOR = 1e6
JUMP_WINDOW = 49


class KlineError(ValueError):
    """A file that cannot be read as klines; the message names the file."""


def iso(ms: int) -> str:
    """Epoch milliseconds as an ISO UTC string, e.g. 2024-03-05T10:00:00Z."""
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_to_ms(raw: np.ndarray, name: str) -> np.ndarray:
    """Converts epoch ms or us (detected from the magnitude, one unit per file) to ms.

    Raises:
      KlineError: if the file mixes ms and us values, or a time is outside 1970..3000.
    """
    raw = np.asarray(raw, np.int64)
    is_us = raw > _US_THRESHOLD
    if is_us.any() and not is_us.all():
        raise KlineError(f"{name}: open_time mixes milliseconds and microseconds in one file")
    ms = raw // 1000 if is_us.any() else raw
    outside = (ms < 0) | (ms >= _MAX_MS)
    if outside.any():
        raise KlineError(
            f"{name}: open_time {raw[outside][0]} is outside 1970..3000 (as epoch ms or us)"
        )
    return ms


def read_kline_csv(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Parses a Binance kline CSV (12 columns, headerless or with a header row).

    Args:
      data: the CSV bytes.
      name: the file name, used in error messages.
    Returns:
      (open_time_ms int64 [N], ohlcv float64 [N, 5]), sorted, exact duplicates dropped.
    Raises:
      KlineError: unreadable or out-of-range values, too few columns, mixed time
        units, or two different rows with the same open_time.
    """
    first_field = data[: data.find(b",")].strip().strip(b'"').lstrip(b"\xef\xbb\xbf")
    header = not first_field.lstrip(b"-").isdigit()
    raw = _arrow_columns(data, header) or _pandas_columns(data, header, name)
    return sort_dedupe(epoch_to_ms(raw[0], name), raw[1], name)


# The six leading columns (open_time, OHLCV) by the names pyarrow gives headerless columns.
_ARROW_TYPES = {"f0": pa.int64(), **{f"f{j}": pa.float64() for j in range(1, 6)}}


def _arrow_columns(data: bytes, header: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(open_time [N], ohlcv float64 [N, 5]) of a CSV whose leading six columns are all
    plain numbers, or None for anything else (an empty file, a missing or non-numeric
    value, rows of unequal length), which `_pandas_columns` reads or names.

    pyarrow's reader is the fast path: it parses without holding the GIL, so the load's
    threads parse side by side, and it costs less per file than pandas'
    (docs/performance.md "Data loading"). On the 3,881 months of the shared mirror
    both readers give the same arrays, bit for bit.
    """
    read = pacsv.ReadOptions(
        skip_rows=int(header), autogenerate_column_names=True, use_threads=False
    )
    convert = pacsv.ConvertOptions(column_types=_ARROW_TYPES, include_columns=list(_ARROW_TYPES))
    try:
        table = pacsv.read_csv(pa.py_buffer(data), read_options=read, convert_options=convert)
    except pa.ArrowException:  # whatever pyarrow cannot read, pandas reads or names
        return None
    if table.num_rows == 0 or any(c.null_count for c in table.columns):
        return None
    columns = [c.to_numpy() for c in table.columns]
    return columns[0], np.stack(columns[1:], axis=1)


def _pandas_columns(data: bytes, header: bool, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`_arrow_columns` by pandas' reader, which names what is wrong with a bad file.

    Raises:
      KlineError: not a CSV of at least six columns of numbers, or a value beyond int64.
    """
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
    except OverflowError as e:  # e.g. an open_time of 1e23, beyond int64
        raise KlineError(f"{name}: a value does not fit in 64 bits ({e})") from e
    return frame[0].to_numpy(), frame.iloc[:, 1:6].to_numpy(np.float64)


def csv_byte_cap(interval: str, period: str) -> int:
    """The decompressed-size cap of the kline CSV of a month "YYYY-MM" or a day "YYYY-MM-DD"."""
    year, month = int(period[:4]), int(period[5:7])
    days = 1 if len(period) == 10 else calendar.monthrange(year, month)[1]
    candles = days * 86_400_000 // INTERVAL_MS[interval]
    return max(candles * MAX_ROW_BYTES, MIN_CSV_BYTES)


# The cap for callers that do not know the file's period: the largest file a mirror
# may hold, a 31-day month of 1m candles.
DEFAULT_MAX_CSV_BYTES = csv_byte_cap("1m", "2024-01")


def read_kline_zip(
    data: bytes, name: str, max_bytes: int = DEFAULT_MAX_CSV_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """Parses the single CSV inside a Binance Vision zip; see `read_kline_csv`.

    Args:
      data: the zip bytes.
      name: the file name, used in error messages.
      max_bytes: the most the CSV may unpack to (see `csv_byte_cap`).
    Raises:
      KlineError: not a zip, no CSV member, damaged compressed data, a CSV larger
        than max_bytes, or a bad CSV.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = [m for m in z.namelist() if m.lower().endswith(".csv")]
            if len(members) != 1:
                raise KlineError(f"{name}: expected one CSV inside, found {members}")
            csv = _read_capped(z, members[0], name, max_bytes)
    except KlineError:
        raise
    except zipfile.BadZipFile as e:
        raise KlineError(f"{name}: not a valid zip ({e})") from e
    except _DAMAGED_MEMBER as e:
        raise KlineError(f"{name}: damaged compressed data ({type(e).__name__}: {e})") from e
    return read_kline_csv(csv, name)


def _read_capped(z: zipfile.ZipFile, member: str, name: str, max_bytes: int) -> bytes:
    """The member's bytes, read in chunks so that a zip bomb stops at max_bytes.

    The header's declared size is checked first, but it can lie, so the count of
    bytes actually inflated is what enforces the cap.
    """
    too_big = KlineError(
        f"{name}: {member} unpacks to more than {max_bytes} bytes, the cap for this "
        f"file ({MAX_ROW_BYTES} bytes per candle of its interval and period)"
    )
    if z.getinfo(member).file_size > max_bytes:
        raise too_big
    chunks, size = [], 0
    with z.open(member) as f:
        while chunk := f.read(_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise too_big
            chunks.append(chunk)
    return b"".join(chunks)


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
            "implausible price jump": _price_jumps(prices),
        }


def _price_jumps(prices: np.ndarray) -> np.ndarray:
    """Bool [N]: candles with an OHLC price over JUMP_FACTOR away from their neighbourhood.

    The reference is the rolling median close of JUMP_WINDOW centred candles, not the
    previous close: against the previous close, the candle after a spike would be
    flagged instead of the middle of a spike several candles long. Prices that other
    rules reject (non-positive or non-finite) take no part.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        usable = np.isfinite(prices) & (prices > 0)
        log_p = np.log(np.where(usable, prices, np.nan))
    # A reference is a median of usable log closes, so it lies between the smallest and
    # the largest usable log price: when those are within the factor, no price can be
    # beyond it (the usual series: no rolling median to compute, the same answer).
    if not usable.any() or np.nanmax(log_p) - np.nanmin(log_p) <= np.log(JUMP_FACTOR):
        return np.zeros(len(prices), bool)
    reference = pd.Series(log_p[:, 3]).rolling(JUMP_WINDOW, center=True, min_periods=1)
    distance = np.abs(log_p - reference.median().to_numpy()[:, None])
    return (distance > np.log(JUMP_FACTOR)).any(axis=1)  # NaN (no usable price) is False


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
      parts: list of (open_time_ms [N], values [N, 5 + K]) from the series' files: OHLCV,
        then (K > 0) the data.covariates columns, which ride along with their candles.
      data_cfg: the `data` config group (bad_rows, min_candles; covariates when K > 0).
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
    times, values = sort_dedupe(
        np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), name
    )
    step = INTERVAL_MS[interval]
    times, values, dropped = _apply_bad_rows(times, values, step, data_cfg.bad_rows)
    if len(times) < data_cfg.min_candles:
        raise SeriesSkipped(
            f"only {len(times)} usable candles, need data.min_candles={data_cfg.min_candles}"
        )
    notes = _series_notes(times, step, dropped, notes)
    names = tuple(data_cfg.covariates) if values.shape[1] > len(OHLCV) else ()
    width = len(OHLCV)
    return Series(symbol, interval, times, values[:, :width], notes, values[:, width:], names)


def _series_notes(times: np.ndarray, step_ms: int, dropped: int, notes: dict | None) -> dict:
    """The source's `notes` plus the facts of the validated candles (sorted times [N])."""
    gaps, longest = gap_stats(times, step_ms)
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
    return notes


def _apply_bad_rows(times, values, step_ms: int, policy: str):
    """Applies data.bad_rows to the candles (values [N, 5 + K]: OHLCV, then covariates,
    which are dropped with their candle); returns (times, values, dropped count)."""
    masks = invalid_rows(times, values[:, : len(OHLCV)], step_ms)
    bad = np.logical_or.reduce(list(masks.values()))
    if not bad.any():
        return times, values, 0
    if policy == "drop_rows":
        return times[~bad], values[~bad], int(bad.sum())
    counts = ", ".join(f"{int(m.sum())} {rule}" for rule, m in masks.items() if m.any())
    raise SeriesSkipped(
        f"{int(bad.sum())} invalid candles ({counts}), first at {iso(times[bad][0])}; "
        f"data.bad_rows={policy}"
    )
