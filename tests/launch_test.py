"""Tests for launch.py: bad flags exit 2 with one clear line naming what is wrong."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=120):
    env = dict(os.environ, JAX_PLATFORMS="")
    return subprocess.run(
        [sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env=env,
    )  # fmt: skip


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


def test_evaluate_mode_needs_a_workdir():
    proc = _launch("--config", "configs/gru.py:tiny", "--mode", "evaluate")
    assert proc.returncode == 2
    assert "--workdir" in proc.stderr
