"""experiments/ensemble_default/val_gains.py: each epoch's pooled val gain over the best before it."""

import math

import numpy as np
import pytest

from experiments.ensemble_default import val_gains


def _record(epoch, best, se, pooled=None):
    return {
        "epoch": epoch,
        "series": ["A-1h", "B-1h"],
        "val_loss": [0.0, 0.0],
        "best_val_loss": [best, best],
        "val_gain_se": [se, se],
        "pooled_val_loss": pooled,
    }


def test_gains_are_over_the_best_before_each_epoch_in_its_standard_errors():
    # Untrained best 0.80 (never logged): epoch 1 misses the bar (gain 0.5 SE), epoch 2
    # clears it and is kept, epoch 3 is worse than epoch 2's 0.70.
    records = [_record(1, 0.80, 0.02), _record(2, 0.70, 0.04), _record(3, 0.70, 0.05)]
    rows = val_gains.gains(records, np.array([0.79, 0.70, 0.72]))
    assert [(e, k) for e, _, _, k in rows] == [(1, False), (2, True), (3, False)]
    assert [g for _, _, g, _ in rows] == pytest.approx([0.5, 2.5, -0.4])


def test_a_kept_first_epoch_has_no_gain_and_logged_pooled_losses_are_read_as_they_are():
    records = [_record(1, 0.75, 0.01, 0.75), _record(2, 0.75, 0.01, 0.76)]
    val_E = val_gains.pooled_val(config=None, records=records)  # logged: no data needed
    rows = val_gains.gains(records, val_E)
    assert math.isnan(rows[0][2]) and rows[0][3]
    assert rows[1][2] == pytest.approx(-1.0) and not rows[1][3]


def test_the_logged_improved_flag_says_which_epochs_were_kept():
    # Epoch 2 repeats the best's val loss exactly without clearing the bar: read from the
    # losses alone it would look kept; the logged flag says it was not.
    records = [_record(1, 0.75, 0.01, 0.75), _record(2, 0.75, 0.01, 0.75)]
    records[0]["improved"], records[1]["improved"] = [True, True], [False, False]
    rows = val_gains.gains(records, np.array([0.75, 0.75]))
    assert [k for *_, k in rows] == [True, False]
    assert rows[1][2] == pytest.approx(0.0)
