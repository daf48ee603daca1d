"""stopping.py reads a shorter patience off a long run: checked on a hand-made metrics.jsonl."""

import json

import pytest

from experiments.lstm_epochs import stopping


def _write(path, epochs):
    """metrics.jsonl of two series: A improves at epochs 2 and 5, B never; patience 3."""
    with open(path, "w") as f:
        for e in range(1, epochs + 1):
            a_active, b_active = e < 8, e < 3  # A stops at 8 (5 + 3), B at 3 (0 + 3)
            record = {
                "series": ["A", "B"],
                "active": [a_active, b_active],
                "improved": [e in (2, 5), False],
                "best_val_loss": [1.0 - 0.1 * (e >= 2) - 0.1 * (e >= 5), 1.0],
            }
            f.write(json.dumps(record) + "\n")


def test_a_shorter_patience_stops_where_a_plain_count_says(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(path, 8)
    runs = stopping.histories(str(path))
    assert [len(runs["A"]), len(runs["B"])] == [8, 3]  # epochs each trained
    assert stopping.stop(runs["A"], 3) == (8, pytest.approx(0.8), True)
    assert stopping.stop(runs["A"], 2) == (4, pytest.approx(0.9), True)  # 2 + 2: loses epoch 5
    assert stopping.stop(runs["A"], 1) == (1, 1.0, True)
    assert stopping.stop(runs["B"], 3) == (3, 1.0, True)
    assert stopping.stop(runs["A"], 10) == (8, pytest.approx(0.8), False)  # the history ends
