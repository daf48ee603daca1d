"""benchmarks/eval_bench.py: the copy each arm scores, and how far two scorings differ."""

import json
import os

import pytest

from benchmarks import eval_bench


def _results(path, maes):
    """A results file whose series "A-1h" scores the MAEs `maes` (split -> column -> MAE)."""
    splits = {s: {"columns": {c: {"mae": m} for c, m in cols.items()}} for s, cols in maes.items()}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"series": {"A-1h": splits, "B-1h": {"val": None, "test": None}}}, f)


def test_each_arm_scores_a_copy_that_leaves_the_run_and_its_checkpoints_alone(tmp_path):
    run = tmp_path / "run"
    (run / "models" / "A-1h").mkdir(parents=True)
    (run / "models" / "A-1h" / "params.msgpack").write_bytes(b"weights")
    (run / "checkpoints").mkdir()
    (run / "config.json").write_text("{}")
    _results(run / "results.json", {"val": {"close": 1.0}, "test": {"close": 2.0}})
    copy = eval_bench.copy_run(str(run), str(tmp_path / "arm0"))
    assert sorted(os.listdir(copy)) == ["config.json", "models", "results.json"]
    assert (tmp_path / "arm0" / "models" / "A-1h" / "params.msgpack").read_bytes() == b"weights"
    (tmp_path / "arm0" / "results.json").write_text("{}")  # an arm rewrites its copy only
    assert json.loads((run / "results.json").read_text())["series"]["A-1h"]


def test_the_largest_difference_is_over_every_series_split_and_column(tmp_path):
    with pytest.raises(RuntimeError, match="no eval"):
        eval_bench.column_maes(str(tmp_path))
    want = {"val": {"high": 4.0, "close": 2.0}, "test": {"high": 8.0, "close": 1.0}}
    got = {"val": {"high": 4.0, "close": 2.0}, "test": {"high": 8.0, "close": 1.0 + 3e-7}}
    _results(tmp_path / "a" / "eval-20261125-120000.json", want)
    _results(tmp_path / "b" / "eval-20261125-120000.json", {"val": {}, "test": {}})
    _results(tmp_path / "b" / "eval-20261125-120500.json", got)  # the newest is read
    _results(tmp_path / "b" / "results.json", want)  # training's, which evaluate leaves
    maes_a, maes_b = (eval_bench.column_maes(str(tmp_path / d)) for d in ("a", "b"))
    assert len(maes_a) == 4  # the unscored series B-1h adds nothing
    assert eval_bench.largest_difference(maes_b, maes_a) == pytest.approx(3e-7)
    assert eval_bench.largest_difference(maes_a, maes_a) == 0.0
    del maes_b[("A-1h", "val", "high")]
    with pytest.raises(RuntimeError, match="different series"):
        eval_bench.largest_difference(maes_b, maes_a)
