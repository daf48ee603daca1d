"""The config a run was trained with, read back from <workdir>/config.json.

`--config configs/workdir.py:runs/demo` gives that run's resolved config (its model, data
location and every other field; a config saved by an earlier cpbjax is brought to today's
schema by `config.upgrade`), to override like any config. `--mode evaluate|predict|serve
--workdir W` without --config uses it.
"""

import json

from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib


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
    return config_lib.upgrade(saved)
