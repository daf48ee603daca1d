"""Past covariates (data.covariates): windows read their own lookback's covariates, checked
against a plain loop over the raw columns (gaps, a covariate that starts later, missing
values); the fill rule; train-only scaling; the one-line errors; cpbjax.fit with a
covariate column; every model reads the extra columns; the synthetic source's covariates."""

import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import band, models
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import covariates, sources, synthetic, windows
from cpbjax.data.series import INTERVAL_MS, CovariateError, Series
from tests import fake_data, helpers
from tests.fake_data import H, L

NAMES = ("funding", "oi_change")
FILL = 2


def _with_covariates(series: Series, cov_TK: np.ndarray) -> Series:
    return Series(
        series.symbol,
        series.interval,
        series.open_time_ms,
        series.ohlcv,
        dict(series.notes),
        cov_TK,
        NAMES,
    )


def _gappy_series(seed=0):
    """420 candles less a few (gaps), with two covariates: the first NaN for its first
    80 candles (it starts later), both NaN here and there (runs of 1 to 4)."""
    series = fake_data.make_series(420, seed=seed, missing=(100, 101, 102, 250, 333))
    rng = np.random.default_rng(seed + 7)
    cov_TK = rng.normal(size=(len(series.ohlcv), 2))
    cov_TK[:80, 0] = np.nan
    for start in rng.choice(np.arange(90, 400), 12, replace=False):
        cov_TK[start : start + rng.integers(1, 5), rng.integers(0, 2)] = np.nan
    return _with_covariates(series, cov_TK)


def _plain_fill(times, cov_TK, step, limit):
    """A NaN takes the newest earlier value at most `limit` candles of open time back."""
    out = cov_TK.copy()
    for k in range(cov_TK.shape[1]):
        for t in range(len(times)):
            if not np.isnan(cov_TK[t, k]):
                continue
            for s in range(t - 1, -1, -1):
                if times[t] - times[s] > limit * step:
                    break
                if not np.isnan(cov_TK[s, k]):
                    out[t, k] = cov_TK[s, k]
                    break
    return out


def _plain_windows(series, data_cfg):
    """(kept open times, {end t: covariates [L, K] of its lookback}, skipped count) by loops
    over the raw columns: gap-free L+H candles, every lookback covariate present."""
    step = INTERVAL_MS[series.interval]
    filled = _plain_fill(series.open_time_ms, series.covariates, step, data_cfg.covariate_fill)
    times = series.open_time_ms[-data_cfg.max_candles :]
    filled = filled[-data_cfg.max_candles :]
    kept, skipped = {}, 0
    for t in range(L - 1, len(times) - H):
        span = times[t - L + 1 : t + H + 1]
        if not all(span[i + 1] - span[i] == step for i in range(len(span) - 1)):
            continue
        lookback = filled[t - L + 1 : t + 1]
        if np.isnan(lookback).any():
            skipped += 1
        else:
            kept[t] = lookback
    return times, kept, skipped


def test_windows_read_the_covariates_of_their_own_lookback_as_a_plain_loop_does():
    series = _gappy_series()
    d = fake_data.data_config(
        covariates=NAMES, covariate_fill=FILL, covariate_scaling="none", max_candles=360
    )
    prep = windows.prepare_series(series, d)
    times, kept, skipped = _plain_windows(series, d)
    np.testing.assert_array_equal(prep.open_time_ms, times)  # aligned by open time
    assert skipped > 0 and prep.notes["covariate_skipped_windows"] == skipped
    ends = np.concatenate([prep.ends[s] for s in ("train", "val", "test")])
    assert set(ends.tolist()) <= set(kept)  # purging drops some; none is added
    assert len(ends) > 0.8 * len(kept)
    for t in ends:
        x_LF = prep.inputs[t - L + 1 : t + 1] - prep.anchor[t] * prep.price_mask
        np.testing.assert_array_equal(x_LF[:, -2:], kept[t].astype(np.float32))
    assert prep.inputs.shape[1] == len(d.features) + len(NAMES)
    assert not prep.price_mask[-2:].any()


def test_no_window_reads_a_covariate_after_its_last_candle():
    series = _gappy_series()
    d = fake_data.data_config(covariates=NAMES, covariate_scaling="none", max_candles=360)
    prep = windows.prepare_series(series, d)
    t0 = int(prep.ends["val"][0])
    later = series.open_time_ms > prep.open_time_ms[t0]
    cov = series.covariates.copy()
    cov[later] = np.random.default_rng(3).normal(size=(later.sum(), 2)) * 100
    moved = windows.prepare_series(_with_covariates(series, cov), d)
    for t in prep.ends["train"]:
        if t <= t0:
            np.testing.assert_array_equal(
                moved.inputs[t - L + 1 : t + 1], prep.inputs[t - L + 1 : t + 1]
            )


def test_a_missing_covariate_is_carried_forward_at_most_fill_candles_never_zero():
    step = 1000
    times = np.array([0, 1, 2, 3, 4, 5, 9, 10], np.int64) * step  # a gap of 3 before 9
    cov = np.array([[1.0, 2.0, np.nan, np.nan, np.nan, np.nan, np.nan, 7.0]]).T
    got = covariates.fill(cov, times, step, 3)
    want = np.array([[1.0, 2.0, 2.0, 2.0, 2.0, np.nan, np.nan, 7.0]]).T
    np.testing.assert_array_equal(got, want)
    assert np.isnan(covariates.fill(cov, times, step, 0)[2:7]).all()  # 0: no fill
    # The candle at 9 opens 8 candles after the last value (at 1), the gap's included.
    assert np.isnan(covariates.fill(cov, times, step, 7)[6, 0])
    assert covariates.fill(cov, times, step, 8)[6, 0] == 2.0
    rng = np.random.default_rng(0)
    many = np.where(rng.random((500, 3)) < 0.3, np.nan, rng.normal(size=(500, 3)) + 5)
    t = np.arange(500, dtype=np.int64) * step
    np.testing.assert_array_equal(covariates.fill(many, t, step, 2), _plain_fill(t, many, step, 2))
    assert not (covariates.fill(many, t, step, 2) == 0).any()


def test_zscore_statistics_come_from_the_train_candles_only():
    series = _gappy_series()
    d = fake_data.data_config(covariates=NAMES, covariate_fill=FILL, max_candles=360)
    prep = windows.prepare_series(series, d)
    n_train = int(prep.ends["train"][-1]) + H + 1
    step = INTERVAL_MS[series.interval]
    filled = _plain_fill(series.open_time_ms, series.covariates, step, FILL)[-360:]
    mean = [np.mean(c[~np.isnan(c)]) for c in filled[:n_train].T]
    std = [np.std(c[~np.isnan(c)]) for c in filled[:n_train].T]
    np.testing.assert_allclose(prep.norm["covariate_mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(prep.norm["covariate_std"], std, rtol=1e-12)
    later = series.open_time_ms >= prep.open_time_ms[n_train]
    cov = series.covariates.copy()
    cov[later] *= 50.0
    moved = windows.prepare_series(_with_covariates(series, cov), d)
    np.testing.assert_array_equal(moved.norm["covariate_mean"], prep.norm["covariate_mean"])
    np.testing.assert_array_equal(moved.norm["covariate_std"], prep.norm["covariate_std"])


def _write_local(folder, frame, name="BTCUSDT-1h"):
    os.makedirs(folder, exist_ok=True)
    frame.to_csv(os.path.join(folder, f"{name}.csv"), index=False)


def _local_frame(series: Series, **extra) -> pd.DataFrame:
    frame = pd.DataFrame(series.ohlcv, columns=["Open", "High", "Low", "Close", "Volume"])
    frame.insert(0, "open_time", series.open_time_ms)
    for name, values in extra.items():
        frame[name] = values
    return frame


def _local_config(folder, **data):
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/gru.py:tiny"))
    c.data.source, c.data.local_dir = "local", str(folder)
    c.data.symbols, c.data.intervals = ("BTCUSDT",), ("1h",)
    c.data.min_candles, c.data.max_candles = 300, 0
    for key, value in data.items():
        c.data[key] = value
    return config_lib.validate(c)


def test_the_local_source_keeps_the_named_columns_and_drops_them_with_their_rows(tmp_path):
    series = fake_data.make_series(400)
    funding = np.random.default_rng(0).normal(size=400)
    frame = _local_frame(series, FUNDING=funding, other=np.arange(400.0))
    frame.loc[17, "Close"] = -1.0  # an invalid candle: dropped with its covariate
    _write_local(tmp_path, frame)
    c = _local_config(tmp_path, covariates=("funding",), bad_rows="drop_rows")
    (loaded,), skipped = sources.load_all(c.data)
    assert not skipped and loaded.covariate_names == ("funding",)
    keep = np.arange(400) != 17
    np.testing.assert_array_equal(loaded.open_time_ms, series.open_time_ms[keep])
    np.testing.assert_array_equal(loaded.covariates[:, 0], funding[keep])


@pytest.mark.parametrize(
    "column, message",
    [
        (None, r"BTCUSDT-1h .*data\.covariates column 'funding' is absent"),
        (["x"] * 400, r"BTCUSDT-1h .*column 'funding' is not numeric: it holds 'x'"),
        ([4.0] * 400, r"BTCUSDT-1h: data\.covariates column 'funding' is constant on the train"),
    ],
    ids=["absent", "non-numeric", "constant"],
)
def test_a_bad_covariate_column_names_the_series_and_the_column(tmp_path, column, message):
    series = fake_data.make_series(400)
    extra = {} if column is None else {"funding": column}
    _write_local(tmp_path, _local_frame(series, **extra))
    c = _local_config(tmp_path, covariates=("funding",))
    with pytest.raises(CovariateError, match=message):
        series_list, _ = sources.load_all(c.data)
        windows.prepare_all(series_list, c.data)


def test_covariates_from_a_binance_source_are_refused_in_one_line():
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/gru.py"))
    c.data.covariates = ("funding",)
    with pytest.raises(ConfigError, match="covariates need data.source=local or cpbjax.fit"):
        config_lib.validate(c)


def test_launch_exits_2_with_one_line_naming_the_series_and_the_absent_column(tmp_path):
    _write_local(tmp_path / "data", _local_frame(fake_data.make_series(400)))
    proc = helpers.run_launch(
        "--config=configs/gru.py:tiny",
        "--config.data.source=local",
        f"--config.data.local_dir={tmp_path / 'data'}",
        "--config.data.symbols=('BTCUSDT',)",
        "--config.data.intervals=('1h',)",
        "--config.data.covariates=('funding',)",
        f"--workdir={tmp_path / 'run'}",
        jax_platforms="cpu",
    )
    last = helpers.exit_2_line(proc)
    assert last.startswith("error: BTCUSDT-1h") and "'funding' is absent" in last


def _synthetic_frames():
    """Two synthetic 1h series as frames with a `funding` column: vol_signal, some NaN."""
    frames = {}
    for symbol in ("BTCUSDT", "ETHUSDT"):
        s = synthetic.generate(symbol, "1h", 700, covariates=True)
        frame = pd.DataFrame(s.ohlcv, columns=["open", "high", "low", "close", "volume"])
        frame["funding"] = s.covariates[:, 0]
        frame.loc[frame.index[300:302], "funding"] = np.nan
        frame.index = pd.to_datetime(s.open_time_ms, unit="ms", utc=True)
        frames[f"{symbol}-1h"] = frame
    return frames


def test_fit_trains_on_a_covariate_column_and_its_models_load(tmp_path):
    c = helpers.tiny_config()
    c.data.symbols, c.data.max_candles, c.data.min_candles = ("BTCUSDT",), 600, 300
    c.data.covariates, c.train.epochs = ("funding",), 1
    frames = _synthetic_frames()
    fitted = cpbjax.fit(frames, c, str(tmp_path / "run"))
    assert list(fitted) == list(frames)
    stored = pd.read_parquet(workdir_lib.frames_file(str(tmp_path / "run"), "ETHUSDT-1h"))
    np.testing.assert_array_equal(stored["funding"], frames["ETHUSDT-1h"]["funding"])
    model = cpbjax.load(workdir_lib.series_model(str(tmp_path / "run"), "BTCUSDT-1h"))
    assert model.config.data.covariates == ("funding",)
    assert list(model.loaded.norm["covariates"]) == ["funding"]
    assert len(model.predict(frames["BTCUSDT-1h"])) == model.horizon  # covariate_forecast_test
    gone = {n: f.drop(columns="funding") for n, f in frames.items()}
    with pytest.raises(ValueError, match=r"BTCUSDT-1h: .*column 'funding' is absent"):
        cpbjax.fit(gone, c, str(tmp_path / "other"))


@pytest.mark.parametrize("name", ["mlp", "gru", "lstm", "transformer"])
def test_every_model_reads_the_covariate_columns(name):
    c = config_lib.load(os.path.join(helpers.ROOT, f"configs/{name}.py:tiny"))
    c.data.synthetic_covariates, c.data.covariates = True, synthetic.COVARIATES
    c.data.lookback, c.data.horizon = 8, 3
    if name == "transformer":
        c.model.num_encoder_layers = c.model.num_decoder_layers = 1
    cfg = models.make_config(config_lib.validate(c))
    k = len(synthetic.COVARIATES)
    assert cfg.num_features == len(c.data.features) + k
    module = models.build(cfg)
    rng = np.random.default_rng(0)
    x = jnp.float32(0.05 * rng.normal(size=(2, 8, cfg.num_features)))
    y = jnp.float32(0.05 * rng.normal(size=(2, 3, 4)))
    # Random params of the real shapes (a zero-initialised head would hide every input).
    shapes = helpers.init_shapes(module, x, y)["params"]
    params = jax.tree.map(lambda s: jnp.float32(0.1 * rng.normal(size=s.shape)), shapes)
    forward = lambda x: module.apply({"params": params}, x, None, train=False).sum()  # noqa: E731
    grad = jax.jit(jax.grad(forward))(x)
    assert np.abs(np.asarray(grad)[..., -k:]).sum() > 0


def test_synthetic_covariates_are_deterministic_and_announce_the_coming_candles():
    a = synthetic.generate("BTCUSDT", "1h", 6000, covariates=True)
    b = synthetic.generate("BTCUSDT", "1h", 6000, covariates=True)
    np.testing.assert_array_equal(a.covariates, b.covariates)
    np.testing.assert_array_equal(a.ohlcv, b.ohlcv)
    plain = synthetic.generate("BTCUSDT", "1h", 6000)
    assert plain.covariate_names == () and plain.covariates.shape == (6000, 0)
    assert a.covariate_names == ("vol_signal", "flow", "noise", "price_transform")
    lookback, horizon = 30, 10  # the variant's (configs/mlp.py:covariates)
    ends = np.arange(lookback, 6000 - horizon)
    log_range = np.log(a.ohlcv[:, 1] / a.ohlcv[:, 2])
    coming = np.log([log_range[t + 1 : t + horizon + 1].mean() for t in ends])
    # What the volatility band (the window's EWMA range) does not already know.
    unknown = coming - np.log(band.ewma_range(a.ohlcv[:, :4], ends, lookback))
    log_c = np.log(a.ohlcv[:, 3])
    move = (log_c[ends + horizon] - log_c[ends]) / np.exp(coming)  # in the horizon's ranges
    vol, flow, noise, price = a.covariates[ends].T
    assert np.corrcoef(vol, coming)[0, 1] > 0.4
    assert np.corrcoef(vol, unknown)[0, 1] > 0.3
    assert np.corrcoef(flow, move)[0, 1] > 0.3
    assert abs(np.corrcoef(vol, move)[0, 1]) < 0.05  # a volatility, no direction
    assert abs(np.corrcoef(flow, coming)[0, 1]) < 0.05  # a direction, no volatility
    assert max(abs(np.corrcoef(noise, x)[0, 1]) for x in (coming, move)) < 0.05
    # price_transform at row t: closes up to t only (a plain EMA loop).
    alpha, ema, want = 2 / 21, log_c[0], []
    for x in log_c[:200]:
        ema = (1 - alpha) * ema + alpha * x
        want.append(x - ema)
    sigma_bar = 0.55 * np.sqrt(INTERVAL_MS["1h"] / (365 * 86_400_000))
    np.testing.assert_allclose(a.covariates[:200, 3], np.array(want) / sigma_bar, atol=1e-9)


def _ar1_loop(draws, phi, sd):
    x = [sd * draws[0]]
    for d in draws[1:]:
        x.append(phi * x[-1] + sd * np.sqrt(1 - phi**2) * d)
    return np.array(x)


def test_synthetic_announcements_are_the_latent_paths_of_the_coming_candles(monkeypatch):
    """Row t of vol_signal and flow holds the volatility multiplier's and the drift's path
    over candles t+1..t+ANNOUNCED plus its own noise, drawn from the covariates' stream
    alone (plain loops here): no return and no candle shock after t."""
    n, ahead = 3000, synthetic.ANNOUNCED
    s = synthetic.generate("ETHUSDT", "15m", n, covariates=True)
    plain = synthetic.generate("ETHUSDT", "15m", n)
    names = ("ETHUSDT", "15m", "covariates")
    rng = np.random.default_rng([0, *(zlib.crc32(x.encode()) for x in names)])
    h = _ar1_loop(rng.standard_normal(n + ahead), synthetic.PHI, synthetic.SD) - synthetic.SD**2
    g = _ar1_loop(rng.standard_normal(n + ahead), synthetic.DRIFT_PHI, synthetic.DRIFT_SD)
    coming_vol = [0.5 * np.log(np.mean(np.exp(2 * h[t + 1 : t + ahead + 1]))) for t in range(n)]
    coming_drift = [g[t + 1 : t + ahead + 1].mean() for t in range(n)]
    want_vol = coming_vol + synthetic.VOL_SIGNAL_NOISE * rng.standard_normal(n)
    want_flow = coming_drift + synthetic.FLOW_NOISE * rng.standard_normal(n)
    np.testing.assert_allclose(s.covariates[:, 0], want_vol, atol=1e-12)
    np.testing.assert_allclose(s.covariates[:, 1], want_flow, atol=1e-12)
    np.testing.assert_array_equal(s.covariates[:, 2], rng.standard_normal(n))
    # Candle t's return is the plain one plus g_t of its sigma, scaled by exp(h_t).
    r_cov, r_plain = (np.diff(np.log(x.ohlcv[:, 3])) for x in (s, plain))
    drift = r_cov / np.exp(h[1:n]) - r_plain
    np.testing.assert_array_equal(
        np.sign(drift[np.abs(g[1:n]) > 1e-6]), np.sign(g[1:n][np.abs(g[1:n]) > 1e-6])
    )
    monkeypatch.setattr(synthetic, "DRIFT_SD", 0.0)
    r_vol_only = np.diff(
        np.log(synthetic.generate("ETHUSDT", "15m", n, covariates=True).ohlcv[:, 3])
    )
    np.testing.assert_allclose(r_vol_only, r_plain * np.exp(h[1:n]), atol=1e-12)


def test_synthetic_covariates_need_the_synthetic_switch():
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/mlp.py:covariates"))
    config_lib.validate(c)
    c.data.synthetic_covariates = False
    with pytest.raises(ConfigError, match="unless data.synthetic_covariates=True"):
        config_lib.validate(c)
