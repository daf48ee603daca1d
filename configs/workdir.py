"""The config a run was trained with, read back from <workdir>/config.json.

`--config configs/workdir.py:runs/demo` gives that run's resolved config (its model, data
location and every other field; fields added to cpbjax since keep their defaults), to
override like any config. `--mode evaluate|predict|serve --workdir W` without --config
uses it.
"""

import json

import ml_collections

from cpbjax import config as config_lib
from cpbjax import workdir as workdir_lib


def _merge(c: ml_collections.ConfigDict, saved: dict) -> ml_collections.ConfigDict:
    """`c` with the values of `saved` (JSON: lists back as the tuples the schema uses)."""
    for key, value in saved.items():
        if isinstance(value, dict) and isinstance(c.get(key), ml_collections.ConfigDict):
            _merge(c[key], value)
        else:
            c[key] = tuple(value) if isinstance(value, list) else value
    return c


def get_config(arg=None):
    if not arg:
        raise ValueError("configs/workdir.py needs a workdir: configs/workdir.py:<workdir>")
    path = workdir_lib.config_json(arg)
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the run's config {path}: {e}") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is not a config (a JSON object)")
    return _merge(config_lib.base_config(), saved)
