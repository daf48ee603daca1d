"""Tests of how a run groups its series into programs (cpbjax/modes/plan.py's
group_size; a pooled run's rule: tests/pooled_test.py)."""

from cpbjax.modes import plan
from tests.helpers import tiny_config


def test_group_size_rounds_to_devices_and_caps_at_series():
    t = tiny_config().train
    t.group_size = 0
    assert plan.group_size(40, t, 1, "gpu") == 40 and plan.group_size(100, t, 1, "gpu") == 64
    assert plan.group_size(3, t, 2, "gpu") == 4
    # As many as fit on the CPU: 4 coins per device.
    assert plan.group_size(40, t, 2, "cpu") == 8 and plan.group_size(40, t, 1, "cpu") == 4
    assert plan.group_size(3, t, 2, "cpu") == 4
    t.group_size = 5
    assert plan.group_size(40, t, 4, "gpu") == 8 and plan.group_size(2, t, 1, "gpu") == 2
    assert plan.group_size(40, t, 2, "cpu") == 6
