"""Synthetic OHLCV (GARCH(1,1) with Student-t shocks) and Binance-Vision-layout mirrors.

Log returns follow eps_t = sigma_t z_t, sigma_t^2 = omega + alpha eps_{t-1}^2 +
beta sigma_{t-1}^2, z ~ Student-t(DOF) scaled to unit variance, times an intraday
volatility profile that peaks at the US session. Each candle's OHLC comes from a
Brownian bridge inside the candle that ends at the candle's return, so
low <= min(open, close) <= max(open, close) <= high holds by construction. Volume
follows its own intraday profile and rises with |return|. Everything is
deterministic for each (seed, symbol, interval).

With covariates (data.synthetic_covariates), two exogenous latent processes drawn from their
own stream move the candles: a log-volatility multiplier h scales candle t's sigma by
exp(h_t), h_t = PHI h_{t-1} + SD sqrt(1 - PHI^2) n_t, centred so that E[exp(2 h)] = 1 (the
mean variance is unchanged); and a drift g (AR(1), DRIFT_PHI, DRIFT_SD) adds g_t of candle
t's sigma to its return. Their innovations are news: no past candle holds them. The series
carries four covariates (COVARIATES), row t holding only what is announced or known at the
close of candle t, never a realised return or shock:
  vol_signal       log of the root mean square of exp(h) over candles t+1..t+ANNOUNCED,
                   plus VOL_SIGNAL_NOISE noise: the announced volatility of the coming
                   candles (as an option's implied volatility is).
  flow             the mean of g over candles t+1..t+ANNOUNCED, plus FLOW_NOISE noise: the
                   announced drift of the coming candles (as an order-flow imbalance).
  noise            standard normal: nothing.
  price_transform  (log c_t - EMA_20(log c)_t) / sigma_bar: a function of closes up to t,
                   which the window's own prices already hold.
Why flow: a volatility announcement moves a point forecast of high and low over 10 steps
little, since where the close goes dominates it; the oracle and the runs of
experiments/synthetic_covariates measure it.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import math
import os
import zipfile
import zlib

import numpy as np
import pandas as pd

from cpbjax import writers
from cpbjax.data import parsing
from cpbjax.data.series import INTERVAL_MS, CovariateError, Series

DEFAULT_SEED = 0
# The synthetic source's series end here, so every run sees the same candles.
END_MS = int(datetime.datetime(2025, 7, 1, tzinfo=datetime.timezone.utc).timestamp() * 1000) - 1
# Binance Vision spot files switched open_time to microseconds from this month.
MICROSECONDS_FROM = "2025-01"

ALPHA, BETA, DOF = 0.10, 0.85, 5.0  # GARCH(1,1) and Student-t shape.
SUBSTEPS = 8  # U, points of the intra-candle path that sets high and low.
COVARIATES = ("vol_signal", "flow", "noise", "price_transform")  # with covariates=True
# The exogenous log-volatility multiplier: AR(1) coefficient per candle (half-life about 3
# candles, so the coming candles' volatility is mostly news to the window's prices),
# stationary std, and the announcement's noise; the candles each row announces; the drift
# (in units of a candle's sigma) and its announcement's noise. Chosen with the oracle of
# experiments/synthetic_covariates.
PHI, SD, VOL_SIGNAL_NOISE = 0.8, 1.0, 0.1
ANNOUNCED = 10
DRIFT_PHI, DRIFT_SD, FLOW_NOISE = 0.9, 0.2, 0.02
PRICE_TRANSFORM_SPAN = 20  # EMA span of price_transform
_YEAR_MS = 365 * 86_400_000
_HOUR_MS = 3_600_000
# Base asset -> (typical price in USDT, annualised volatility).
_PROFILES = {
    "BTC": (60_000.0, 0.55),
    "ETH": (3_000.0, 0.70),
    "BNB": (500.0, 0.60),
    "XRP": (0.6, 0.85),
    "LTC": (80.0, 0.80),
    "ADA": (0.5, 0.85),
    "SOL": (150.0, 0.95),
    "DOGE": (0.15, 1.00),
    "AVAX": (30.0, 1.00),
    "LINK": (15.0, 0.90),
    "UNI": (8.0, 0.95),
    "ATOM": (8.0, 0.90),
    "NEAR": (5.0, 1.00),
    "DYDX": (2.0, 1.10),
    "ARB": (1.0, 1.00),
    "OP": (2.0, 1.05),
    "PEPE": (1e-5, 1.30),
    "INJ": (25.0, 1.10),
    "SHIB": (2e-5, 1.10),
    "LUNA": (0.6, 1.20),
}
_QUOTES = ("USDT", "USDC", "FDUSD", "BUSD", "TUSD", "BTC", "ETH", "BNB", "EUR", "TRY")
_COLUMNS = (
    "open_time",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "close_time",
    "quote_volume",
    "trades",
    "taker_buy_base_volume",
    "taker_buy_quote_volume",
    "ignore",
)


def _rng(seed: int, *names: str) -> np.random.Generator:
    # crc32, not hash(): Python salts str hashes per process.
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


def _profile(symbol: str) -> tuple[float, float]:
    """(typical price, annual volatility) for a symbol; unknown bases get a stable draw."""
    base = next((symbol[: -len(q)] for q in _QUOTES if symbol.endswith(q) and symbol != q), symbol)
    if base in _PROFILES:
        return _PROFILES[base]
    u = _rng(0, base).uniform(size=2)
    return float(10 ** (-4 + 7 * u[0])), float(0.5 + 0.8 * u[1])


def _intraday(times_ms: np.ndarray, peak_hour: float, amplitude: float) -> np.ndarray:
    """1 + amplitude * cos(...) peaking at `peak_hour` UTC; [T]."""
    hour = (times_ms % 86_400_000) / _HOUR_MS
    return 1.0 + amplitude * np.cos(2 * np.pi * (hour - peak_hour) / 24)


def _garch(z: np.ndarray, sigma_bar: float) -> tuple[np.ndarray, np.ndarray]:
    """GARCH(1,1) innovations eps [T] and conditional sigma [T] from unit shocks z [T].

    The recursion is sequential by nature; a plain loop over Python floats takes
    about 3 ms for T=6000.
    """
    omega = sigma_bar**2 * (1 - ALPHA - BETA)
    var = sigma_bar**2
    sigma = []
    for zi in z.tolist():
        sigma.append(math.sqrt(var))
        e = sigma[-1] * zi
        var = omega + ALPHA * e * e + BETA * var
    sigma = np.asarray(sigma)
    return sigma * z, sigma


def _candles(log_p0: float, r_T: np.ndarray, sigma_T: np.ndarray, rng) -> np.ndarray:
    """OHLC [T, 4] from returns r [T] via a Brownian bridge of SUBSTEPS points per candle."""
    n = len(r_T)
    inc_TU = rng.standard_normal((n, SUBSTEPS)) * (sigma_T[:, None] / math.sqrt(SUBSTEPS))
    bridge_TU = inc_TU - inc_TU.mean(axis=1, keepdims=True) + r_T[:, None] / SUBSTEPS
    path_TU = np.cumsum(bridge_TU, axis=1)  # log price relative to the candle's open
    log_close = log_p0 + np.cumsum(path_TU[:, -1])
    log_open = np.concatenate([[log_p0], log_close[:-1]])
    o, c = np.exp(log_open), np.exp(log_close)
    # The path's extremes, widened to cover open and close exactly despite rounding.
    h = np.maximum(np.exp(log_open + path_TU.max(axis=1)), np.maximum(o, c))
    low = np.minimum(np.exp(log_open + path_TU.min(axis=1)), np.minimum(o, c))
    return np.stack([o, h, low, c], axis=1)


def _lfilter(*args, **kwargs):
    """scipy.signal.lfilter, imported at the first call: the import costs 0.4 s of the
    start of every run, and only synthetic data filters (sources.py imports this module)."""
    from scipy import signal

    return signal.lfilter(*args, **kwargs)


def _ar1(rng, n: int, phi: float, sd: float) -> np.ndarray:
    """[n]: a stationary AR(1) of coefficient phi and standard deviation sd."""
    n_N = rng.standard_normal(n)
    x0 = sd * n_N[0]
    rest, _ = _lfilter([sd * math.sqrt(1 - phi**2)], [1.0, -phi], n_N[1:], zi=[phi * x0])
    return np.concatenate([[x0], rest])


def _latent(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(h [n + ANNOUNCED], g [n + ANNOUNCED]): the log-volatility multiplier, centred so
    that E[exp(2 h)] = 1, and the drift (module docstring)."""
    h_N = _ar1(rng, n + ANNOUNCED, PHI, SD) - SD**2
    return h_N, _ar1(rng, n + ANNOUNCED, DRIFT_PHI, DRIFT_SD)


def _coming(x_N: np.ndarray) -> np.ndarray:
    """[T]: the mean of x over candles t+1..t+ANNOUNCED, for each t (x_N: [T + ANNOUNCED])."""
    return np.lib.stride_tricks.sliding_window_view(x_N[1:], ANNOUNCED).mean(axis=1)


def _covariates(h_N, g_N, close_T: np.ndarray, sigma_bar: float, rng) -> np.ndarray:
    """float64 [T, 4]: vol_signal, flow, noise, price_transform (module docstring)."""
    n = len(close_T)
    vol_signal = 0.5 * np.log(_coming(np.exp(2 * h_N))) + VOL_SIGNAL_NOISE * rng.standard_normal(n)
    flow = _coming(g_N) + FLOW_NOISE * rng.standard_normal(n)
    noise = rng.standard_normal(n)
    a = 2.0 / (PRICE_TRANSFORM_SPAN + 1)
    log_c = np.log(close_T)
    ema, _ = _lfilter([a], [1.0, a - 1.0], log_c, zi=[(1.0 - a) * log_c[0]])
    return np.stack([vol_signal, flow, noise, (log_c - ema) / sigma_bar], axis=1)


def covariate_columns(series: Series, names) -> np.ndarray:
    """float64 [T, K]: the `names` columns (data.covariates) of a generated series.

    Raises:
      CovariateError: a name the series does not carry, naming the series and it.
    """
    missing = [n for n in names if n not in series.covariate_names]
    if missing:
        raise CovariateError(
            f"{series.name}: data.covariates column {missing[0]!r} is absent: the synthetic "
            f"source makes {', '.join(COVARIATES)} with data.synthetic_covariates=True"
        )
    idx = [series.covariate_names.index(n) for n in names]
    return series.covariates[:, idx]


def generate(
    symbol: str,
    interval: str,
    n_candles: int,
    seed: int = DEFAULT_SEED,
    end_ms: int = END_MS,
    covariates: bool = False,
) -> Series:
    """Generates one synthetic series, deterministic for each (seed, symbol, interval).

    Args:
      symbol: e.g. "BTCUSDT"; the base asset sets the price level and volatility.
      interval: a key of series.INTERVAL_MS.
      n_candles: candles to generate, gap-free.
      seed: data seed.
      end_ms: the last candle opens at end_ms floored to the interval grid.
      covariates: scale the volatility by the exogenous multiplier, add the drift and
        carry the COVARIATES (module docstring); False gives the candles of earlier
        releases.
    Returns:
      A Series with notes {"source": "synthetic", "seed": seed}.
    """
    rng = _rng(seed, symbol, interval)
    step = INTERVAL_MS[interval]
    times = (end_ms // step - np.arange(n_candles - 1, -1, -1, dtype=np.int64)) * step
    price, annual_vol = _profile(symbol)
    sigma_bar = annual_vol * math.sqrt(step / _YEAR_MS)
    z = rng.standard_t(DOF, n_candles) * math.sqrt((DOF - 2) / DOF)
    eps, sigma = _garch(z, sigma_bar)
    if covariates:
        cov_rng = _rng(seed, symbol, interval, "covariates")
        h_N, g_N = _latent(cov_rng, n_candles)
        m_T = np.exp(h_N[:n_candles])
        eps, sigma = (eps + g_N[:n_candles] * sigma) * m_T, sigma * m_T
    vol_season = _intraday(times, peak_hour=14.5, amplitude=0.35)
    r = eps * vol_season
    log_p0 = math.log(price) + rng.uniform(-0.3, 0.3)
    ohlc = _candles(log_p0, r, sigma * vol_season, rng)
    quote_per_candle = 2e6 * step / 900_000 * math.exp(rng.uniform(-1, 1))
    activity = (0.4 + 0.6 * np.abs(eps) / sigma_bar) * rng.lognormal(0, 0.3, n_candles)
    volume = quote_per_candle * _intraday(times, 15.0, 0.5) * activity / ohlc[:, 3]
    ohlcv = np.concatenate([ohlc, volume[:, None]], axis=1)
    notes = {"source": "synthetic", "seed": seed}
    if not covariates:
        return Series(symbol, interval, times, ohlcv, notes)
    cov_TK = _covariates(h_N, g_N, ohlc[:, 3], sigma_bar, cov_rng)
    return Series(symbol, interval, times, ohlcv, notes, cov_TK, COVARIATES)


def _period_bounds(period: str) -> tuple[int, int]:
    """[start, end) epoch ms of a month "YYYY-MM" or a day "YYYY-MM-DD" (UTC)."""
    start = pd.Timestamp(period, tz="UTC")
    end = start + (pd.DateOffset(months=1) if len(period) == 7 else pd.Timedelta(days=1))
    return int(start.value // 1_000_000), int(end.value // 1_000_000)


def kline_csv(times_ms: np.ndarray, ohlcv: np.ndarray, interval: str, microseconds: bool):
    """The 12-column headerless Binance kline CSV of candles, as bytes."""
    unit = 1000 if microseconds else 1
    open_time = times_ms * unit
    frame = pd.DataFrame(
        {
            "open_time": open_time,
            **{name: ohlcv[:, j] for j, name in enumerate(parsing.OHLCV)},
            "close_time": open_time + INTERVAL_MS[interval] * unit - 1,
            "quote_volume": ohlcv[:, 4] * ohlcv[:, 3],
            "trades": 0,
            "taker_buy_base_volume": 0.0,
            "taker_buy_quote_volume": 0.0,
            "ignore": 0,
        }
    )
    return frame[list(_COLUMNS)].to_csv(header=False, index=False, float_format="%.8f").encode()


def write_zip(path: str, csv_bytes: bytes) -> str:
    """Writes `path` (a zip holding <stem>.csv) and `path`.CHECKSUM atomically; returns sha256."""
    stem = os.path.basename(path)[: -len(".zip")]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{stem}.csv", csv_bytes)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    writers.atomic_write(path, data)
    writers.atomic_write(path + ".CHECKSUM", f"{digest}  {os.path.basename(path)}\n".encode())
    return digest


def write_vision_mirror(
    root: str, symbols, intervals, months, seed: int = DEFAULT_SEED, days=()
) -> list[str]:
    """Writes synthetic klines in the Binance Vision layout, with CHECKSUM files.

    Files are root/data/spot/{monthly,daily}/klines/<SYM>/<INT>/<SYM>-<INT>-<period>.zip.
    Open times are in ms before MICROSECONDS_FROM and in us from then on, as on
    Binance Vision. One gap-free series spans all periods of a (symbol, interval).

    Args:
      root: the mirror root (what data.base_url points at).
      symbols, intervals: the series to write.
      months: monthly files to write, "YYYY-MM".
      seed: data seed for `generate`.
      days: daily files to write, "YYYY-MM-DD".
    Returns:
      The paths of the zips written.
    """
    periods = [("monthly", p) for p in months] + [("daily", p) for p in days]
    bounds = [_period_bounds(p) for _, p in periods]
    start, end = min(b[0] for b in bounds), max(b[1] for b in bounds)
    written = []
    for symbol in symbols:
        for interval in intervals:
            step = INTERVAL_MS[interval]
            s = generate(symbol, interval, (end - start) // step, seed, end - 1)
            for (kind, period), (lo, hi) in zip(periods, bounds, strict=True):
                rows = (s.open_time_ms >= lo) & (s.open_time_ms < hi)
                csv = kline_csv(
                    s.open_time_ms[rows], s.ohlcv[rows], interval, period[:7] >= MICROSECONDS_FROM
                )
                name = f"{symbol}-{interval}-{period}.zip"
                path = os.path.join(root, "data", "spot", kind, "klines", symbol, interval, name)
                write_zip(path, csv)
                written.append(path)
    return written
