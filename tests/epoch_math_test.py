"""Tests of the epoch math's protocol (cpbjax/training/epoch_math.py) and of the one
sharing object (cpbjax/training/sharing.py) that answers what train.share decides.

step.py and pooled.py satisfy `EpochMath` structurally: no type checker runs in CI, so
the members' parameters are compared here. The other tests keep the config's own
rules about train.share in step with `Sharing`, and every other module off the string.
"""

import ast
import inspect
import pathlib

import pytest

from cpbjax import config_rules as rules
from cpbjax.config import check
from cpbjax.training import epoch_math, pooled, sharing, step

ROOT = pathlib.Path(__file__).resolve().parent.parent
MEMBERS = sorted(
    n for n, v in vars(epoch_math.EpochMath).items() if inspect.isfunction(v) and n[0] != "_"
)
# The modules that run the math they are handed, by the name `math`.
CALLERS = ("group.py", "streaming.py", "compaction.py")


def _parameters(fn, drop_self=False) -> list[tuple]:
    """(name, kind, default) of each parameter; annotations may differ in spelling."""
    params = list(inspect.signature(fn).parameters.values())[1 if drop_self else 0 :]
    return [(p.name, p.kind, p.default) for p in params]


def test_the_protocol_lists_the_seven_functions_but_train_pass():
    want = ("fresh_state", "with_bar", "restart", "start_from")
    want += ("train_steps", "run_epoch", "finish_epoch")
    assert sorted(want) == MEMBERS


@pytest.mark.parametrize("module", [step, pooled], ids=["step", "pooled"])
def test_both_epochs_satisfy_the_protocol(module):
    for name in MEMBERS:
        fn = getattr(module, name, None)
        assert inspect.isfunction(fn), f"{module.__name__} has no function {name}"
        want = _parameters(getattr(epoch_math.EpochMath, name), drop_self=True)
        assert _parameters(fn) == want, f"{module.__name__}.{name}"


def test_the_callers_call_only_protocol_members():
    called = set()
    for name in CALLERS:
        tree = ast.parse((ROOT / "cpbjax" / "training" / name).read_text())
        called.update(n.attr for n in ast.walk(tree) if _on_math(n))
    assert called == set(MEMBERS), sorted(called)


def _on_math(node) -> bool:
    """`math.X` or `<...>.math.X` (a Sharing's math)."""
    if not isinstance(node, ast.Attribute):
        return False
    of = node.value
    return (isinstance(of, ast.Name) and of.id == "math") or (
        isinstance(of, ast.Attribute) and of.attr == "math"
    )


def test_each_share_has_one_sharing_with_its_own_math():
    assert tuple(sharing.BY_NAME) == check.SHARES
    assert sharing.of("series") is sharing.SERIES and sharing.of("pooled") is sharing.POOLED
    assert sharing.SERIES.math is step and sharing.POOLED.math is pooled
    assert all(sharing.of(name).name == name for name in check.SHARES)


def test_the_config_rules_ask_what_sharing_answers():
    chunked = tuple(s for s in check.SHARES if sharing.of(s).chunked_gradient)
    assert chunked == rules.CHUNKED_GRADIENT_SHARES
    ignored = [
        values for other, values, _, fields in rules.IGNORED if "train.compact_groups" in fields
    ]
    assert ignored == [tuple(s for s in check.SHARES if not sharing.of(s).compactable)]


def _compares_share(node) -> bool:
    """A comparison with `share` or `x.share` on either side (==, !=, in, ...)."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    return any(
        (isinstance(s, ast.Name) and s.id == "share")
        or (isinstance(s, ast.Attribute) and s.attr == "share")
        for s in sides
    )


def test_no_module_but_sharing_and_the_config_rule_compares_share():
    allowed = {"cpbjax/training/sharing.py", "cpbjax/config_rules.py"}
    found = []
    for path in sorted((ROOT / "cpbjax").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text())
        found += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if _compares_share(n)]
    assert [f for f in found if f.split(":")[0] not in allowed] == []
