"""Tests of the epoch math's protocol (cpbjax/training/epoch_math.py).

step.py and pooled.py satisfy `EpochMath` structurally: no type checker runs in CI, so
the members' parameters are compared here.
"""

import inspect

import pytest

from cpbjax.training import epoch_math, pooled, step

MEMBERS = sorted(
    n for n, v in vars(epoch_math.EpochMath).items() if inspect.isfunction(v) and n[0] != "_"
)


def _parameters(fn, drop_self=False) -> list[tuple]:
    """(name, kind, default) of each parameter; annotations may differ in spelling."""
    params = list(inspect.signature(fn).parameters.values())[1 if drop_self else 0 :]
    return [(p.name, p.kind, p.default) for p in params]


def test_the_protocol_lists_the_nine_functions_but_train_pass():
    want = ("fresh_state", "init_state", "with_bar", "restart", "start_from")
    want += ("train_steps", "run_epoch", "finish_epoch")
    assert sorted(want) == MEMBERS


@pytest.mark.parametrize("module", [step, pooled], ids=["step", "pooled"])
def test_both_epochs_satisfy_the_protocol(module):
    for name in MEMBERS:
        fn = getattr(module, name, None)
        assert inspect.isfunction(fn), f"{module.__name__} has no function {name}"
        want = _parameters(getattr(epoch_math.EpochMath, name), drop_self=True)
        assert _parameters(fn) == want, f"{module.__name__}.{name}"
