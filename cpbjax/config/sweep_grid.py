"""A hyperparameter sweep's grid: every (series, setting) pair is one coin of its own.

A setting is one point of the product of the non-empty `sweep.<field>` tuples (in the
order of FIELDS, each tuple in its given order). Its coin is the series' PreparedSeries
renamed "<SERIES>@<setting name>", e.g. "BTCUSDT-1h@lr=0.003,wd=0.0" (the swept fields'
short names and each value's Python repr, so names are unique, exact and safe as file
names), carrying its hyperparameters in `PreparedSeries.hparams`; stacking puts them in
`GroupArrays.hparams` ([K] per name) and the epoch reads them as arrays, so every setting
of the grid trains in the same compiled program as the series would alone:

  - "lr_mult": the setting's learning rate / train.learning_rate. The schedule is linear
    in its peak (warmup and final values are factors of it), so schedule(step) * lr_mult
    is the schedule of a run with train.learning_rate set to the setting's value.
  - "weight_decay": the setting's weight decay, injected into the optimizer each step
    (optimizer.make_optimizer(..., per_coin_decay=True)).

Only swept fields get an entry, so a run without a sweep stacks and compiles exactly as
before. Fields that change the compiled program's shapes or its traced code (the model,
the windows, dropout, the loss) cannot be per-coin arrays and are refused (`refusal`).

A grid of more than `sweep.max_settings` settings (default 64) is refused (`check_size`,
at config validation and on every use of `settings`) with its projected size and cost:
each setting trains one model per series, as costly as the whole run without the sweep,
so 2,000 learning rates would be 2,000 runs' work.
Imports nothing heavy: config.py validates with it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from cpbjax.config_rules import ConfigError

SEPARATOR = "@"
# Swept train field -> its short name in a coin's name.
FIELDS = {"learning_rate": "lr", "weight_decay": "wd"}
# Swept train field -> its name in PreparedSeries.hparams and GroupArrays.hparams.
HPARAMS = {"learning_rate": "lr_mult", "weight_decay": "weight_decay"}
SELECT = ("series", "pooled")
# Why a field cannot be swept in one program (fields not listed get a general reason).
_SHAPES = "changes the shapes of the compiled program (params or windows)"
_TRACED = "is compiled into the program's code, not read from a per-coin array"
_REFUSED = {
    **dict.fromkeys(
        ("hidden", "num_layers", "d_model", "num_heads", "d_ff", "lookback", "horizon"), _SHAPES
    ),
    **dict.fromkeys(("batch_size", "features", "max_candles"), _SHAPES),
    **dict.fromkeys(("dropout", "loss", "loss_scale", "optimizer", "teacher_forcing"), _TRACED),
    **dict.fromkeys(("decoding", "grad_clip", "baseline"), _TRACED),
}


def refusal(field: str) -> str:
    """The ConfigError message for `sweep.<field>`, a field that cannot be swept."""
    reason = _REFUSED.get(field, "is not a per-coin hyperparameter of the step")
    return (
        f"config.sweep.{field} cannot be swept: it {reason}; sweepable: "
        f"{', '.join(FIELDS)}. Run separate configs for other values of {field}"
    )


def swept(config) -> tuple[str, ...]:
    """The swept fields of FIELDS (non-empty sweep.<field>), in FIELDS order."""
    return tuple(f for f in FIELDS if len(config.sweep[f]))


def is_sweep(config) -> bool:
    return bool(swept(config))


def check_size(config) -> None:
    """Refuses a grid of more than `sweep.max_settings` settings, giving its projected cost.

    Raises:
      ConfigError: naming each swept field's count, the settings, the models and how to
        raise the cap.
    """
    fields = swept(config)
    counts = {f: len(config.sweep[f]) for f in fields}
    size = math.prod(counts.values()) if fields else 0
    cap = config.sweep.max_settings
    if size <= cap:
        return
    series = len(config.data.symbols) * len(config.data.intervals)
    factors = " x ".join(f"{n} sweep.{f}" for f, n in counts.items())
    raise ConfigError(
        f"config.sweep: the grid is {factors} = {size} settings, over the cap of "
        f"{cap}; with {series} series that is {size * series} models of "
        f"{config.train.epochs} epochs, about {size} times the training of this run "
        "without the sweep. Sweep fewer values (a coarse grid first, then a finer one "
        f"around the best), or raise the cap: --config.sweep.max_settings={size}"
    )


def settings(config) -> list[dict]:
    """Every setting of the grid: dicts swept field -> value, in product order.

    Raises:
      ConfigError: the grid is over sweep.max_settings (`check_size`).
    """
    check_size(config)
    fields = swept(config)
    values = [[float(v) for v in config.sweep[f]] for f in fields]
    return [dict(zip(fields, point, strict=True)) for point in itertools.product(*values)]


def setting_name(setting: dict) -> str:
    """{"learning_rate": 0.003, "weight_decay": 0.0} -> "lr=0.003,wd=0.0"."""
    return ",".join(f"{FIELDS[f]}={float(v)!r}" for f, v in setting.items())


def coin_name(series: str, setting: dict) -> str:
    return f"{series}{SEPARATOR}{setting_name(setting)}"


def series_of(name: str) -> str:
    """The series of a coin name: "BTCUSDT-1h@lr=0.003" -> "BTCUSDT-1h"."""
    return name.split(SEPARATOR)[0]


def hparam_names(config) -> tuple[str, ...]:
    """The names of GroupArrays.hparams that a run's coins carry (() without a sweep)."""
    return tuple(HPARAMS[f] for f in swept(config))


def coin_hparams(config, setting: dict) -> dict:
    """One coin's GroupArrays.hparams values (see the module docstring)."""
    out = {HPARAMS[f]: v for f, v in setting.items()}
    if "lr_mult" in out:
        out["lr_mult"] /= config.train.learning_rate
    return out


def coin(prep, config, setting: dict):
    """The PreparedSeries `prep` as the coin of one setting."""
    return dataclasses.replace(
        prep, name=coin_name(prep.name, setting), hparams=coin_hparams(config, setting)
    )


def expand(preps: list, config) -> list:
    """Every (series, setting) coin of `preps`: a series' settings are adjacent, in grid
    order, so a group holds whole series where it can."""
    return [coin(p, config, setting) for p in preps for setting in settings(config)]


def by_setting(preps: list, config) -> list[list]:
    """The coins of `preps` grouped by setting, in grid order: train.share=pooled trains
    one group per setting, each ONE model over every series at that setting."""
    return [[coin(p, config, setting) for p in preps] for setting in settings(config)]


def setting_config(config, setting: dict):
    """A copy of `config` with the setting's values in train.<field> and no sweep: the
    config of a run that trains this setting alone (saved with the chosen models)."""
    out = config.copy_and_resolve_references()
    with out.unlocked():
        for field, value in setting.items():
            out.train[field] = value
        for field in FIELDS:
            out.sweep[field] = ()
    return out
