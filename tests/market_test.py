"""Cross-series covariates (data.market_series): a market series' return and range read by
every series, checked against a plain loop over the candles (gaps on both sides, a market
series that starts later); the market series' own columns; the fill rule on missing
market candles; the synthetic source without data.covariates; ablate's per-symbol
settings; the exit-2 line for a market symbol with no candles."""

import json
import os

import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import columns
from cpbjax.config import schema as config_lib
from cpbjax.data import covariates, sources, windows
from cpbjax.data.series import INTERVAL_MS, CovariateError
from cpbjax.modes import ablate
from tests import fake_data, helpers

STEP = INTERVAL_MS["1h"]
MARKET_COLUMNS = ("BTCUSDT_return", "BTCUSDT_range")


def _write(folder, series, symbol):
    frame = pd.DataFrame(series.ohlcv, columns=["Open", "High", "Low", "Close", "Volume"])
    frame.insert(0, "open_time", series.open_time_ms)
    os.makedirs(folder, exist_ok=True)
    frame.to_csv(os.path.join(folder, f"{symbol}-1h.csv"), index=False)


def _market_files(folder):
    """ETHUSDT-1h (420 candles less a few) and BTCUSDT-1h, which starts 60 candles later
    and has gaps of its own, some where ETHUSDT has candles, one where it has none."""
    eth = fake_data.make_series(420, seed=1, missing=(100, 101, 102, 250, 333))
    btc = fake_data.make_series(420, seed=2, missing=(*range(60), 150, 151, 152, 153, 250, 300))
    _write(folder, eth, "ETHUSDT")
    _write(folder, btc, "BTCUSDT")
    return eth, btc


def _config(folder, symbols=("ETHUSDT",), **data):
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/gru.py:tiny"))
    c.data.source, c.data.local_dir = "local", str(folder)
    c.data.symbols, c.data.intervals = symbols, ("1h",)
    c.data.min_candles, c.data.max_candles = 300, 0
    c.data.market_series = ("BTCUSDT",)
    for key, value in data.items():
        c.data[key] = value
    return config_lib.validate(c)


def _plain_market_columns(times, market):
    """[T, 2] by a loop: the market candle opening at each time, its log return over the
    market candle one interval before (NaN if there is none) and its log(high / low)."""
    rows = {int(t): i for i, t in enumerate(market.open_time_ms)}
    out = np.full((len(times), 2), np.nan)
    for r, t in enumerate(times):
        i = rows.get(int(t))
        if i is None:
            continue
        high, low, close = market.ohlcv[i, 1], market.ohlcv[i, 2], market.ohlcv[i, 3]
        before = rows.get(int(t) - STEP)
        if before is not None:
            out[r, 0] = np.log(close / market.ohlcv[before, 3])
        out[r, 1] = np.log(high / low)
    return out


def test_every_series_reads_the_market_candle_at_its_own_open_time(tmp_path):
    eth, btc = _market_files(tmp_path)
    (loaded,), skipped = sources.load_all(_config(tmp_path).data)  # BTCUSDT: an input only
    assert not skipped and loaded.name == "ETHUSDT-1h"
    assert loaded.covariate_names == MARKET_COLUMNS
    want = _plain_market_columns(eth.open_time_ms, btc)
    np.testing.assert_array_equal(loaded.open_time_ms, eth.open_time_ms)
    np.testing.assert_allclose(loaded.covariates, want, rtol=1e-12)
    assert np.isnan(loaded.covariates[:60]).all()  # before the market series starts
    assert np.isnan(loaded.covariates[:, 0]).sum() > np.isnan(loaded.covariates[:, 1]).sum()


def test_the_market_series_reads_its_own_candles_and_every_series_has_the_same_k(tmp_path):
    eth, btc = _market_files(tmp_path)
    both, skipped = sources.load_all(_config(tmp_path, symbols=("ETHUSDT", "BTCUSDT")).data)
    assert not skipped and [s.name for s in both] == ["ETHUSDT-1h", "BTCUSDT-1h"]
    (eth_alone,), _ = sources.load_all(_config(tmp_path).data)
    np.testing.assert_array_equal(both[0].covariates, eth_alone.covariates)
    own = both[1]
    assert own.covariate_names == MARKET_COLUMNS
    np.testing.assert_allclose(
        own.covariates, _plain_market_columns(btc.open_time_ms, btc), rtol=1e-12
    )
    close = btc.ohlcv[:, 3]
    follows = np.diff(btc.open_time_ms) == STEP  # its own return: its candles' log returns
    np.testing.assert_allclose(
        own.covariates[1:][follows, 0], np.log(close[1:] / close[:-1])[follows]
    )


def test_missing_market_candles_follow_the_fill_rule_and_skip_windows(tmp_path):
    _market_files(tmp_path)
    d = _config(tmp_path, covariate_fill=2, covariate_scaling="none", lookback=8, horizon=2).data
    (loaded,), _ = sources.load_all(d)
    filled = covariates.series_columns(loaded, d)
    raw = loaded.covariates
    for t in range(len(raw)):  # a plain fill: the newest value at most 2 candles back
        for k in range(2):
            want = np.nan
            for s in range(t, -1, -1):
                if loaded.open_time_ms[t] - loaded.open_time_ms[s] > 2 * STEP:
                    break
                if not np.isnan(raw[s, k]):
                    want = raw[s, k]
                    break
            np.testing.assert_equal(filled[t, k], want)
    prep = windows.prepare_series(loaded, d)
    times, cut, L, H = prep.open_time_ms, len(raw) - len(prep.open_time_ms), d.lookback, d.horizon
    gap_free = [
        t
        for t in range(L - 1, len(times) - H)
        if times[t + H] - times[t - L + 1] == (L + H - 1) * STEP
    ]
    holes = [t for t in gap_free if np.isnan(filled[cut + t - L + 1 : cut + t + 1]).any()]
    assert holes and prep.notes["covariate_skipped_windows"] == len(holes)
    ends = np.concatenate([prep.ends[s] for s in ("train", "val", "test")])
    assert not set(ends.tolist()) & set(holes)
    assert np.isfinite(prep.inputs).all()  # no NaN reaches a window, none is set to 0
    assert prep.inputs.shape[1] == len(d.features) + 2


def _synthetic_config(**data):
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/mlp.py:tiny"))
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
    for key, value in data.items():
        c.data[key] = value
    return config_lib.validate(c)


def test_market_series_need_no_local_source_and_train_through_the_covariate_path():
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/gru.py"))  # the binance source
    c.data.market_series = ("BTCUSDT", "ETHUSDT")
    assert config_lib.validate(c).data.covariates == ()
    d = _synthetic_config(market_series=("BTCUSDT",)).data
    series, skipped = sources.load_all(d)
    assert not skipped and all(s.covariate_names == MARKET_COLUMNS for s in series)
    preps = windows.prepare_all(series, d)[0]
    assert [p.norm["covariates"] for p in preps] == [MARKET_COLUMNS] * 2
    assert columns.input_names(d)[-2:] == MARKET_COLUMNS


def test_ablate_leaves_out_each_market_symbol_with_both_its_columns():
    grid = ablate.settings(("funding",), ("BTCUSDT", "ETHUSDT"))
    eth = ("ETHUSDT_return", "ETHUSDT_range")
    assert grid == {
        "all": ("funding", *MARKET_COLUMNS, *eth),
        "none": (),
        "without-funding": (*MARKET_COLUMNS, *eth),
        "without-BTCUSDT": ("funding", *eth),
        "without-ETHUSDT": ("funding", *MARKET_COLUMNS),
    }
    assert ablate.settings((), ("BTCUSDT",)) == {"all": MARKET_COLUMNS, "none": ()}


@pytest.mark.parametrize("bad", [("BTCUSDT", "BTCUSDT"), ("btc",)])
def test_a_bad_market_series_value_is_refused(bad):
    with pytest.raises(config_lib.ConfigError, match="data.market_series"):
        _synthetic_config(market_series=bad)


def test_a_market_symbol_without_candles_is_one_line(tmp_path):
    _write(tmp_path / "data", fake_data.make_series(400, seed=1), "ETHUSDT")
    with pytest.raises(CovariateError, match="data.market_series 'BTCUSDT': no BTCUSDT-1h"):
        sources.load_all(_config(tmp_path / "data").data)
    proc = helpers.run_launch(
        "--config=configs/gru.py:tiny",
        "--config.data.source=local",
        f"--config.data.local_dir={tmp_path / 'data'}",
        "--config.data.symbols=('ETHUSDT',)",
        "--config.data.intervals=('1h',)",
        "--config.data.market_series=('BTCUSDT',)",
        f"--workdir={tmp_path / 'run'}",
        jax_platforms="cpu",
    )
    last = helpers.exit_2_line(proc)
    assert last.startswith("error: data.market_series 'BTCUSDT': no BTCUSDT-1h candles")


def test_ablate_runs_with_a_market_series_loaded_as_an_input_only(tmp_path):
    proc = helpers.run_launch(
        "--config=configs/mlp.py:tiny",
        "--mode=ablate",
        "--config.data.symbols=('ETHUSDT','SOLUSDT')",
        "--config.data.intervals=('1h',)",
        "--config.data.market_series=('BTCUSDT',)",
        "--config.train.epochs=1",
        "--config.eval.plots=False",
        f"--workdir={tmp_path / 'run'}",
        jax_platforms="cpu",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert sorted(results["series"]) == ["ETHUSDT-1h", "SOLUSDT-1h"]  # BTCUSDT: input only
    assert results["ablate"]["settings"] == {"all": list(MARKET_COLUMNS), "none": []}
    assert "BTCUSDT (val)" in proc.stdout


def test_predict_loads_the_market_series_and_a_frame_without_it_is_one_line(tmp_path):
    workdir = tmp_path / "run"
    flags = ("--config.data.symbols=('ETHUSDT',)", "--config.data.intervals=('1h',)")
    train = helpers.run_launch(
        "--config=configs/mlp.py:tiny",
        *flags,
        "--config.data.market_series=('BTCUSDT',)",
        "--config.train.epochs=1",
        "--config.eval.plots=False",
        f"--workdir={workdir}",
        jax_platforms="cpu",
    )
    assert train.returncode == 0, train.stderr[-4000:]
    predict = helpers.run_launch("--mode=predict", f"--workdir={workdir}", jax_platforms="cpu")
    assert predict.returncode == 0, predict.stderr[-4000:]
    assert "ETHUSDT-1h: newest closed candle" in predict.stdout
    model = cpbjax.load(str(workdir / "models" / "ETHUSDT-1h"))
    eth = sources.load_all(_synthetic_config(symbols=("ETHUSDT",)).data)[0][0]
    frame = pd.DataFrame(
        eth.ohlcv,
        columns=["open", "high", "low", "close", "volume"],
        index=pd.to_datetime(eth.open_time_ms, unit="ms", utc=True),
    )
    with pytest.raises(ValueError, match=r"data.market_series=\('BTCUSDT',\).*--mode predict"):
        model.predict(frame)
