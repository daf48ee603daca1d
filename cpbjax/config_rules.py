"""`ConfigError` and the value rules that every config check uses (config.py's and the models').

Kept apart from cpbjax/config.py so the modules that own a group's rules (the model
registry, the data sources) can raise the same error without importing the schema,
which reads their name lists: no import cycle. Every message has one form,
"config.<field>=<value> is not allowed: expected <what is allowed>".
"""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A config value that is not allowed; the message names field, value and rule."""


def fail(field: str, value: Any, allowed: str) -> None:
    """Raises the ConfigError of `field` (dotted, without "config.") holding `value`."""
    raise ConfigError(f"config.{field}={value!r} is not allowed: expected {allowed}")


def check(ok: bool, field: str, value: Any, allowed: str) -> None:
    """`fail` unless ok."""
    if not ok:
        fail(field, value, allowed)


def is_int(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def int_in(field: str, v: Any, lo: int, hi: int | None = None) -> None:
    """An integer in [lo, hi] (no upper bound when hi is None)."""
    ok = is_int(v) and v >= lo and (hi is None or v <= hi)
    check(ok, field, v, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))


def num_in(field: str, v: Any, lo: float, hi: float, lo_open=False, hi_open=False) -> None:
    """A finite number between lo and hi, each bound open or closed."""
    ok = is_num(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    lb = f"{'>' if lo_open else '>='} {lo}"
    ub = f"{'<' if hi_open else '<='} {hi}"
    check(ok, field, v, f"a number {lb} and {ub}")


def one_of(field: str, v: Any, allowed) -> None:
    """One of `allowed` (any iterable of names)."""
    allowed = tuple(allowed)
    check(v in allowed, field, v, "one of " + ", ".join(map(str, allowed)))


def bool_field(field: str, v: Any) -> None:
    """True or False, not 0/1 or a string."""
    check(isinstance(v, bool), field, v, "True or False")
