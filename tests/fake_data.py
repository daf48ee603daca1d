"""Fabricated test inputs: small series and preps, report records, a faulty Binance."""

import datetime
import hashlib
import io
import os
import zipfile
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from cpbjax import columns
from cpbjax.config import schema as config_lib
from cpbjax.data import http_client, synthetic, windows
from cpbjax.data.series import INTERVAL_MS, Series
from cpbjax.score import metrics
from tests.helpers import ROOT

STEP_MS = INTERVAL_MS["1h"]
L, H = 8, 3  # lookback and horizon of the numpy-level tests (windows, metrics, evaluate)


# ---------------------------------------------------------------------------------------
# One synthetic series with L=8, H=3 (metrics, evaluate and intervals tests).


def prep_config():
    c = config_lib.base_config()
    c.data.lookback, c.data.horizon = L, H
    c.data.max_candles, c.data.min_candles = 300, 100
    return c


def make_prep(seed=0):
    series = synthetic.generate("BTCUSDT", "1h", 320, seed=seed)
    return windows.prepare_series(series, prep_config().data)


class Probe(nn.Module):
    """A linear map from the flattened window to [B, H, 4]."""

    @nn.compact
    def __call__(self, x_BLF, y_BHC=None, train=False):
        del y_BHC, train
        b = x_BLF.shape[0]
        out = nn.Dense(H * 4, kernel_init=nn.initializers.normal(0.01))(x_BLF.reshape(b, -1))
        return out.reshape(b, H, 4)  # [B, H*4] -> [B, H, 4]


def probe_params(seed=0):
    return Probe().init(jax.random.key(seed), jnp.zeros((1, L, 4)))["params"]


# ---------------------------------------------------------------------------------------
# Random 1h series (windows, protocol and fit tests; their plain windows: references.py).


FIRST_OPEN_MS = 1_700_000_000_000 // STEP_MS * STEP_MS  # make_series' default first open


def make_series(
    n=420, seed=0, missing=(), symbol="TESTUSDT", interval="1h", first_open_ms=FIRST_OPEN_MS
):
    """A random series of n grid candles from first_open_ms, rows in `missing` left out."""
    rng = np.random.default_rng(seed)
    close = 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n)))
    open_ = np.concatenate([[50.0], close[:-1]])
    high = np.maximum(open_, close) * (1.0 + rng.uniform(0.0, 0.01, n))
    low = np.minimum(open_, close) * (1.0 - rng.uniform(0.0, 0.01, n))
    ohlcv = np.stack([open_, high, low, close, rng.uniform(1.0, 9.0, n)], axis=1)
    times = first_open_ms + INTERVAL_MS[interval] * np.arange(n, dtype=np.int64)
    keep = np.setdiff1d(np.arange(n), np.asarray(missing, np.int64))
    return Series(symbol, interval, times[keep], ohlcv[keep])


def data_config(**overrides):
    d = config_lib.base_config().data
    d.lookback, d.horizon, d.max_candles, d.min_candles = L, H, 360, 200
    for key, value in overrides.items():
        d[key] = value
    return d


def perturbed(series, first_row, seed=1):
    """A copy with every candle from `first_row` on rescaled (OHLC rules still hold)."""
    rng = np.random.default_rng(seed)
    ohlcv = series.ohlcv.copy()
    ohlcv[first_row:] *= rng.uniform(0.5, 2.0, (len(ohlcv) - first_row, 1))
    return Series(series.symbol, series.interval, series.open_time_ms, ohlcv)


# ---------------------------------------------------------------------------------------
# report.md inputs (report, report_html and plot_workers tests).


def forecast_record(name, seed, n=12):
    """A tiny forecasts record: a random walk, forecasts = actual plus noise."""
    rng = np.random.default_rng(seed)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0, 0.01, n + H)))
    ohlc = np.stack([close, close * 1.01, close * 0.99, close], axis=1)  # [T, 4]
    idx = np.arange(n)[:, None] + np.arange(1, H + 1)[None, :]
    actual = ohlc[idx]
    return {
        "series": np.array(name),
        "symbol": np.array(name.split("-")[0]),
        "interval": np.array("1h"),
        "columns": np.array(columns.COLUMNS),
        "last_open_time_ms": 1_700_000_000_000 + STEP_MS * np.arange(n, dtype=np.int64),
        "last_candle": ohlc[:n],
        "target_open_time_ms": 1_700_000_000_000 + STEP_MS * idx,
        "actual": actual,
        "predicted": actual * np.exp(rng.normal(0, 0.003, actual.shape)),
    }


def report_results(records):
    """A results.json of the forecast records {name: record}, one skipped series."""
    series = {}
    for i, (name, rec) in enumerate(records.items()):
        test = metrics.score_prices(rec["last_candle"], rec["actual"], rec["predicted"])
        series[name] = {
            "status": "stopped_early",
            "best_val_loss": 0.5 + i,
            "epochs_run": 3,
            "train_seconds": 1.25,
            "test": test,
        }
    return {
        "run": {"versions": {"jax": "0.10.2"}, "devices": ["cpu:0"], "wall_seconds": 9.5},
        "series": series,
        "skipped": {"LUNAUSDT-1h": "only 10 usable candles"},
    }


def report_history(names):
    """metrics.jsonl records of 3 epochs of one group of `names`."""
    return [
        {
            "group": 0,
            "epoch": e,
            "series": list(names),
            "train_loss": [1.0 / e, None],
            "val_loss": [1.5 / e, 2.0],
            "lr": 1e-3,
            "active": [True, True],
            "seconds": 0.1,
        }
        for e in (1, 2, 3)
    ]


def report_config(plots=True):
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.eval.plots = plots
    c.eval.plot_windows = 2
    c.data.lookback = 4
    return c


# ---------------------------------------------------------------------------------------
# Damaged Binance Vision zips (parsing, binance and faults tests).


def damage_deflate(path: str) -> None:
    """Breaks the deflate stream of a Vision zip at `path`, then rewrites its CHECKSUM to match.

    Most damaged bytes only break the CRC-32, which zipfile reports as BadZipFile; this
    flips bytes at the first position that the zlib decoder itself rejects.
    """
    with open(path, "rb") as f:
        data = f.read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.infolist()[0]
    start = info.header_offset + 30 + len(info.filename.encode())  # no extra field here
    for offset in range(start, start + info.compress_size - 8):
        broken = data[:offset] + bytes(b ^ 0xFF for b in data[offset : offset + 8])
        broken += data[offset + 8 :]
        try:
            zlib.decompress(broken[start : start + info.compress_size], -15)
        except zlib.error:
            break
    else:
        raise AssertionError(f"no damage that zlib rejects in {path}")
    with open(path, "wb") as f:
        f.write(broken)
    digest = hashlib.sha256(broken).hexdigest()
    with open(path + ".CHECKSUM", "w") as f:
        f.write(f"{digest}  {os.path.basename(path)}\n")


def fast_backoff(monkeypatch) -> None:
    """Retry waits of hundredths of a second (the module's own autouse fixture calls this)."""
    monkeypatch.setattr(http_client, "BACKOFF_FACTOR", 0.01)
    monkeypatch.setattr(http_client, "BACKOFF_JITTER_S", 0.01)
    monkeypatch.setattr(http_client, "BACKOFF_MAX_S", 0.05)


def last_complete_months(n: int) -> list[str]:
    """The n calendar months before this one, oldest first ("YYYY-MM")."""
    first, months = datetime.date.today().replace(day=1), []
    for _ in range(n):
        first = (first - datetime.timedelta(days=1)).replace(day=1)
        months.append(first.strftime("%Y-%m"))
    return sorted(months)
