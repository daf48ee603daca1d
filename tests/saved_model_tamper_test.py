"""The saved-model tamper matrix: a workdir's models/<SERIES>/ is verified like an export.

One tiny run of two series is trained once (cpbjax.fit); each case copies a model folder
(or the whole workdir), changes one thing as a careless user, a failing disk or an
attacker would, and uses it through `cpbjax.load(...).predict`, `--mode predict`,
`--mode export` or serve: refused with one line naming the file (and the series), and
never a forecast of NaN prices. A folder saved before manifests loads with one warning.
"""

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import pytest

import cpbjax
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib
from cpbjax.config_rules import ConfigError
from cpbjax.data import synthetic
from cpbjax.modes import init_from, serve, trained_run
from cpbjax.training import checkpoint
from tests import helpers, http_helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES, OTHER = "BTCUSDT-1h", "ETHUSDT-1h"
DAMAGED = r"params/\S+: sha256 does not match its manifest \(the saved model is damaged"


def _frame(symbol: str) -> pd.DataFrame:
    s = synthetic.generate(symbol, "1h", 1500)
    frame = pd.DataFrame(s.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame.index = pd.to_datetime(s.open_time_ms, unit="ms", utc=True)
    return frame


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, BTCUSDT-1h candles): a tiny GRU of BTCUSDT-1h and ETHUSDT-1h, 1 epoch."""
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.model.hidden, c.model.num_layers, c.train.epochs, c.eval.plots = 16, 1, 1, False
    workdir = str(tmp_path_factory.mktemp("saved_tamper") / "run")
    frames = {SERIES: _frame("BTCUSDT"), OTHER: _frame("ETHUSDT")}
    assert list(cpbjax.fit(frames, c, workdir)) == [SERIES, OTHER]
    return workdir, frames[SERIES]


@pytest.fixture
def model(run, tmp_path):
    """A fresh copy of BTCUSDT-1h's saved model folder, under its own name."""
    return shutil.copytree(workdir_lib.series_model(run[0], SERIES), str(tmp_path / SERIES))


@pytest.fixture
def workdir(run, tmp_path):
    """A fresh copy of the whole trained workdir."""
    return shutil.copytree(run[0], str(tmp_path / "run"))


def _flip_bytes(folder: str) -> None:
    """8 bytes flipped in the middle of the largest file of the model's params."""
    files = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(folder, "params")) for n in ns]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(8)
        f.seek(-len(data), os.SEEK_CUR)
        f.write(bytes(b ^ 0xFF for b in data))


def _edit_meta(edit):
    def tamper(folder):
        path = os.path.join(folder, "meta.json")
        with open(path) as f:
            meta = json.load(f)
        edit(meta)
        with open(path, "w") as f:
            json.dump(meta, f)

    return tamper


def _double_k(meta):
    k = meta["interval_calibration"]["k"]
    meta["interval_calibration"]["k"] = (np.asarray(k) * 2).tolist()


def _nan_params(folder: str) -> None:
    """Re-saves the model (a valid manifest) with every param NaN."""
    params, meta = checkpoint.load_series_model(folder)
    nan = jax.tree.map(lambda a: np.full(np.shape(a), np.nan, np.asarray(a).dtype), params)
    checkpoint.save_series_model(folder, nan, meta)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (_flip_bytes, DAMAGED),
        (
            _edit_meta(lambda m: m["config"]["data"].__setitem__("lookback", 48)),
            r"meta\.json: data\.lookback is 48, but the model was saved with 30",
        ),
        (_edit_meta(_double_k), r"meta\.json: interval_calibration\.k is not the one the model"),
        (
            _edit_meta(lambda m: m["config"]["model"].__setitem__("baseline", "none")),
            r"meta\.json: model\.baseline is 'none', but the model was saved with 'vol_band'",
        ),
        (_nan_params, rf"{SERIES}: the forecast's prices are NaN or inf, so it is refused"),
    ],
    ids=["bit_flip", "lookback", "interval_k", "baseline", "nan_params"],
)
def test_a_tampered_saved_model_is_refused_naming_the_file(run, model, tamper, message):
    tamper(model)
    with pytest.raises(ValueError, match=message) as e:
        cpbjax.load(model).predict(run[1])
    assert len(str(e.value).splitlines()) == 1 and SERIES in str(e.value)


def test_a_model_copied_under_another_series_name_is_refused(model, tmp_path, run):
    renamed = shutil.move(model, str(tmp_path / OTHER))
    with pytest.raises(ValueError, match=rf"the model is of {SERIES}, but its folder is named"):
        cpbjax.load(renamed).predict(run[1])


def test_a_model_saved_before_manifests_loads_with_one_warning(model, run, caplog):
    os.remove(os.path.join(model, "manifest.json"))
    with caplog.at_level(logging.WARNING, logger="absl"):
        forecast = cpbjax.load(model).predict(run[1])
        cpbjax.load(model)  # loaded again: not warned again
    said = [r.getMessage() for r in caplog.records if "manifest" in r.getMessage()]
    assert said == [
        f"{model} has no manifest.json (saved before cpbjax verified saved models), so it "
        "is used unverified; training the run again into a new --workdir saves it with one"
    ]
    assert np.isfinite(forecast[["open", "high", "low", "close"]].to_numpy()).all()


def test_an_untouched_model_loads_and_forecasts(model, run):
    forecast = cpbjax.load(model).predict(run[1])
    assert np.isfinite(forecast[["open", "high", "low", "close"]].to_numpy()).all()


def _launch(mode: str, workdir: str):
    """launch.py --mode `mode` on `workdir` (its own config), BTCUSDT-1h alone."""
    cmd = [sys.executable, "launch.py", f"--mode={mode}", f"--workdir={workdir}"]
    cmd.append("--config.predict.symbols=('BTCUSDT',)")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return helpers.exit_2_line(done)


def test_predict_and_export_refuse_a_flipped_model_in_one_line(workdir):
    _flip_bytes(workdir_lib.series_model(workdir, SERIES))
    line = _launch("predict", workdir)
    assert line.startswith(f"error: no requested model could be read: {SERIES}: saved model")
    assert len(re.findall(DAMAGED, line)) == 1, line
    line = _launch("export", workdir)
    assert line.startswith("error: no saved model could be exported: "), line
    assert f"models/{SERIES}/params/" in line and "sha256 does not match" in line, line
    assert not os.path.exists(workdir_lib.export_dir(workdir, SERIES))  # nothing certified


def test_serve_answers_a_damaged_or_nan_model_in_json(workdir):
    _flip_bytes(workdir_lib.series_model(workdir, OTHER))
    _nan_params(workdir_lib.series_model(workdir, SERIES))
    forecaster = serve.Forecaster(trained_run.run_config_of(workdir), workdir)
    assert list(forecaster.models) == [SERIES]
    with http_helpers.serving(serve.build_app(forecaster)) as port:
        status, body, _ = http_helpers.request(port, f"/forecast/{OTHER}")
        assert status == 503 and f"models/{OTHER}/params/" in body["error"], body
        assert "sha256 does not match its manifest" in body["error"]
        status, body, _ = http_helpers.request(port, f"/forecast/{SERIES}")
        assert status == 500, body
        assert body["error"].startswith(f"{SERIES}: the forecast's prices are NaN or inf")
        status, body, _ = http_helpers.post_json(port, f"/forecast/{SERIES}", _posted(1000))
        assert status == 500, body  # the model's fault, not the posted candles'
        assert body["error"].startswith(f"{SERIES}: the forecast's prices are NaN or inf")


def _posted(n: int) -> dict:
    """serve's POST body of n synthetic BTCUSDT-1h candles."""
    s = synthetic.generate("BTCUSDT", "1h", n)
    names = ("open", "high", "low", "close", "volume")
    rows = [dict(zip(names, row, strict=True)) for row in s.ohlcv.tolist()]
    times = s.open_time_ms.tolist()
    return {"candles": [{"open_time": t, **r} for t, r in zip(times, rows, strict=True)]}


def test_init_from_refuses_a_damaged_source_in_one_line(workdir, tmp_path):
    _flip_bytes(workdir_lib.series_model(workdir, SERIES))
    c = trained_run.run_config_of(workdir)
    c.train.init_from = workdir
    with pytest.raises(ConfigError, match=rf"^train\.init_from='{workdir}': .*{DAMAGED}"):
        init_from.check_source(c, str(tmp_path / "next"))
