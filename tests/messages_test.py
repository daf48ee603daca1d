"""Messages that name the thing that is wrong (#44 items 7 and 8), each one line."""

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cpbjax.config import schema as config_lib
from cpbjax.config import sweep_grid
from cpbjax.config_rules import ConfigError
from cpbjax.data import frames, local_files, parsing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = pd.Timestamp("2024-01-01", tz="UTC")


def _candles(n=5):
    index = pd.date_range(T0, periods=n, freq="1h")
    close = 100.0 + np.arange(n)
    frame = pd.DataFrame(
        {"open": close, "high": close + 1, "low": close - 1, "close": close, "volume": 1.0},
        index=index,
    )
    return frame


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--config", "configs/nope.py"], "error: cannot load --config: [Errno 2] No such file"),
        (
            ["--config", "configs/gru.py:tiny", "--config.data.nope=1"],
            "error: unknown config key nope",
        ),
        (
            [
                "--config",
                "configs/gru.py:tiny",
                "--config.data.symbols=('BTCUSDT',)",
                "--config.data.symbols=('ETHUSDT',)",
            ],
            "error: --config.data.symbols is given more than once",
        ),
    ],
)
def test_the_data_table_cli_gives_one_line_and_exit_2(flags, words):
    proc = subprocess.run(
        [sys.executable, "launch.py", "--mode=data", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().startswith(words), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_word_in_a_close_column_is_named():
    frame = _candles().astype({"close": object})
    frame.iloc[3, 3] = "abc"
    with pytest.raises(
        ValueError, match=r"candles: column 'close' holds 'abc' \(row 3, index 2024"
    ):
        frames.candles_to_series(frame, "BTCUSDT", "1h", ())


def test_close_and_CLOSE_together_are_named():
    frame = _candles()
    frame["CLOSE"] = frame["close"]
    with pytest.raises(ValueError, match=r"candles have 'close' and 'CLOSE': one column each"):
        frames.candles_to_series(frame, "BTCUSDT", "1h", ())


def test_a_word_in_a_local_files_close_column_is_named(tmp_path):
    frame = _candles().reset_index(names="open_time")
    frame["close"] = frame["close"].astype(object)
    frame.loc[2, "close"] = "abc"
    frame.to_csv(tmp_path / "BTCUSDT-1h.csv", index=False)
    with pytest.raises(parsing.KlineError, match=r"BTCUSDT-1h.csv: column 'close' holds 'abc'"):
        local_files.read_local_file(str(tmp_path / "BTCUSDT-1h.csv"))


def test_a_sweep_grid_over_the_cap_is_refused_at_validation_with_its_cost():
    c = config_lib.load(os.path.join(ROOT, "configs/gru.py:tiny"))
    c.sweep.learning_rate = tuple(float(v) for v in np.geomspace(1e-5, 1e-2, 2000))
    c.sweep.weight_decay = (0.0, 0.1)
    c.data.symbols, c.data.intervals = ("BTCUSDT", "ETHUSDT"), ("1h",)
    assert c.sweep.max_settings == 64
    for refuse in (config_lib.validate, sweep_grid.settings):  # before the data, and on use
        with pytest.raises(ConfigError) as caught:
            refuse(c)
        message = str(caught.value)
        assert message.startswith(
            "config.sweep: the grid is 2000 sweep.learning_rate x 2 sweep.weight_decay = 4000 "
            "settings, over the cap of 64; with 2 series that is 8000 "
            f"models of {c.train.epochs} epochs, about 4000 times the training"
        )
        assert message.endswith("or raise the cap: --config.sweep.max_settings=4000")
    c.sweep.max_settings = 4000  # a raised cap lets it through
    config_lib.validate(c)
    c.sweep.max_settings = 0
    with pytest.raises(ConfigError, match="sweep.max_settings=0"):
        config_lib.validate(c)
    c.sweep.max_settings = 64
    c.sweep.learning_rate = c.sweep.learning_rate[:3]
    config_lib.validate(c)
    assert len(sweep_grid.settings(c)) == 6
