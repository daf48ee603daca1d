"""launch.py's and cpbjax.fit's messages of issue #55: each names the bad thing in one line
(exit 2 where the run cannot go on)."""

import datetime
import logging
import os

import ml_collections
import pytest

from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=120):
    return helpers.run_launch(*args, jax_platforms="cpu", timeout=timeout)


def _one_error_line(proc, alone: bool = True) -> str:
    """The single `error: ...` line of a run that exited 2: its last line on stderr, and,
    if `alone` (refused before the run logs anything), its only one."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error")] == lines[-1:], lines[-3:]
    assert len(lines) == 1 or not alone, proc.stderr[-2000:]
    return lines[-1]


@pytest.mark.parametrize(
    "extra, says",
    [
        (["predict"], "error: unexpected argument 'predict' (did you mean --mode predict?)"),
        (["foo", "bar"], "error: unexpected arguments 'foo', 'bar'"),
    ],
)
def test_a_stray_argument_is_named_not_ignored(tmp_path, extra, says):
    workdir = tmp_path / "run"
    proc = _launch("--config", "configs/gru.py:tiny", *extra, "--workdir", str(workdir))
    assert _one_error_line(proc) == says
    assert not workdir.exists()  # nothing trained


@pytest.mark.parametrize(
    "override, says",
    [
        ("--config.trian.epochs=3", "unknown config key trian in --config.trian.epochs"),
        ("--config.train.epoch=3", "unknown config key epoch in --config.train.epoch"),
        ("--config.data.nope=1", "unknown config key nope in --config.data.nope"),
        ("--config.train.optim.x=1", "unknown config key optim in --config.train.optim.x"),
        ("--config.train.epochs.x=1", "unknown config key x in --config.train.epochs.x"),
        ("--config.data.symbols.x=1", "goes inside a tuple value"),
    ],
)
def test_a_mistyped_config_key_is_named_in_one_line(override, says):
    line = _one_error_line(_launch("--mode=data", "--config", "configs/gru.py:tiny", override))
    assert says in line and "\\n" not in line, line


def test_a_mistyped_config_key_gets_the_suggestion():
    line = _one_error_line(
        _launch("--mode=data", "--config", "configs/gru.py:tiny", "--config.train.epoch=3")
    )
    assert line.endswith("(did you mean epochs?)"), line


@pytest.mark.parametrize("mode", ["evaluate", "predict", "export", "serve"])
def test_a_mode_that_reads_a_run_asks_for_its_workdir_not_a_config(mode):
    line = _one_error_line(_launch("--mode", mode))
    assert line == f"error: --mode {mode} needs --workdir of a trained run"


@pytest.mark.parametrize("args", [(), ("--mode", "data"), ("--mode=backtest",)])
def test_a_mode_that_reads_a_config_asks_for_it_with_an_example(args):
    mode = args[-1].rpartition("=")[2] if args else "train"
    line = _one_error_line(_launch(*args))
    assert line.startswith(f"error: --mode {mode} needs --config, e.g. --config configs/"), line


# ---------------------------------------------------------------------------
# --mode predict without the exchange API, and stale forecasts.

SYMBOLS = ("BTCUSDT", "ETHUSDT")


def _last_months(n: int) -> list[str]:
    """The n calendar months before this one, oldest first ("YYYY-MM")."""
    first, months = datetime.date.today().replace(day=1), []
    for _ in range(n):
        first = (first - datetime.timedelta(days=1)).replace(day=1)
        months.append(first.strftime("%Y-%m"))
    return sorted(months)


@pytest.fixture(scope="module")
def mirror_run(tmp_path_factory):
    """A workdir of untrained per-series models on a Binance Vision mirror whose newest
    candle is last month's, and whose data.api_url nothing listens on."""
    import jax
    import numpy as np

    from cpbjax import models, writers
    from cpbjax.config import schema as config_lib
    from cpbjax.data import synthetic
    from cpbjax.training import checkpoint

    root = tmp_path_factory.mktemp("mirror_run")
    c = config_lib.load("configs/gru.py:tiny")
    c.data.symbols, c.data.intervals, c.data.months = SYMBOLS, ("1h",), 2
    c.data.source, c.data.base_url = "binance", str(root / "mirror")
    c.data.cache_dir, c.data.api_url, c.data.retries = str(root / "cache"), UNREACHABLE, 0
    synthetic.write_vision_mirror(c.data.base_url, SYMBOLS, ("1h",), _last_months(2))
    module = models.build(models.make_config(c))
    x = np.zeros((1, c.data.lookback, len(c.data.features)), np.float32)
    params = jax.jit(module.init)(jax.random.key(0), x, None)["params"]
    for symbol in SYMBOLS:
        path = root / "run" / "models" / f"{symbol}-1h"
        checkpoint.save_series_model(str(path), params, {"config": c.to_dict()})
    writers.write_json(str(root / "run" / "config.json"), c)
    return str(root / "run")


UNREACHABLE = "http://127.0.0.1:9"  # the discard port: the connection is refused at once


def test_predict_without_the_exchange_says_so_in_one_short_line_with_the_fix(mirror_run):
    line = _one_error_line(_launch("--mode=predict", f"--workdir={mirror_run}"), alone=False)
    assert len(line) < 300, line
    assert "no fresh candles for 2 series" in line, line
    assert f"{UNREACHABLE} did not connect" in line, line
    assert "--config.predict.fresh=False" in line, line


def test_the_fix_forecasts_and_warns_of_the_stale_series_in_one_line(mirror_run):
    proc = _launch("--mode=predict", f"--workdir={mirror_run}", "--config.predict.fresh=False")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stale = [line for line in proc.stderr.splitlines() if "STALE" in line]
    assert len(stale) == 1, stale
    assert "STALE: 2 of 2 series (BTCUSDT-1h, ETHUSDT-1h): the newest candle is" in stale[0]


def test_forty_unreachable_series_are_one_short_line():
    """The 7.3 KB message of #55: 40 reasons, the first with a kline request's URL."""
    from cpbjax.modes import predict

    url = f"{UNREACHABLE}/api/v3/klines?symbol=S0USDT&interval=1h&startTime=1&limit=1000"
    skipped = {"S0USDT-1h": f"fresh candles: request failed for {url} (ConnectionError: {url})"}
    skipped.update(
        {
            f"S{i}USDT-1h": f"fresh candles: not requested: {UNREACHABLE} did not connect for "
            "S0USDT-1h"
            for i in range(1, 40)
        }
    )
    data = ml_collections.ConfigDict({"source": "binance_rest", "api_url": UNREACHABLE})
    line = predict.nothing_forecast(skipped, data)
    assert len(line) < 300 and "\n" not in line, line
    assert "no fresh candles for 40 series" in line and "--config.predict.fresh=False" in line
    del skipped["S1USDT-1h"], skipped["S2USDT-1h"]  # one series: its reason, clipped
    line = predict.nothing_forecast({"S0USDT-1h": skipped["S0USDT-1h"]}, data)
    assert len(line) < 300 and "S0USDT-1h: request failed" in line, line
    assert "startTime" not in line, line


def test_forty_stale_series_are_one_warning(caplog):
    from cpbjax.data.series import INTERVAL_MS
    from cpbjax.modes import predict

    step = INTERVAL_MS["1h"]
    now = 1_750_000_000_000 // step * step
    series = {
        f"S{i}USDT-1h": {
            "symbol": f"S{i}USDT",
            "interval": "1h",
            "last_open_time": f"t-{i}",
            "last_open_time_ms": now - (2 + i) * step,
            "forecast": [{}] * 10,
        }
        for i in range(40)
    }
    with caplog.at_level(logging.WARNING):
        predict.warn_stale(series, "binance", now)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(
        "STALE: 40 of 40 series (S0USDT-1h, S1USDT-1h, S2USDT-1h and 37 more): the newest "
        "candle is 2 to 41 intervals old (the oldest t-39)"
    ), warning
    assert series["S5USDT-1h"]["age_intervals"] == 7


# ---------------------------------------------------------------------------
# cpbjax.fit logs, never prints.


def test_fit_logs_its_workdir_summary_and_the_candles_the_cap_leaves_out(tmp_path, capsys, caplog):
    import pandas as pd

    import cpbjax
    from cpbjax.config import schema as config_lib
    from cpbjax.data import synthetic, windows

    c = config_lib.load("configs/gru.py:tiny")  # data.max_candles=1200
    c.model.hidden, c.model.num_layers, c.train.epochs, c.eval.plots = 16, 1, 1, False
    s = synthetic.generate("BTCUSDT", "1h", 1500)
    frame = pd.DataFrame(s.ohlcv, columns=["open", "high", "low", "close", "volume"])
    frame.index = pd.to_datetime(s.open_time_ms, unit="ms", utc=True)
    _, first_valid = windows.series_features(s, c.data.features)
    left_out = 1500 - 1200 - first_valid
    workdir = str(tmp_path / "fit")
    with caplog.at_level(logging.INFO, logger="absl"):
        models = cpbjax.fit({"BTCUSDT-1h": frame}, c, workdir)
    assert list(models) == ["BTCUSDT-1h"]
    assert capsys.readouterr().out == ""  # the results table is launch.py's, not fit's
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cpbjax.fit")]
    (cut,) = [m for m in said if "max_candles" in m]
    assert cut == (
        "cpbjax.fit: data.max_candles=1200 keeps the newest 1200 candles of each series past "
        f"the indicator warm-up: {left_out} candles of 1 series left out (BTCUSDT-1h "
        f"{left_out}); data.max_candles=0 keeps them all"
    )
    assert f"cpbjax.fit: trained 1 of 1 series in {workdir} (report {workdir}/report.md)" in said
    assert any("Close skill against the better naive forecast" in m for m in said), said
