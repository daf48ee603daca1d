"""Tests for launch.py: bad flags exit 2 with one clear line; train and predict end to end."""

import json
import os
import time

import pytest

from cpbjax import writers
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=120):
    return helpers.run_launch(*args, jax_platforms="", timeout=timeout)


def test_out_of_range_value_exits_2_and_names_the_field():
    proc = _launch("--config", "configs/transformer.py", "--config.train.learning_rate=-1")
    assert proc.returncode == 2
    assert "config.train.learning_rate=-1.0" in proc.stderr
    assert "> 0" in proc.stderr


def test_unknown_key_exits_2_and_names_the_key():
    proc = _launch("--config", "configs/transformer.py", "--config.nonexistent=1")
    assert proc.returncode == 2
    assert "unknown config key nonexistent" in proc.stderr


def test_mistyped_value_exits_2():
    proc = _launch("--config", "configs/gru.py", "--config.train.epochs=many")
    assert proc.returncode == 2
    assert "config.train.epochs" in proc.stderr


def test_gpu_without_a_gpu_is_an_error_not_a_silent_cpu_run():
    import jax

    if jax.default_backend() == "gpu":
        pytest.skip("this machine has a GPU")
    proc = _launch("--config", "configs/gru.py:tiny", "--config.platform=gpu")
    assert proc.returncode == 2
    assert "no usable GPU" in proc.stderr


def test_only_the_tpu_probe_record_is_dropped_when_no_tpu_is_asked_for(caplog):
    import logging

    from cpbjax import runtime
    from cpbjax.config import schema as config_lib

    runtime.configure(config_lib.load("configs/gru.py:tiny"))  # platform=auto
    bridge = logging.getLogger("jax._src.xla_bridge")
    with caplog.at_level(logging.INFO, logger="jax._src.xla_bridge"):
        bridge.info("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
        bridge.info("Unable to initialize backend 'cuda': no CUDA devices")
    assert [r.getMessage() for r in caplog.records] == [
        "Unable to initialize backend 'cuda': no CUDA devices"
    ]


def test_evaluate_mode_needs_a_workdir():
    proc = _launch("--config", "configs/gru.py:tiny", "--mode", "evaluate")
    assert proc.returncode == 2
    assert "--workdir" in proc.stderr


def test_distributed_needs_train_mode_and_a_workdir_before_joining():
    # Checked before jax.distributed.initialize, which would wait for the other processes.
    proc = _launch("--config", "configs/gru.py:tiny", "--config.distributed.enabled=True")
    assert proc.returncode == 2
    assert "distributed.enabled=True needs --mode train or backtest and a --workdir" in proc.stderr


def test_train_then_predict_through_launch(tmp_path):
    """The README's commands end to end: train (tiny, 2 series), then --mode predict."""
    workdir = str(tmp_path / "run")
    small = ["--config.data.symbols=('BTCUSDT',)", "--config.train.epochs=1"]
    began = time.monotonic()
    proc = _launch("--config", "configs/gru.py:tiny", "--workdir", workdir, *small, timeout=600)
    wall = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The stages partition the process's wall from launch.py's first line (startup: the
    # imports, device start, config) to timings.json.
    timings = writers.read_json(os.path.join(workdir, "timings.json"))
    assert sum(timings["stages"].values()) == pytest.approx(timings["wall_seconds"], abs=0.005)
    assert 0 < timings["stages"]["startup"] < timings["wall_seconds"] < wall
    after_startup = timings["wall_seconds"] - timings["stages"]["startup"]
    assert timings["driver_seconds"] == pytest.approx(after_startup, abs=0.1)  # its own clock
    # JAX's INFO lines are shown (JAX_PLATFORMS unset, so it probes every backend), but not
    # its TPU probe on a machine where no TPU was asked for.
    assert "platform=auto chose backend" in proc.stderr
    assert "Unable to initialize backend 'tpu'" not in proc.stderr
    for name in ("config.json", "metrics.jsonl", "results.json", "report.md"):
        assert os.path.exists(os.path.join(workdir, name)), name
    for series in ("BTCUSDT-15m", "BTCUSDT-1h"):
        assert os.path.isdir(os.path.join(workdir, "models", series))
    proc = _launch(
        "--config",
        "configs/gru.py:tiny",
        "--workdir",
        workdir,
        "--mode",
        "predict",
        "--config.predict.intervals=('1h',)",
        *small,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(workdir, "forecast.json")) as f:
        forecast = json.load(f)
    assert list(forecast["series"]) == ["BTCUSDT-1h"]
    assert len(forecast["series"]["BTCUSDT-1h"]["forecast"]) == 10


def test_predict_for_a_series_without_a_model_exits_2(tmp_path):
    workdir = str(tmp_path / "empty")
    os.makedirs(os.path.join(workdir, "models"))
    proc = _launch("--config", "configs/gru.py:tiny", "--workdir", workdir, "--mode", "predict")
    assert proc.returncode == 2
    assert "error:" in proc.stderr
