"""The window table of issue #42's global-model experiment: every window of every series of
a pair list, with its band, targets and causal context, from the product's own loaders.

One row per window end t (gap-free, calendar-split by `data.split_dates`):
  - `x`: the window itself, float32 [N, L, 4]: log(OHLC / close_t), in units of sigma_t;
  - `sigma`: the window's EWMA log range (the band's sigma, band.ewma_range) [N];
  - `y`: the targets log(OHLC_{t+h} / close_t) [N, H, 4] (not scaled);
  - `ctx`: causal context features at t [N, X] (CONTEXT names them), NaN where undefined;
  - `close`: close_t [N] (to price units), `split`: 0 train, 1 val, 2 test.

Context (each uses candles <= t only; the market factor reads BTCUSDT of the same
interval at the same open time, NaN where BTCUSDT has no candle then):
  lr_1d, lr_1w, lr_1m   log(mean log range over the span / sigma_t): the term structure
  ret_1d, ret_1w        log return over the span / sigma_t
  hour_sin, hour_cos    time of day of candle t+1; dow_sin, dow_cos: day of week
  seas_h1..             log(mean range of the candles at the same time of day as t+h,
                        over the last 30 days / mean range over those 30 days), h = 1, 5, 10
  vol_1d, vol_1m        log(volume_t / mean volume over 1 day), log(1 day mean / 1 month mean)
  interval              log2 of the interval in minutes (15m: 3.9, 1h: 5.9)
  mkt_lr_1d, mkt_sig, mkt_ret_1   BTCUSDT's lr_1d, log(its sigma_t / its 1 month mean
                        range), its last candle's return in its sigma

With --context product the context is instead the product's own columns at t (the
non-price features of configs/mlp.py: hour_*, dow_*, cpbjax/data/context.py's), as
features.compute gives them; `ctx_names` names the columns either way.

Usage: python experiments/global_model/frame.py --pairs tuning --out runs/gm/tuning.npz
  (--base-url $MIRROR; --split-dates 2025-01,2025-03; --context harness|product).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cpbjax import band
from cpbjax.config import schema as config_lib
from cpbjax.data import context, features, pairs, sources, split_dates, windows  # noqa: E402
from cpbjax.data import series as series_lib

L, H = 30, 10
DAY_MS = 86_400_000
SPANS = {"1d": 1, "1w": 7, "1m": 30}  # days
SEASON_STEPS = (1, 5, 10)
CONTEXT = (
    "lr_1d", "lr_1w", "lr_1m", "ret_1d", "ret_1w",
    "hour_sin", "hour_cos", "dow_sin", "dow_cos",
    *(f"seas_h{h}" for h in SEASON_STEPS),
    "vol_1d", "vol_1m", "interval",
    "mkt_lr_1d", "mkt_sig", "mkt_ret_1",
)  # fmt: skip
MARKET = "BTCUSDT"
# The product's context: configs/mlp.py's non-price features.
PRODUCT_CONTEXT = ("hour_sin", "hour_cos", "dow_sin", "dow_cos", *context.NAMES)


def trailing_mean(v_T: np.ndarray, n: int) -> np.ndarray:
    """Mean of v over rows t-n+1..t (NaN before row n-1), as one cumulative sum."""
    c = np.concatenate([[0.0], np.cumsum(v_T, dtype=np.float64)])
    out = np.full(len(v_T), np.nan)
    out[n - 1 :] = (c[n:] - c[:-n]) / n
    return out


def seasonal(range_T: np.ndarray, per_day: int, ahead: int) -> np.ndarray:
    """log(mean range of the 30 past candles at the time of day of t+ahead / 30-day mean)."""
    days = SPANS["1m"]
    out = np.full(len(range_T), np.nan)
    # Candle t+ahead-k*per_day for k = 1..30: the same time of day, all at or before t
    # since ahead <= per_day.
    lag0 = per_day - ahead  # t - lag0 = t + ahead - per_day
    span = days * per_day
    if len(range_T) <= span:
        return out
    same = sliding_window_view(range_T, span)[:, ::-1][:, lag0::per_day].mean(axis=1)
    whole = trailing_mean(range_T, span)[span - 1 :]
    out[span - 1 :] = np.log(same / np.maximum(whole, 1e-12) + 1e-12)
    return out


def series_context(s, market) -> np.ndarray:
    """[T, X] context of every candle of a series (CONTEXT order)."""
    ohlcv = s.ohlcv
    step = series_lib.INTERVAL_MS[s.interval]
    per_day = DAY_MS // step
    range_T = np.log(ohlcv[:, 1] / ohlcv[:, 2])
    logc_T = np.log(ohlcv[:, 3])
    sigma_T = ewma_all(range_T)
    floor = np.maximum(sigma_T, 1e-6)
    cols = {}
    for name, days in SPANS.items():
        cols[f"lr_{name}"] = np.log(
            np.maximum(trailing_mean(range_T, days * per_day), 1e-9) / floor
        )
    for name in ("1d", "1w"):
        n = SPANS[name] * per_day
        back = np.full(len(logc_T), np.nan)
        back[n:] = logc_T[n:] - logc_T[:-n]
        cols[f"ret_{name}"] = back / floor
    t_next = s.open_time_ms + step
    day_phase = 2 * np.pi * (t_next % DAY_MS) / DAY_MS
    week_phase = 2 * np.pi * ((t_next - 4 * DAY_MS) % (7 * DAY_MS)) / (7 * DAY_MS)
    cols.update(hour_sin=np.sin(day_phase), hour_cos=np.cos(day_phase))
    cols.update(dow_sin=np.sin(week_phase), dow_cos=np.cos(week_phase))
    for h in SEASON_STEPS:
        cols[f"seas_h{h}"] = seasonal(range_T, per_day, h)
    vol = ohlcv[:, 4]
    v1d, v1m = trailing_mean(vol, per_day), trailing_mean(vol, 30 * per_day)
    cols["vol_1d"] = np.log((vol + 1e-12) / (v1d + 1e-12))
    cols["vol_1m"] = np.log((v1d + 1e-12) / (v1m + 1e-12))
    cols["interval"] = np.full(len(vol), np.log2(step / 60_000))
    cols.update(market_columns(s, market, range_T, per_day))
    return np.stack([cols[name] for name in CONTEXT], axis=1)


def ewma_all(range_T: np.ndarray) -> np.ndarray:
    """band.ewma_range of the window ending at every t >= L-1 (NaN before)."""
    w_L = band.EWMA_DECAY ** np.arange(L - 1, -1, -1, dtype=np.float64)
    out = np.full(len(range_T), np.nan)
    out[L - 1 :] = sliding_window_view(range_T, L) @ (w_L / w_L.sum())
    return out


def market_columns(s, market, range_T, per_day) -> dict:
    """The market factor: BTCUSDT's columns at this series' open times (NaN where absent)."""
    names = ("mkt_lr_1d", "mkt_sig", "mkt_ret_1")
    if market is None:
        return {n: np.full(len(range_T), np.nan) for n in names}
    m_range = np.log(market.ohlcv[:, 1] / market.ohlcv[:, 2])
    m_sigma = np.maximum(ewma_all(m_range), 1e-6)
    m_ret = np.full(len(m_range), np.nan)
    m_ret[1:] = np.diff(np.log(market.ohlcv[:, 3]))
    m_cols = {
        "mkt_lr_1d": np.log(np.maximum(trailing_mean(m_range, per_day), 1e-9) / m_sigma),
        "mkt_sig": np.log(m_sigma / np.maximum(trailing_mean(m_range, 30 * per_day), 1e-9)),
        "mkt_ret_1": m_ret / m_sigma,
    }
    pos = np.searchsorted(market.open_time_ms, s.open_time_ms)
    pos_c = np.minimum(pos, len(market.open_time_ms) - 1)
    hit = market.open_time_ms[pos_c] == s.open_time_ms
    return {n: np.where(hit, m_cols[n][pos_c], np.nan) for n in names}


def product_context(s) -> np.ndarray:
    """[T, X] the product's context columns of a series (PRODUCT_CONTEXT order)."""
    return features.compute(s.ohlcv, PRODUCT_CONTEXT, s.interval, s.open_time_ms)[0]


def series_rows(s, market, data_cfg, context_of) -> dict | None:
    """The window rows of one series, or None without windows."""
    times = s.open_time_ms
    step = series_lib.INTERVAL_MS[s.interval]
    ends = windows.contiguous_ends(times, step, L, H)
    ends = ends[ends >= SPANS["1m"] * DAY_MS // step + L]  # past every context's warm-up
    parts = split_dates.split_ends(ends, times, step, H, split_dates.bounds_ms(data_cfg))
    ends_N = np.concatenate([parts[k] for k in split_dates.SPLITS])
    if not len(ends_N):
        return None
    split_N = np.concatenate([np.full(len(parts[k]), i) for i, k in enumerate(split_dates.SPLITS)])
    ohlc = s.ohlcv[:, :4]
    sigma_N = band.ewma_range(ohlc, ends_N, L)
    logc_N = np.log(ohlc[ends_N, 3])
    x = np.log(ohlc[ends_N[:, None] + np.arange(-L + 1, 1)]) - logc_N[:, None, None]
    y = np.log(ohlc[ends_N[:, None] + np.arange(1, H + 1)]) - logc_N[:, None, None]
    ctx = context_of(s, market)[ends_N]
    return {
        "x": (x / np.maximum(sigma_N, 1e-6)[:, None, None]).astype(np.float32),
        "y": y.astype(np.float32),
        "sigma": sigma_N.astype(np.float32),
        "ctx": ctx.astype(np.float32),
        "close": ohlc[ends_N, 3],
        "split": split_N.astype(np.int8),
        "end_time": times[ends_N],
    }


def build(symbols, intervals, base_url, dates, context="harness", end="") -> dict:
    """The window table of `symbols` x `intervals` split at `dates`, months to `end`
    (data.end: "" = the last complete month)."""
    cfg = config_lib.base_config()
    d = cfg.data
    d.source, d.base_url, d.symbols, d.intervals = "binance", base_url, tuple(symbols), intervals
    d.months, d.max_candles, d.min_candles, d.split_dates = 0, 0, 0, tuple(dates)
    d.end = end
    loaded, skipped = sources.load_all(d)
    by_name = {s.name: s for s in loaded}
    mkt_cfg = config_lib.base_config().data
    mkt_cfg.update(dict(source="binance", base_url=base_url, symbols=(MARKET,), intervals=intervals, months=0, max_candles=0, min_candles=0, end=end))  # fmt: skip
    markets = {s.interval: s for s in sources.load_all(mkt_cfg)[0]}
    parts, names = [], []
    for name in sorted(by_name):
        s = by_name[name]
        rows = series_rows(s, markets.get(s.interval), d, CONTEXT_OF[context])
        if rows is None:
            skipped[name] = "no windows"
            continue
        rows["series"] = np.full(len(rows["split"]), len(names), np.int32)
        parts.append(rows)
        names.append(name)
    table = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    table["names"] = np.array(names)
    table["ctx_names"] = np.array(CONTEXT if context == "harness" else PRODUCT_CONTEXT)
    return table


CONTEXT_OF = {"harness": series_context, "product": lambda s, market: product_context(s)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", choices=("tuning", "confirmation", "mirror"), required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--split-dates", default="2025-01,2025-03")
    p.add_argument("--intervals", default="15m,1h")
    p.add_argument("--out", required=True)
    p.add_argument("--context", choices=tuple(CONTEXT_OF), default="harness")
    p.add_argument("--end", default="", help="last month, YYYY-MM (default: the newest)")
    a = p.parse_args()
    symbols = pairs.NAMED_LISTS[f"@{a.pairs}"]
    t0 = time.perf_counter()
    intervals, dates = tuple(a.intervals.split(",")), a.split_dates.split(",")
    table = build(symbols, intervals, a.base_url, dates, a.context, a.end)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez(a.out, **table)
    counts = np.bincount(table["split"], minlength=3)
    print(f"{len(table['names'])} series, windows train/val/test {counts.tolist()}, "
          f"{time.perf_counter() - t0:.0f} s -> {a.out}")  # fmt: skip


if __name__ == "__main__":
    main()
