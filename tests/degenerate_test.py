"""Degenerate series are skipped, never fatal (issue #55): flat candles (open = high = low =
close, as in a halted pair's hours) leave the volatility band nothing to fit on. Such a
series is skipped with its reason under results.json's "skipped" in every mode (the
check is in windows.with_ends, which every mode's preparation goes through) while the
other series train, score and save; a series whose newest candles only are flat is
scored, and the report's interval line survives its missing figures."""

import logging
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import band, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.data import folds, synthetic, windows
from cpbjax.data.series import Series
from cpbjax.report import tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANDLES = 400
GOOD, FLAT, FLAT_TAIL = "BTCUSDT-1h", "HALTUSDT-1h", "ETHUSDT-1h"
FLAT_REASON = "flat candles: the volatility band has no window with a range to fit on"
TINY = {  # configs/gru.py:tiny, shrunk to one epoch of a 16-wide GRU on 400 candles
    "data.max_candles": CANDLES,
    "data.min_candles": 200,
    "model.hidden": 16,
    "model.num_layers": 1,
    "train.epochs": 1,
    "eval.plots": False,
}


def _flat(series: Series) -> Series:
    """`series` with every candle's OHLC at one price: a halted pair."""
    ohlcv = series.ohlcv.copy()
    ohlcv[:, :4] = 2.5
    return Series("HALTUSDT", series.interval, series.open_time_ms, ohlcv)


def _frame(series: Series, flat_tail: int = 0) -> pd.DataFrame:
    """series as a UTC-indexed OHLCV frame; its last `flat_tail` candles flat at the close
    before them (the newest hours of a halted pair: the whole test span)."""
    frame = pd.DataFrame(series.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame.index = pd.to_datetime(series.open_time_ms, unit="ms", utc=True)
    if flat_tail:
        frame.iloc[-flat_tail:, :4] = frame["close"].iloc[-flat_tail - 1]
    return frame


def _config():
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    for key, value in TINY.items():
        group, field = key.split(".")
        c[group][field] = value
    return c


class _Records(logging.Handler):
    """Keeps every log record's message (caplog is per test; the fit is per module)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"models": cpbjax.fit's return, "fit": its workdir, "logged": its warnings,
    "launched": (launch.py's CompletedProcess, workdir) of the train mode on the good and
    the flat frames}."""
    root = tmp_path_factory.mktemp("degenerate")
    good = synthetic.generate("BTCUSDT", "1h", CANDLES)
    frames = {
        GOOD: _frame(good),
        FLAT: _frame(_flat(good)),
        FLAT_TAIL: _frame(synthetic.generate("ETHUSDT", "1h", CANDLES), flat_tail=150),
    }
    records, fit_dir = _Records(), str(root / "fit")
    logging.getLogger().addHandler(records)
    try:
        models = cpbjax.fit(frames, _config(), fit_dir)
    finally:
        logging.getLogger().removeHandler(records)
    launched = str(root / "launched")
    flags = [f"--config.{k}={v}" for k, v in TINY.items()]
    proc = subprocess.run(
        [sys.executable, "launch.py", "--config=configs/gru.py:tiny", f"--workdir={launched}"]
        + flags
        + ["--config.data.source=local", f"--config.data.local_dir={root / 'fit' / 'frames'}"]
        + ["--config.data.symbols=('BTCUSDT','HALTUSDT')", "--config.data.intervals=('1h',)"],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return {
        "models": models,
        "fit": fit_dir,
        "logged": records.messages,
        "launched": (proc, launched),
    }


def test_the_train_mode_skips_a_flat_series_and_scores_the_other(runs):
    """Before: IndexError in band.weighted_quantile while scoring; no results.json."""
    proc, workdir = runs["launched"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = writers.read_json(workdir_lib.results_json(workdir))
    assert results["skipped"][FLAT].startswith(FLAT_REASON)
    assert list(results["series"]) == [GOOD]
    assert results["series"][GOOD]["test"]["vol_band"]["k_high_h"]
    assert os.path.isdir(workdir_lib.series_model(workdir, GOOD))
    assert not os.path.exists(workdir_lib.series_model(workdir, FLAT))


def test_fit_returns_the_trained_models_and_logs_the_flat_one(runs):
    """cpbjax.fit: the flat series is left out with its reason, logged; the one whose newest
    candles only are flat trains and is scored (before: IndexError, then the report's
    TypeError on the tail's missing interval figures)."""
    assert list(runs["models"]) == [GOOD, FLAT_TAIL]
    results = writers.read_json(workdir_lib.results_json(runs["fit"]))
    assert results["skipped"] == {FLAT: results["skipped"][FLAT]}
    assert results["skipped"][FLAT].startswith(FLAT_REASON)
    assert any(FLAT in m and FLAT_REASON in m for m in runs["logged"])
    tail = results["series"][FLAT_TAIL]["test"]["calibrated_interval"]["columns"]["close"]
    assert tail["skill_vs_band"] is None  # no range in test: 0/0
    with open(workdir_lib.report_md(runs["fit"], "report")) as f:
        assert "Calibrated 80% interval" in f.read()


def test_every_mode_s_preparation_skips_a_flat_series():
    """windows.prepare_all (train, sweep, evaluate, fit) and folds.prepare_all (backtest)
    skip the flat series, or each of its folds, with the band's reason."""
    config = config_lib.validate(_config())
    good = synthetic.generate("BTCUSDT", "1h", CANDLES)
    preps, skipped = windows.prepare_all([good, _flat(good)], config.data)
    assert [p.name for p in preps] == [GOOD]
    assert skipped[FLAT].startswith(FLAT_REASON)
    preps, skipped = folds.prepare_all([good, _flat(good)], config.data, config.backtest)
    assert preps and all(p.name.startswith(GOOD) for p in preps)
    for p in preps:  # each fold the good series fits, the flat one fits too, but is flat
        assert skipped[p.name.replace(GOOD, FLAT)].startswith(FLAT_REASON)


def test_the_band_fit_names_flat_candles():
    """Before: IndexError: index -1 is out of bounds for axis 0 with size 0."""
    ohlc = np.full((60, 4), 2.5)
    with pytest.raises(band.NoRange, match="no window with a range"):
        band.fit_vol_band(ohlc, np.arange(20, 50), lookback=8, horizon=3)
    with pytest.raises(band.NoRange):
        band.weighted_quantile(np.zeros(0), np.zeros(0), 0.5)


def _interval_entry(coverage, skill):
    cols = {c: {"coverage": coverage, "skill_vs_band": skill} for c in ("close", "high", "low")}
    return {"test": {"calibrated_interval": {"central": [0.1, 0.9], "columns": cols}}}


def test_interval_lines_survive_a_series_without_interval_figures():
    """A series whose test span is flat has skill_vs_band None (before: TypeError in
    statistics.median): the median is over the series that have it, "n/a" if none has."""
    results = {"series": {"A": _interval_entry(0.8, 0.02), "B": _interval_entry(1.0, None)}}
    (line,) = tables.interval_lines(results)
    assert "median over 2 series: test coverage close 90.0%" in line
    assert "band's quantiles close +2.00%, high +2.00%, low +2.00%" in line
    (line,) = tables.interval_lines({"series": {"B": _interval_entry(1.0, None)}})
    assert "band's quantiles close n/a, high n/a, low n/a" in line
