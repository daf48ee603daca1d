"""`ConfigError`, the value rules that every config check uses (config.py's and the
models'), and the rules between fields (`check_combinations`).

Kept apart from cpbjax/config/schema.py so the modules that own a group's rules (the model
registry, the data sources) can raise the same error without importing the schema,
which reads their name lists: no import cycle. Every message has one form,
"config.<field>=<value> is not allowed: expected <what is allowed>".
"""

from __future__ import annotations

import math
import os
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


def get(c, field: str, missing: Any = None) -> Any:
    """The value of dotted `field` in config `c`; `missing` where a group or field is absent
    (a registered model or source may not have it)."""
    for part in field.split("."):
        if part not in c:
            return missing
        c = c[part]
    return c


_NOT_BINANCE = ("local", "synthetic")  # built-in sources that neither download nor top up
# The train.share values whose step takes one gradient over many coins, which
# train.pooled_chunk splits: cpbjax/training/sharing.py's `chunked_gradient` (above this
# layer, so the rule names the values; tests/epoch_math_test.py keeps the two the same).
CHUNKED_GRADIENT_SHARES = ("pooled",)

# A value other than its default of each of `fields` is ignored while `other` holds one of
# `values`, so it is refused: (other, values, why, fields). A source registered from user
# code may read any data field: the data rules name only the built-in sources.
IGNORED = (
    ("model.decoding", ("direct",), "only autoregressive decoding feeds true candles",
     ("train.teacher_forcing",)),
    ("train.share", ("pooled",), "a pooled run is one group of one model",
     ("train.compact_groups",)),
    ("model.baseline", ("none",), "it refits the vol_band baseline's band",
     ("eval.refit_band",)),
    ("model.baseline", ("none",), "the network forecasts every column itself",
     ("model.corrected_columns",)),
    ("model.baseline", ("none",), "there is no baseline to fall back to",
     ("eval.column_fallback",)),
    ("data.source", ("binance", "binance_rest", "synthetic"), "only the local source reads it",
     ("data.local_dir",)),
    ("data.source", ("binance", "binance_rest", "local"), "only the synthetic source makes them",
     ("data.synthetic_covariates",)),
    ("data.source", _NOT_BINANCE, "only the binance sources download",
     ("data.base_url", "data.months", "data.end", "data.include_daily")),
    ("data.source", _NOT_BINANCE, "only binance data is topped up from the exchange",
     ("data.api_url", "predict.fresh")),
    ("distributed.enabled", (False,), "jax.distributed starts only when enabled",
     ("distributed.coordinator_address", "distributed.num_processes", "distributed.process_id")),
)  # fmt: skip


def check_combinations(c, defaults) -> None:
    """Every rule between fields of config `c`, after each field passed its own check:
    values that need another field's value, then values that another field's value would
    silently ignore (IGNORED). `defaults`: the schema (config.base_config()), whose
    values are never refused."""
    _check_distributed(c.distributed)
    d = c.data
    check(
        d.max_candles == 0 or d.min_candles <= d.max_candles,  # 0: no cap
        "data.min_candles",
        d.min_candles,
        f"<= data.max_candles ({d.max_candles})",
    )
    _check_covariate_source(d)
    if d.source == "local":
        ok = os.path.isdir(os.path.expanduser(d.local_dir))
        check(ok, "data.local_dir", d.local_dir, "an existing directory when data.source='local'")
    if c.train.epochs == 0:  # scores the starting model as it is (zero-shot on new series)
        allowed = ">= 1 without train.init_from (with it, 0 evaluates the starting model)"
        check(bool(c.train.init_from), "train.epochs", 0, allowed)
    if c.train.pooled_chunk:
        allowed = "0 unless train.share='pooled' (a per-series step has one coin per gradient)"
        ok = c.train.share in CHUNKED_GRADIENT_SHARES
        check(ok, "train.pooled_chunk", c.train.pooled_chunk, allowed)
    _check_ignored(c, defaults)


def _check_covariate_source(d) -> None:
    """data.covariates only from a source that has them: the binance sources' klines carry
    none, and the synthetic source only with data.synthetic_covariates."""
    if not d.covariates:
        return
    if d.source in ("binance", "binance_rest"):
        allowed = (
            f"() with data.source={d.source!r}: covariates need data.source=local or "
            "cpbjax.fit frames"
        )
        fail("data.covariates", d.covariates, allowed)
    if d.source == "synthetic" and not d.synthetic_covariates:
        allowed = "() with data.source='synthetic' unless data.synthetic_covariates=True"
        fail("data.covariates", d.covariates, allowed)


def _check_distributed(h) -> None:
    """Explicit multi-host settings: all three or none, and this process one of them."""
    explicit = (h.coordinator_address != "", h.num_processes > 0, h.process_id >= 0)
    allowed = "coordinator_address, num_processes and process_id all set, or none (auto-detect)"
    check(all(explicit) or not any(explicit), "distributed", h.to_dict(), allowed)
    if all(explicit):
        allowed = f"< distributed.num_processes ({h.num_processes})"
        check(h.process_id < h.num_processes, "distributed.process_id", h.process_id, allowed)


def _ignored(c, defaults):
    """(field, value, default, why) of each non-default value that another field's value
    ignores (IGNORED)."""
    absent = object()
    for other, values, why, fields in IGNORED:
        other_value = get(c, other, absent)
        if other_value is absent or other_value not in values:
            continue
        for field in fields:
            value, default = get(c, field, absent), get(defaults, field, absent)
            if absent not in (value, default) and value != default:
                yield field, value, default, f"with {other}={other_value!r}: {why}"


def reset_ignored(c, defaults) -> None:
    """Sets every value of `c` that another field's value ignores to its default, which
    changes nothing it does (`config.upgrade`: an earlier cpbjax accepted such values)."""
    for field, _, default, _ in list(_ignored(c, defaults)):
        group, leaf = field.rsplit(".", 1)
        get(c, group)[leaf] = default


def _check_ignored(c, defaults) -> None:
    """A non-default value of a field that another field's value ignores (IGNORED), and a
    sweep.select without a sweep."""
    for field, value, default, why in _ignored(c, defaults):
        fail(field, value, f"{default!r} (its default) {why}")
    sweep = get(c, "sweep", {})
    swept = [name for name in sweep if name not in ("select", "max_settings") and sweep[name]]
    if sweep and not swept and sweep.select != get(defaults, "sweep.select"):
        allowed = f"{defaults.sweep.select!r} (its default) without a sweep.* value to choose among"
        fail("sweep.select", sweep.select, allowed)
