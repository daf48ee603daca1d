"""Tests of cpbjax.writers: atomic writes, JSON, metrics.jsonl (torn lines, rewrites)."""

import json
import logging
import os

import ml_collections
import numpy as np
import pytest

from cpbjax import writers


def test_to_jsonable_converts_numpy_nan_tuples_and_configs():
    cfg = ml_collections.ConfigDict({"a": (1, 2), "b": {"c": 0.5}})
    value = {
        "f": np.float32(0.25),
        "i": np.int64(3),
        "b": np.bool_(True),
        "nan": float("nan"),
        "inf": np.float64(np.inf),
        "arr": np.array([[1.0, np.nan]]),
        "t": ("x", 1),
        "cfg": cfg,
        7: None,
    }
    out = writers.to_jsonable(value)
    assert out == {
        "f": 0.25,
        "i": 3,
        "b": True,
        "nan": None,
        "inf": None,
        "arr": [[1.0, None]],
        "t": ["x", 1],
        "cfg": {"a": [1, 2], "b": {"c": 0.5}},
        "7": None,
    }
    json.dumps(out, allow_nan=False)


def test_to_jsonable_rejects_unknown_types_by_name():
    with pytest.raises(TypeError, match="object"):
        writers.to_jsonable({"x": object()})


def test_write_json_round_trips(tmp_path):
    path = str(tmp_path / "sub" / "r.json")
    writers.write_json(path, {"a": [1, 2.5, None]})
    assert writers.read_json(path) == {"a": [1, 2.5, None]}


def test_failed_write_leaves_old_file_intact(tmp_path, monkeypatch):
    path = str(tmp_path / "results.json")
    writers.write_json(path, {"old": 1})

    def failing_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        writers.write_json(path, {"new": 2})
    monkeypatch.undo()
    assert writers.read_json(path) == {"old": 1}
    assert os.listdir(tmp_path) == ["results.json"]  # no temp file left behind


def test_read_json_names_a_bad_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"a": ')
    with pytest.raises(ValueError, match="bad.json"):
        writers.read_json(str(path))


def test_config_and_results_file_names(tmp_path):
    writers.write_config(str(tmp_path), ml_collections.ConfigDict({"seed": 0, "t": (1,)}))
    writers.write_results(str(tmp_path), {"run": {}, "series": {}, "skipped": {}})
    assert writers.read_json(str(tmp_path / "config.json")) == {"seed": 0, "t": [1]}
    assert "series" in writers.read_json(str(tmp_path / "results.json"))


def _epochs(log, epochs=(1, 2, 3)):
    for e in epochs:
        log.append({"group": "group-000", "epoch": e, "val_loss": [0.1 * e, float("nan")]})


def test_metrics_lines_all_parse(tmp_path):
    log = writers.MetricsLog(str(tmp_path))
    _epochs(log)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2, 3]
    assert log.records()[2]["val_loss"] == [pytest.approx(0.3), None]


def test_torn_last_line_is_ignored_then_dropped_by_keep(tmp_path):
    log = writers.MetricsLog(str(tmp_path))
    _epochs(log)
    with open(log.path, "a") as f:
        f.write('{"group": "group-000", "epo')  # what a crash mid-append leaves
    assert [r["epoch"] for r in log.records()] == [1, 2, 3]
    log.keep(lambda r: r["epoch"] <= 2)
    _epochs(log, [3])
    with open(log.path) as f:
        assert [json.loads(line)["epoch"] for line in f] == [1, 2, 3]


def test_missing_metrics_file_has_no_records(tmp_path):
    assert writers.MetricsLog(str(tmp_path)).records() == []


def test_atomic_write_gives_the_umask_mode_and_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "out.txt"
    writers.atomic_write(str(path), "first")
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600
    with pytest.raises(TypeError):
        writers.atomic_write(str(path), 123)  # neither bytes nor str: fails before replace
    assert path.read_text() == "first"
    assert os.listdir(tmp_path) == ["out.txt"]  # no temporary file left behind
    writers.atomic_write(str(path), b"second")
    assert path.read_bytes() == b"second"


@pytest.mark.parametrize("durable, fsyncs", [(True, 2), (False, 0)])
def test_atomic_write_fsyncs_file_and_folder_unless_told_not_to(
    tmp_path, monkeypatch, durable, fsyncs
):
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd)))
    path = tmp_path / "entry.npz"
    writers.atomic_write(str(path), b"old")
    synced.clear()
    writers.atomic_write(str(path), b"new", durable=durable)
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["entry.npz"]
    assert len(synced) == fsyncs


def test_torn_middle_line_of_metrics_is_skipped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1}\n{"epo\n{"epoch": 3}\n')
    with caplog.at_level(logging.WARNING):
        records = writers.MetricsLog(str(tmp_path)).records()
    assert records == [{"epoch": 1}, {"epoch": 3}]
    assert any("line 2 is not valid JSON" in r.getMessage() for r in caplog.records)
