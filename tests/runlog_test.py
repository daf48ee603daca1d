"""Tests of cpbjax.report.runlog: the progress displays and the fan-out of epoch records."""

import logging

import jax
import ml_collections
import numpy as np

from cpbjax import writers
from cpbjax.report import runlog

RECORD = {
    "group": "group-000",
    "epoch": 2,
    "series": ["A-1h", "B-1h"],
    "train_loss": [0.2, None],
    "val_loss": [0.3, None],
    "best_val_loss": [0.25, 0.5],
    "lr": 1e-3,
    "active": [True, False],
    "seconds": 0.5,
}


def test_plain_progress_logs_one_line_per_epoch(caplog):
    progress = runlog.make_progress("plain")
    assert isinstance(progress, runlog.PlainProgress)
    with caplog.at_level(logging.INFO):
        progress.start_group("group-000", 2, 10, 1)
        progress.update(RECORD, 3 * 2**20)
        progress.end_group()
    lines = [r.getMessage() for r in caplog.records if "epoch 2/10" in r.getMessage()]
    assert len(lines) == 1
    assert "active 1/2" in lines[0]
    assert "0.25/0.375" in lines[0]  # best val min/median
    assert "3 MiB" in lines[0]
    assert "pooled val" not in lines[0]  # only a pooled run's records carry one


def test_plain_progress_shows_what_a_pooled_run_stops_on(caplog):
    progress = runlog.PlainProgress()
    with caplog.at_level(logging.INFO):
        progress.start_group("group-000", 2, 10, 0)
        progress.update({**RECORD, "pooled_val_loss": 0.28125}, None)
    assert any("pooled val 0.2812" in r.getMessage() for r in caplog.records)


def test_auto_is_plain_off_a_terminal_and_rich_runs():
    assert isinstance(runlog.make_progress("auto"), runlog.PlainProgress)
    progress = runlog.make_progress("rich")
    assert isinstance(progress, runlog.RichProgress)
    progress.start_group("group-000", 2, 10, 0)
    progress.update(RECORD, None)
    progress.end_group()


def _logging_cfg(tensorboard=False):
    return ml_collections.ConfigDict({"progress": "plain", "tensorboard": tensorboard})


def test_run_log_writes_metrics_and_tensorboard_only_on_the_primary(tmp_path):
    primary = runlog.RunLog(str(tmp_path / "a"), _logging_cfg(True), primary=True)
    other = runlog.RunLog(str(tmp_path / "b"), _logging_cfg(True), primary=False)
    for log in (primary, other):
        (tmp_path / ("a" if log is primary else "b")).mkdir()
        log.start_group("group-000", 2, 10, 0)
        log.epoch(RECORD, None)
        log.end_group()
        log.close()
    assert writers.MetricsLog(str(tmp_path / "a")).records() == [RECORD]
    assert (tmp_path / "a" / "tb" / "group-000").is_dir()
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == []


def test_run_log_drops_the_epochs_a_resumed_group_runs_again(tmp_path):
    log = runlog.RunLog(str(tmp_path), _logging_cfg(), primary=True)
    log.start_group("group-000", 2, 10, 0)
    for epoch in (1, 2, 3):
        log.epoch({**RECORD, "epoch": epoch}, None)
    log.epoch({**RECORD, "group": "group-001", "epoch": 5}, None)
    log.start_group("group-000", 2, 10, 2)  # resumed from the checkpoint of epoch 2
    kept = [(r["group"], r["epoch"]) for r in writers.MetricsLog(str(tmp_path)).records()]
    assert kept == [("group-000", 1), ("group-000", 2), ("group-001", 5)]


class _ScriptedTime:
    """A monotonic clock that stands still until the test moves it (`.t`)."""

    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_stage_clock_counts_the_memory_check_compile_once():
    """The epoch loop runs in "host"; its memory check compiles in a nested "compile"
    stage and its epochs move to compile and train: each second counts once."""
    now = _ScriptedTime(0.0)
    clock = runlog.StageClock(now)
    with clock.stage("host"):
        now.t = 1.0  # checkpoints etc. before the check: 1 s of host
        with clock.stage("compile"):  # the memory check compiles the epoch program: 5 s
            now.t = 6.0
        # Epochs: the first 4 s (2 s of it compiling), three steady ones of 2 s, and 3 s
        # of host work between them.
        now.t = 6.0 + 4.0 + 3 * 2.0 + 3.0
        clock.add_epochs([4.0], [2.0, 2.0, 2.0])
    now.t = 20.0  # 1 s outside every stage
    timings = clock.timings(started=0.0)
    assert timings["stages"] == {
        "host": 1.0 + 3.0,
        "compile": 5.0 + 2.0,
        "train": 8.0,
        "other": 1.0,
    }
    assert timings["wall_seconds"] == 20.0 == sum(timings["stages"].values())


def test_stage_clock_partitions_the_wall_from_the_process_start():
    """A nested stage counts only for itself, time outside every stage is "other", and
    the first clock after mark_process_start starts its wall there (startup)."""
    now = _ScriptedTime(10.0)
    runlog.mark_process_start(7.5)
    clock = runlog.StageClock(now)
    with clock.stage("load"):
        now.t = 11.0
        with clock.stage("prepare"):
            now.t = 11.5
        now.t = 12.0
    try:
        with clock.stage("evaluate"):
            now.t = 12.25
            raise ValueError("a failing stage still counts")
    except ValueError:
        pass
    now.t = 13.0
    timings = clock.timings(started=0.0)
    expected = {"startup": 2.5, "load": 1.5, "prepare": 0.5, "evaluate": 0.25, "other": 0.75}
    assert timings["stages"] == expected
    assert timings["wall_seconds"] == 13.0 - 7.5 == sum(expected.values())
    later = runlog.StageClock(now)  # the mark is the first clock's only
    assert later.timings(started=0.0)["wall_seconds"] == 0.0


def test_stage_clock_lists_the_programs_compiled_since_it_started():
    def triple_for_the_compile_log(x):
        return x * 3

    jax.jit(lambda x: x + 1)(np.ones(3))  # before the clock: not its compilation
    clock = runlog.StageClock()
    assert clock.compiles() == []
    jax.jit(triple_for_the_compile_log)(np.ones(4))
    (entry,) = clock.compiles()
    assert entry["program"] == "jit(triple_for_the_compile_log)"
    assert 0 < entry["seconds"] < 60
