"""Forecasts of saved or trained models, in prices, and the files that hold them.

`split_forecast` forecasts every window of one split of a series (one jitted, batched
call per power-of-two batch, so every series shares one program per batch size);
`next_candles` forecasts the H candles after the newest one. Forecast files:
forecasts/<SERIES>.npz (every test window, eval.save_forecasts) and, for --mode predict,
forecast.json / forecast.csv (prices at PRICE_DIGITS significant digits, each series with
its test skill: `skill_on_test`).
"""

from __future__ import annotations

import csv
import functools
import io
from typing import NamedTuple

import jax
import numpy as np
from absl import logging

from cpbjax import columns, writers
from cpbjax import workdir as workdir_lib
from cpbjax.data import latest, parsing, stacking, windows
from cpbjax.data.series import INTERVAL_MS, SeriesSkipped
from cpbjax.score import intervals, metrics


class SplitForecast(NamedTuple):
    """The forecasts of every window of one split."""

    ends_N: np.ndarray  # int64 window end indices into the series
    prices_NHC: np.ndarray  # float64 prices
    norm_NHC: np.ndarray  # float32 forecasts in the normalised space


# The largest batch of one forecast call: batches are padded to a power of two up to it.
MAX_BATCH = 1024


@functools.partial(jax.jit, static_argnames=("module",))
def _forecast_batch(module, params, x_BLF):
    return module.apply({"params": params}, x_BLF, None, train=False)


def predict_windows(module, params, prep, ends_N, lookback, horizon):
    """Deterministic normalised forecasts of the windows ending at `ends_N`.

    The windows are sliced on the host (stacking.gather_inputs, the same float32 arithmetic
    as on the device) and batches are padded to a power of two (capped at MAX_BATCH), so
    the compiled forecast depends on the batch size alone: with full histories every
    series has its own length, and a program keyed on it compiled once per series and
    split (measured: 158 compiles, 9.8 s of a 20-series evaluation on the 2-core CPU).

    Args:
      module, params: the model, applied with train=False.
      prep: windows.PreparedSeries. ends_N: int [N] window end indices.
      lookback, horizon: L and H.

    Returns:
      float32 [N, H, C] normalised forecasts.
    """
    ends_N = np.asarray(ends_N, np.int32)
    n = len(ends_N)
    if n == 0:
        return np.zeros((0, horizon, columns.NUM_TARGETS), np.float32)
    b = min(MAX_BATCH, 1 << max(n - 1, 0).bit_length())
    padded = np.concatenate([ends_N, np.full(-n % b, ends_N[-1], np.int32)])
    source = stacking.window_source(prep)
    outs = []
    for i in range(0, len(padded), b):
        x_BLF = stacking.gather_inputs(source, padded[i : i + b], lookback)
        outs.append(np.asarray(_forecast_batch(module, params, x_BLF)))
    return np.concatenate(outs)[:n].astype(np.float32)


def split_forecast(module, params, prep, split, spec) -> SplitForecast:
    """Forecasts every window of one split ("train" | "val" | "test") of one series
    (spec: the run's evaluate.EvalSpec, its window sizes)."""
    return forecast_ends(module, params, prep, prep.ends[split], spec.lookback, spec.horizon)


def forecast_ends(module, params, prep, ends_N, lookback, horizon) -> SplitForecast:
    """Forecasts the windows of one series that end at ends_N, normalised and in prices."""
    ends_N = np.asarray(ends_N, np.int64)
    return priced(prep, ends_N, predict_windows(module, params, prep, ends_N, lookback, horizon))


def priced(prep, ends_N, pred_norm) -> SplitForecast:
    """The SplitForecast of normalised forecasts [N, H, C] of the windows ending at ends_N."""
    ends_N = np.asarray(ends_N, np.int64)
    return SplitForecast(ends_N, windows.to_prices(prep, ends_N, pred_norm), pred_norm)


def forecast_record(prep, fc: SplitForecast, spec, calibration=None):
    """The arrays of a forecasts file (see save_forecasts); spec: the run's
    evaluate.EvalSpec (its window sizes); `calibration` (intervals.fit_calibration) adds
    the calibrated interval."""
    ends_N = np.asarray(fc.ends_N, np.int64)
    idx_NH = ends_N[:, None] + np.arange(1, spec.horizon + 1)[None, :]
    record = {
        "series": np.array(prep.name),
        "symbol": np.array(prep.symbol),
        "interval": np.array(prep.interval),
        "columns": np.array(columns.COLUMNS),
        "last_open_time_ms": prep.open_time_ms[ends_N].astype(np.int64),
        "last_candle": prep.ohlc[ends_N].astype(np.float64),
        "target_open_time_ms": prep.open_time_ms[idx_NH].astype(np.int64),
        "actual": prep.ohlc[idx_NH].astype(np.float64),
        "predicted": np.asarray(fc.prices_NHC, np.float64),
    }
    if calibration is not None:
        record["interval_levels"] = np.asarray(calibration["levels"], np.float64)
        record["interval_bounds"] = intervals.calibrated_bounds(
            calibration, prep.ohlc, ends_N, fc.prices_NHC, spec.lookback
        )
    return record


def save_forecasts(workdir, record: dict) -> str:
    """Writes a `forecast_record` to <workdir>/forecasts/<SERIES>.npz; returns its path.

    Keys: series, symbol, interval, columns (open, high, low, close),
    last_open_time_ms [N], last_candle [N, C], target_open_time_ms [N, H],
    actual [N, H, C], predicted [N, H, C] (prices); a calibrated interval adds
    interval_levels [2] and interval_bounds [N, H, C, 2]. `metrics.score_prices(
    last_candle, actual, predicted)` recomputes every price-space metric from them.
    """
    path = workdir_lib.forecasts_file(workdir, str(record["series"]))
    buf = io.BytesIO()
    np.savez(buf, **record)
    writers.atomic_write(path, buf.getvalue())
    return path


def load_forecasts(path) -> dict:
    """Reads a forecasts file into a dict of arrays."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def consistent_ohlc(pred_HC: np.ndarray) -> np.ndarray:
    """Forecast candles made valid: high >= max(open, close) and low <= min(open, close).

    The model predicts the four columns separately, so a raw candle can break that order
    (seen on 1 of 400 predicted candles); the violating high or low is moved to the
    nearer body edge, and nothing else changes.
    """
    out = np.array(pred_HC, np.float64)
    body_hi = np.maximum(out[..., 0], out[..., 3])
    body_lo = np.minimum(out[..., 0], out[..., 3])
    out[..., 1] = np.maximum(out[..., 1], body_hi)
    out[..., 2] = np.minimum(out[..., 2], body_lo)
    return out


def next_candles(module, params, prep, lookback: int, horizon: int, calibration=None) -> dict:
    """The next H candles after the newest one of `prep`, in prices (a forecast.json entry).

    The candles are made consistent (`consistent_ohlc`). A model saved with its interval
    calibration (LoadedModel.calibration) adds each candle's
    `interval`: {"lower", "upper"} OHLC prices, and the entry's `interval_levels`.

    Raises:
      SeriesSkipped: the newest L candles are too few or span a gap.
      NonFiniteForecast: a forecast or interval price is NaN or inf (`check_finite`).
    """
    try:
        latest.latest_window(prep, lookback)
    except ValueError as e:
        raise SeriesSkipped(str(e)) from None
    t = len(prep.ohlc) - 1
    fc = forecast_ends(module, params, prep, np.array([t]), lookback, horizon)
    entry = {
        "symbol": prep.symbol,
        "interval": prep.interval,
        "last_open_time": parsing.iso(prep.open_time_ms[t]),
        "last_open_time_ms": int(prep.open_time_ms[t]),
        "last_candle": _candle(prep.ohlc[t]),
        "forecast": _next_candles(prep, consistent_ohlc(fc.prices_NHC[0])),
    }
    if calibration is not None:
        _warn_short_history(prep, calibration)
        # Around the raw forecast, as scored on test; [H, C, 2] lower and upper.
        bounds = intervals.calibrated_bounds(calibration, prep.ohlc, [t], fc.prices_NHC, lookback)
        for h, candle in enumerate(entry["forecast"]):
            candle["interval"] = {
                "lower": _candle(bounds[0, h, :, 0]),
                "upper": _candle(bounds[0, h, :, 1]),
            }
        entry["interval_levels"] = list(calibration["levels"])
    check_finite(prep.name, fc.prices_NHC, bounds if calibration is not None else None)
    return entry


class NonFiniteForecast(ValueError):
    """A forecast with NaN or inf prices (e.g. params that are not finite): refused, never
    returned; the message names the series."""


def check_finite(name: str, prices, bounds=None) -> None:
    """Raises NonFiniteForecast naming series `name` unless every forecast price (and
    interval bound) is finite: JSON would write them as null, and a caller would trade
    on a forecast of nothing."""
    for what, values in (("prices", prices), ("interval bounds", bounds)):
        if values is not None and not np.isfinite(values).all():
            raise NonFiniteForecast(
                f"{name}: the forecast's {what} are NaN or inf, so it is refused: the saved "
                "model's params or normalisation are not finite; retrain or restore it"
            )


def _next_candles(prep, pred_HC) -> list[dict]:
    """forecast.json's candles of the H forecast candles after the newest one of `prep`."""
    step = INTERVAL_MS[prep.interval]
    times = prep.open_time_ms[-1] + step * np.arange(1, len(pred_HC) + 1, dtype=np.int64)
    return [
        {
            "step": h + 1,
            "open_time": parsing.iso(ms),
            "open_time_ms": int(ms),
            **_candle(pred_HC[h]),
        }
        for h, ms in enumerate(times)
    ]


def _warn_short_history(prep, calibration: dict) -> None:
    """Logs when the interval's scale averages fewer candles than it was fitted with."""
    scale = calibration.get("scale", intervals.WINDOW_ONLY)
    if scale["long_weight"] > 0 and len(prep.ohlc) < scale["long_candles"]:
        logging.warning(
            "%s: the interval's volatility scale averages the last %d candles, but only %d "
            "are given; its interval is not the one the test split scored",
            prep.name,
            scale["long_candles"],
            len(prep.ohlc),
        )


def flat_candle(candle: dict) -> dict:
    """One forecast candle as flat columns: step, times, OHLC, then the interval's
    `<column>_lower` / `<column>_upper`."""
    flat = {k: v for k, v in candle.items() if k != "interval"}
    for side, values in candle.get("interval", {}).items():
        flat.update({f"{col}_{side}": v for col, v in values.items()})
    return flat


def _candle(values_C) -> dict:
    return dict(zip(columns.COLUMNS, map(float, values_C), strict=True))


# Significant digits of the prices in forecast.json and .csv: a Binance price has at most
# 8, and a forecast's own error is far wider than the rounding (51417.033, not
# 51417.03295599103).
PRICE_DIGITS = 8


def _rounded_candle(candle: dict) -> dict:
    """A candle of a next_candles entry with its OHLC (and interval) prices rounded."""
    out = {
        k: float(f"{v:.{PRICE_DIGITS}g}") if k in columns.COLUMNS else v for k, v in candle.items()
    }
    if "interval" in candle:
        out["interval"] = {side: _rounded_candle(c) for side, c in candle["interval"].items()}
    return out


def rounded_prices(entry: dict) -> dict:
    """A next_candles entry with every price at PRICE_DIGITS significant digits."""
    return dict(
        entry,
        last_candle=_rounded_candle(entry["last_candle"]),
        forecast=[_rounded_candle(c) for c in entry["forecast"]],
    )


def skill_on_test(scored: dict | None, baseline: str) -> dict:
    """How good a series' forecasts were on its test split, for its forecast.json entry.

    Args:
      scored: the series' results.json entry (None: the run scored none).
      baseline: the model's model.baseline.

    Returns:
      {"test_skill": {"windows", "vs_naive": per column the skill against the better
      naive forecast (results' test.columns.<col>.skill), "vs_band": high and low, the
      skill against the volatility band (1 - MAE / the band's MAE; the band forecasts no
      other column)} or None where test was not scored; "kept_baseline": true when no
      epoch beat the untrained model (best_epoch null) under a baseline, so the
      forecast IS the baseline's; None without a results entry}.
    """
    test = (scored or {}).get("test") or {}
    cols, band = test.get("columns"), (test.get("vol_band") or {}).get("columns") or {}
    skill = None
    if cols:
        skill = {
            "windows": test.get("windows"),
            "vs_naive": {c: cols[c]["skill"] for c in columns.COLUMNS},
            "vs_band": {c: metrics.skill(cols[c]["mae"], band[c]["mae"]) for c in band},
        }
    kept = None
    if scored and "best_epoch" in scored:
        kept = scored["best_epoch"] is None and baseline != "none"
    return {"test_skill": skill, "kept_baseline": kept}


def _skill_columns(s: dict) -> dict:
    """forecast.csv's columns of a series' test skill and kept_baseline (on each of its rows)."""
    skill = s.get("test_skill") or {}
    out = {
        f"test_skill_{against}_{col}": value
        for against in ("vs_naive", "vs_band")
        for col, value in (skill.get(against) or {}).items()
    }
    if "kept_baseline" in s:
        out["kept_baseline"] = s["kept_baseline"]
    return out


def forecast_csv(series: dict) -> str:
    """forecast.json's series as CSV text, one row per (series, step)."""
    rows = [
        {
            "series": name,
            "symbol": s["symbol"],
            "interval": s["interval"],
            **flat_candle(c),
            **_skill_columns(s),
        }
        for name, s in series.items()
        for c in s["forecast"]
    ]
    fields = ["series", "symbol", "interval", "step", "open_time", "open_time_ms"]
    fields += [k for k in dict.fromkeys(k for row in rows for k in row) if k not in fields]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:  # a series without an interval leaves those columns empty
        writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    return buf.getvalue()


def write_forecast_files(workdir: str, doc: dict) -> list[str]:
    """Writes --mode predict's <workdir>/forecast.json and forecast.csv (the latest), and
    the same JSON under predictions/ stamped with its creation time, so no earlier
    forecast is overwritten. Returns the paths written."""
    stamp = doc["run"]["created"].replace(":", "").replace("-", "")
    paths = [
        workdir_lib.forecast_json(workdir),
        workdir_lib.forecast_csv(workdir),
        workdir_lib.prediction_archive(workdir, stamp),
    ]
    writers.write_json(paths[0], doc)
    writers.atomic_write(paths[1], forecast_csv(doc["series"]))
    writers.write_json(paths[2], doc)
    return paths
