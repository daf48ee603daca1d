"""launch.py's and cpbjax.fit's messages of issue #55: each names the bad thing in one line
(exit 2 where the run cannot go on)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=120):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "launch.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _one_error_line(proc) -> str:
    """The single `error: ...` line of a run that exited 2 (and nothing else on stderr)."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


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
