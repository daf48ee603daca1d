"""cpbjax.fit on pandas frames: trained from a dict of frames and from one long frame, its
models predict exactly what a launch.py run on the same candles (read from a Vision-layout
mirror), config and seed predicts; bad frames get Model.predict's named errors."""

import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import workdir as workdir_lib
from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.data import features, sources, synthetic
from tests import fake_data, helpers

SYMBOLS = ("BTCUSDT", "ETHUSDT")
MONTHS = ("2024-01", "2024-02")
OHLCV = ["open", "high", "low", "close", "volume"]


def _config(mirror: str):
    """tiny GRU, 1 epoch, on the mirror. No baseline and no early-stopping margin, so the
    kept model is epoch 1's trained params (an untrained band would predict the same
    whatever the training did)."""
    c = config_lib.load(os.path.join(helpers.ROOT, "configs/gru.py:tiny"))
    c.data.source, c.data.base_url = "binance", mirror
    c.data.months, c.data.end = len(MONTHS), MONTHS[-1]
    c.data.symbols, c.data.intervals = SYMBOLS, ("1h",)
    c.data.max_candles, c.model.hidden, c.model.num_layers = 700, 16, 1
    c.model.baseline, c.train.min_delta = "none", 0.0
    c.train.epochs, c.eval.plots = 1, False
    return c


def _flags(mirror: str) -> list[str]:
    """_config as launch.py flags."""
    return [
        "--config=configs/gru.py:tiny",
        "--config.data.source=binance",
        f"--config.data.base_url={mirror}",
        f"--config.data.months={len(MONTHS)}",
        f"--config.data.end={MONTHS[-1]}",
        f"--config.data.symbols={SYMBOLS!r}",
        "--config.data.intervals=('1h',)",
        "--config.data.max_candles=700",
        "--config.model.hidden=16",
        "--config.model.num_layers=1",
        "--config.model.baseline=none",
        "--config.train.min_delta=0",
        "--config.train.epochs=1",
        "--config.eval.plots=False",
    ]


def _frames(mirror: str) -> dict[str, pd.DataFrame]:
    """The mirror's candles as UTC-indexed OHLCV frames, by series name."""
    series, skipped = sources.load_all(config_lib.validate(_config(mirror)).data)
    assert not skipped
    frames = {}
    for s in series:
        frame = pd.DataFrame(s.ohlcv, columns=OHLCV)
        frame.index = pd.to_datetime(s.open_time_ms, unit="ms", utc=True)
        frames[s.name] = frame
    return frames


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"frames", "launched": launch.py's workdir, "dict_run": fit's workdir from a dict,
    "from_dict", "from_long": fit's models from a dict and from a long frame without
    volume, into a temporary workdir}; the launch runs while the fits train here."""
    root = tmp_path_factory.mktemp("fit")
    mirror = str(root / "mirror")
    synthetic.write_vision_mirror(mirror, SYMBOLS, ("1h",), MONTHS)
    launched = str(root / "launch")
    proc = subprocess.Popen(
        [sys.executable, "launch.py", f"--workdir={launched}", *_flags(mirror)],
        cwd=helpers.ROOT,
        env=helpers.subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    frames = _frames(mirror)
    dict_run = str(root / "dict")
    from_dict = cpbjax.fit(frames, _config(mirror), dict_run)
    # One long frame, its series' rows interleaved in time, volume left out.
    long = pd.concat([f.drop(columns="volume").assign(series=n) for n, f in frames.items()])
    long = long.sample(frac=1.0, random_state=0).sort_index(kind="stable")
    with mock.patch.object(tempfile, "tempdir", str(root)):
        from_long = cpbjax.fit(long, _config(mirror))
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    temporary = [d for d in os.listdir(root) if d.startswith("cpbjax-fit-")]
    assert len(temporary) == 1 and os.path.isdir(root / temporary[0] / "models" / "BTCUSDT-1h")
    return dict(
        frames=frames,
        launched=launched,
        dict_run=dict_run,
        from_dict=from_dict,
        from_long=from_long,
    )


def test_fit_models_predict_as_a_launch_run_on_the_same_candles(runs):
    results = writers.read_json(workdir_lib.results_json(runs["launched"]))
    assert list(runs["from_dict"]) == list(runs["from_long"]) == [f"{s}-1h" for s in SYMBOLS]
    for name, frame in runs["frames"].items():
        assert results["series"][name]["best_epoch"] == 1  # trained params, not the init
        want = cpbjax.load(workdir_lib.series_model(runs["launched"], name)).predict(frame)
        got = runs["from_dict"][name].predict(frame)
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        # Volume left out: no feature reads it (data.features is OHLC), so it changes nothing.
        got = runs["from_long"][name].predict(frame.drop(columns="volume"))
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_fit_writes_an_ordinary_run_that_reads_its_own_frames(runs):
    frames, workdir, name = runs["frames"], runs["dict_run"], "ETHUSDT-1h"
    saved = config_lib.upgrade(writers.read_json(workdir_lib.config_json(workdir)))
    assert saved.data.source == "local" and saved.data.local_dir == workdir_lib.frames_dir(workdir)
    assert saved.data.base_url == config_lib.base_config().data.base_url  # not the mirror's
    stored = pd.read_parquet(workdir_lib.frames_file(workdir, name))
    np.testing.assert_array_equal(stored[OHLCV].to_numpy(), frames[name].to_numpy())
    # The same workdir with other candles would mix two runs' data: refused, nothing written.
    before = os.path.getmtime(workdir_lib.frames_file(workdir, name))
    moved = {n: f * (1.01 if n == name else 1.0) for n, f in frames.items()}
    with pytest.raises(ValueError, match=f"holds other candles of {name}: fit into a new"):
        cpbjax.fit(moved, saved, workdir)
    assert os.path.getmtime(workdir_lib.frames_file(workdir, name)) == before


DAMAGES = [
    (lambda f: f.tz_localize(None), "timezone-aware UTC"),
    (lambda f: f.assign(close=f["close"].where(f.index != f.index[-2])), "NaN"),
    (lambda f: f.drop(columns="close"), "lack the columns ['close']"),
    (lambda f: f.iloc[::-1], "strictly increasing"),
    (lambda f: f.iloc[::4], "forecasts 1h candles"),
    (lambda f: f.assign(high=f["low"] * 0.5), "high below max(open, close)"),
]


@pytest.mark.parametrize("damage, message", DAMAGES)
def test_fit_names_a_bad_frame_as_model_predict_does(runs, damage, message, tmp_path):
    frames, launched, name = runs["frames"], runs["launched"], "ETHUSDT-1h"
    with pytest.raises(ValueError, match=re.escape(message)) as by_predict:
        cpbjax.load(workdir_lib.series_model(launched, name)).predict(damage(frames[name]))
    bad = dict(frames, **{name: damage(frames[name])})
    with pytest.raises(ValueError) as by_fit:
        cpbjax.fit(bad, _config("unused"), str(tmp_path / "run"))
    assert str(by_fit.value) == f"{name}: {by_predict.value}"
    assert not os.path.exists(tmp_path / "run")  # refused before anything is written


def test_fit_refuses_a_frame_without_volume_where_a_feature_reads_it(tmp_path):
    config = _config("unused")
    config.data.features = ("open", "high", "low", "close", "volume_norm")
    frame = _frames_of(fake_data.make_series(symbol="BTCUSDT")).drop(columns="volume")
    message = "BTCUSDT-1h: candles lack the columns ['volume'] (need ['open', 'high', 'low', "
    message += "'close', 'volume']; data.features ['volume_norm'] read volume)"
    with pytest.raises(ValueError, match=re.escape(message)):
        cpbjax.fit({"BTCUSDT-1h": frame}, config, str(tmp_path / "run"))


@pytest.mark.parametrize(
    "frames, message",
    [
        ({"BTCUSDT": None}, "series name 'BTCUSDT' is not <SYMBOL>-<INTERVAL>"),
        (pd.DataFrame({"close": [1.0]}), "a long frame needs a 'series' column"),
        ({}, "frames must be a non-empty dict"),
    ],
)
def test_fit_names_frames_it_cannot_read(frames, message, tmp_path):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cpbjax.fit(frames, _config("unused"), str(tmp_path / "run"))


def _frames_of(series) -> pd.DataFrame:
    frame = pd.DataFrame(series.ohlcv, columns=OHLCV)
    frame.index = pd.to_datetime(series.open_time_ms, unit="ms", utc=True)
    return frame


def test_the_volume_features_are_the_features_that_read_the_volume():
    """features.VOLUME_FEATURES, which makes volume optional, against what compute does:
    the columns that change when only the volume changes."""
    s = fake_data.make_series(n=2000)
    other = s.ohlcv.copy()
    other[:, 4] = np.random.default_rng(1).uniform(1.0, 9.0, len(other))
    got = [features.compute(x, features.NAMES, "1h", s.open_time_ms)[0] for x in (s.ohlcv, other)]
    moved = [
        n
        for j, n in enumerate(features.NAMES)
        if not np.array_equal(got[0][:, j], got[1][:, j], equal_nan=True)
    ]
    assert sorted(moved) == sorted(features.VOLUME_FEATURES)
