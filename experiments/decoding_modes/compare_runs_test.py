"""Tests for experiments/decoding_modes/compare_runs.py: one row per workdir, medians computed by hand."""

import json

import pytest

from experiments.decoding_modes import compare_runs


def _series(val_loss, val_skill, skill, p_better, accuracy, up_share, group, seconds):
    test = {
        "columns": {"close": {"skill": skill}},
        "dm": {"p_value_better": p_better},
        "direction": {"accuracy": accuracy, "up_share": up_share},
    }
    return {
        "best_val_loss": val_loss,
        "val": {"columns": {"close": {"skill": val_skill}}},
        "test": test,
        "group": group,
        "group_train_seconds": seconds,
    }


def _workdir(tmp_path, decoding):
    path = tmp_path / decoding
    path.mkdir()
    series = {
        "A-1h": _series(3e-4, -0.01, 0.02, 0.01, 0.50, 0.52, "group-000", 10.0),
        "B-1h": _series(1e-4, 0.00, -0.01, 0.40, 0.56, 0.50, "group-000", 10.0),
        "C-1h": _series(2e-4, 0.03, -0.02, None, 0.53, 0.54, "group-001", 5.5),
        "D-1h": {
            "status": "diverged",
            "best_val_loss": None,
            "group": "group-001",
            "group_train_seconds": 5.5,
        },  # no test metrics: not scored
    }
    (path / "results.json").write_text(json.dumps({"series": series}))
    (path / "config.json").write_text(json.dumps({"model": {"name": "gru", "decoding": decoding}}))
    return str(path)


def test_row_holds_the_medians_of_the_scored_series(tmp_path):
    row = compare_runs.summarise(_workdir(tmp_path, "direct"))
    assert row == {
        "workdir": str(tmp_path / "direct"),
        "model": "gru",
        "decoding": "direct",
        "series": 3,
        "best_val_loss_median": 2e-4,
        "val_close_skill_median_pct": 0.0,
        "close_skill_median_pct": -1.0,
        "skill_positive": 1,
        "dm_better_p05": 1,
        "dir_acc_median_pct": 53.0,
        "up_share_median_pct": 52.0,
        "train_seconds": 15.5,
    }


def test_main_prints_a_markdown_table(tmp_path, capsys):
    compare_runs.main([_workdir(tmp_path, "autoregressive"), _workdir(tmp_path, "direct")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| " + " | ".join(compare_runs.COLUMNS) + " |"
    assert len(lines) == 4 and "| autoregressive |" in lines[2] and "| direct |" in lines[3]


def test_main_names_a_workdir_without_results_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        compare_runs.main([_workdir(tmp_path, "direct"), str(tmp_path / "missing")])
    assert stop.value.code == 2
    assert "missing: no results.json" in capsys.readouterr().err
