"""A covariate model forecasting from the newest candles: Model.predict equals the run's
own forecast of the same window, scales with the saved statistics (never re-fitted),
names a missing or absent column; a pooled run's model on a pair it never saw fits that
pair's covariate statistics on its own candles (docs/design.md "Covariates")."""

import os
import shutil

import jax
import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.data import frames as frames_lib
from cpbjax.data import latest, synthetic
from cpbjax.modes import predict as predict_mode
from cpbjax.modes import serve
from cpbjax.score import forecast, zero_shot
from tests import helpers, http_helpers

OHLC = ["open", "high", "low", "close"]


def _frame(symbol: str, n: int = 700) -> pd.DataFrame:
    """A synthetic 1h series as a frame with a `funding` column (vol_signal), two NaN."""
    s = synthetic.generate(symbol, "1h", n, covariates=True)
    frame = pd.DataFrame(s.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame["funding"] = s.covariates[:, 0]
    frame.loc[frame.index[300:302], "funding"] = np.nan
    frame.index = pd.to_datetime(s.open_time_ms, unit="ms", utc=True)
    return frame


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A pooled tiny run fitted on two frames with a funding column, its forecasts saved."""
    c = helpers.tiny_config()
    c.data.max_candles, c.data.min_candles = 600, 300
    c.data.covariates, c.train.epochs = ("funding",), 1
    c.train.share, c.eval.save_forecasts = "pooled", True
    frames = {f"{s}-1h": _frame(s) for s in ("BTCUSDT", "ETHUSDT")}
    workdir = str(tmp_path_factory.mktemp("covpred") / "run")
    cpbjax.fit(frames, c, workdir)
    return workdir, frames


def _model(workdir):
    return cpbjax.load(workdir_lib.series_model(workdir, "BTCUSDT-1h"))


def test_predict_equals_the_runs_own_forecast_of_the_same_window(run):
    workdir, frames = run
    saved = forecast.load_forecasts(workdir_lib.forecasts_file(workdir, "BTCUSDT-1h"))
    last = pd.Timestamp(int(saved["last_open_time_ms"][-1]), unit="ms", tz="UTC")
    frame = frames["BTCUSDT-1h"]
    got = _model(workdir).predict(frame[frame.index <= last])
    want_HC = forecast.consistent_ohlc(saved["predicted"][-1])
    np.testing.assert_allclose(got[OHLC].to_numpy(), want_HC, rtol=1e-5)


def test_predict_reads_the_newest_windows_covariates_with_the_saved_statistics(run):
    workdir, frames = run
    model, frame = _model(workdir), frames["BTCUSDT-1h"]
    base = model.predict(frame)
    older = frame.copy()  # values before the newest window: re-fitted statistics would move
    older.iloc[: -model.lookback - 5, older.columns.get_loc("funding")] *= 10.0
    pd.testing.assert_frame_equal(model.predict(older), base)
    newer = frame.copy()
    newer.iloc[-3:, newer.columns.get_loc("funding")] += 5.0
    assert not np.allclose(model.predict(newer)[OHLC], base[OHLC], rtol=1e-6)


def test_a_covariate_missing_in_the_newest_window_names_the_column_and_time(run):
    workdir, frames = run
    model, frame = _model(workdir), frames["BTCUSDT-1h"].copy()
    filled = frame.copy()
    filled.iloc[-3:, filled.columns.get_loc("funding")] = np.nan  # within covariate_fill=3
    assert len(model.predict(filled)) == model.horizon
    frame.iloc[-6:-1, frame.columns.get_loc("funding")] = np.nan
    when = frame.index[-2].strftime("%Y-%m-%dT%H:%M:%SZ")
    with pytest.raises(ValueError, match=rf"BTCUSDT-1h: .*'funding' has no value at {when}"):
        model.predict(frame)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: f.drop(columns="funding"), r"BTCUSDT-1h: .*column 'funding' is absent"),
        (lambda f: f.assign(funding="x"), r"BTCUSDT-1h: .*column 'funding' is not numeric"),
    ],
    ids=["absent", "non-numeric"],
)
def test_a_bad_covariate_column_names_the_series_and_the_column(run, damage, message):
    workdir, frames = run
    with pytest.raises(ValueError, match=message):
        _model(workdir).predict(damage(frames["BTCUSDT-1h"]))


def test_predict_mode_reads_the_covariates_of_the_local_files(run):
    workdir, frames = run
    config = config_lib.upgrade(writers.read_json(workdir_lib.config_json(workdir)))
    doc = predict_mode.run_predict(config, workdir)
    assert not doc["skipped"]
    for name, frame in frames.items():  # the run's local files are these frames
        want = cpbjax.load(workdir_lib.series_model(workdir, name)).predict(frame)
        got = pd.DataFrame(doc["series"][name]["forecast"])[OHLC].to_numpy()
        np.testing.assert_allclose(got, want[OHLC].to_numpy(), rtol=1e-6)


def test_predict_mode_topped_up_from_the_api_says_covariates_need_a_local_source(run):
    workdir, _ = run
    proc = helpers.run_launch(
        "--mode=predict",
        f"--workdir={workdir}",
        "--config.data.source=binance",
        "--config.data.covariates=()",
        "--config.data.local_dir=",
        jax_platforms="cpu",
    )
    last = helpers.exit_2_line(proc)
    assert "covariates need a local source or frames" in last and "binance_rest" in last


def test_serve_forecasts_a_covariate_model_from_the_local_files(run):
    workdir, frames = run
    config = config_lib.upgrade(writers.read_json(workdir_lib.config_json(workdir)))
    served = serve.Forecaster(config, workdir).forecast("BTCUSDT-1h")
    want = _model(workdir).predict(frames["BTCUSDT-1h"])
    got = pd.DataFrame(served["forecast"])[OHLC].to_numpy()
    np.testing.assert_allclose(got, want[OHLC].to_numpy(), rtol=1e-6)


def _posted(frame: pd.DataFrame) -> dict:
    """serve's POST body of `frame`: open times in ISO-8601, NaN as null."""
    rows = frame.astype(object).where(frame.notna(), None)
    times = frame.index.strftime("%Y-%m-%dT%H:%M:%SZ")
    records = rows.to_dict("records")
    return {"candles": [{"open_time": t, **r} for t, r in zip(times, records, strict=True)]}


def test_serve_forecasts_posted_candles_with_their_covariates_as_predict_does(run):
    workdir, frames = run
    config = config_lib.upgrade(writers.read_json(workdir_lib.config_json(workdir)))
    frame = frames["BTCUSDT-1h"].iloc[-400:].copy()
    frame.iloc[-2, frame.columns.get_loc("funding")] = np.nan  # filled, as predict fills it
    want = _model(workdir).predict(frame)
    with http_helpers.serving(serve.build_app(serve.Forecaster(config, workdir))) as port:
        status, body, _ = http_helpers.post_json(port, "/forecast/BTCUSDT-1h", _posted(frame))
        assert status == 200, body
        got = pd.DataFrame(body["forecast"])[OHLC].to_numpy()
        np.testing.assert_allclose(got, want[OHLC].to_numpy(), rtol=1e-6)
        assert body["series"] == "BTCUSDT-1h" and body["horizon"] == len(want)
        status, body, _ = http_helpers.post_json(
            port, "/forecast/BTCUSDT-1h", _posted(frame.drop(columns="funding"))
        )
        assert status == 422 and "column 'funding' is absent" in body["error"], body


def test_the_export_lists_the_covariates_and_its_forward_pass_takes_them(run):
    workdir, frames = run
    folder = cpbjax.export(workdir)["BTCUSDT-1h"]
    model, frame = _model(workdir), frames["BTCUSDT-1h"]
    listed = writers.read_json(os.path.join(folder, "manifest.json"))["covariates"]
    norm = model.loaded.norm
    assert listed["names"] == ["funding"] and listed["scaling"] == "zscore"
    np.testing.assert_array_equal(listed["mean"], norm["covariate_mean"])
    np.testing.assert_array_equal(listed["std"], norm["covariate_std"])
    pd.testing.assert_frame_equal(cpbjax.load(folder).predict(frame), model.predict(frame))
    d = model.config.data
    series = frames_lib.candles_to_series(
        frame, "BTCUSDT", "1h", frames_lib.volume_features(d), d.covariates
    )
    x_1LF = latest.prepare_latest(series, d, norm).inputs[None, -d.lookback :]
    assert x_1LF.shape[-1] == len(d.features) + 1
    with open(os.path.join(folder, "forward.jax_export"), "rb") as f:
        forward = jax.export.deserialize(f.read())
    params = model.loaded.params
    expected = model.loaded.module.apply({"params": params}, x_1LF, None, train=False)
    np.testing.assert_allclose(forward.call(params, x_1LF), expected, rtol=1e-6, atol=1e-7)


def test_an_export_whose_manifest_misstates_the_covariates_is_refused(run, tmp_path):
    workdir, _ = run
    folder = shutil.copytree(cpbjax.export(workdir)["ETHUSDT-1h"], tmp_path / "ETHUSDT-1h")
    path = os.path.join(folder, "manifest.json")
    found = writers.read_json(path)
    found["covariates"]["std"] = [1.0]
    writers.write_json(path, found)
    with pytest.raises(ValueError, match=r"manifest.json: its 'covariates' are .* export the run"):
        cpbjax.load(str(folder))


def test_a_new_pair_scales_its_covariates_on_its_own_candles(run):
    workdir, _ = run
    frame = _frame("SOLUSDT")
    whole = cpbjax.load(workdir)
    got = whole.predict(frame, symbol="SOLUSDT")
    assert len(got) == whole.model_for("SOLUSDT", "1h").horizon
    # Its z-score is fitted on the candles given, so an affine change of units is no change.
    rescaled = frame.assign(funding=3.0 * frame["funding"] - 7.0)
    got_rescaled = whole.predict(rescaled, symbol="SOLUSDT")
    np.testing.assert_allclose(got_rescaled[OHLC], got[OHLC], rtol=1e-5)
    moved = frame.copy()
    moved.iloc[-3:, moved.columns.get_loc("funding")] += 5.0
    assert not np.allclose(whole.predict(moved, symbol="SOLUSDT")[OHLC], got[OHLC], rtol=1e-6)


def test_a_new_pairs_fits_leave_out_the_windows_missing_a_covariate(run):
    workdir, _ = run
    frame = _frame("SOLUSDT")
    frame.iloc[400:410, frame.columns.get_loc("funding")] = np.nan  # 403..409 past the fill
    model = cpbjax.load(workdir).model_for("SOLUSDT", "1h")
    d = model.config.data
    series = frames_lib.candles_to_series(
        frame, "SOLUSDT", "1h", frames_lib.volume_features(d), d.covariates
    )
    prep = latest.prepare_latest(series, d, None)
    _, fitted_on = zero_shot.fit_series(model.loaded, prep)
    missing = set(frame.index.as_unit("ms").asi8[403:410])
    L, H, times = d.lookback, d.horizon, prep.open_time_ms  # gap-free synthetic candles
    expected = sum(
        not missing.intersection(times[t - L + 1 : t + 1]) for t in range(L - 1, len(times) - H)
    )
    assert fitted_on == expected < len(times) - H - L + 1
