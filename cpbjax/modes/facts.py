"""The "run" block of every results file: the mode, model, versions and devices of a run,
and for --mode evaluate and predict the workdir and data that were scored."""

from __future__ import annotations

import os
import time

from cpbjax import config_rules as rules
from cpbjax import runtime
from cpbjax.data import parsing


def run_facts(mode: str, config, started: float, **facts) -> dict:
    """The "run" block of every results file (results.json, backtest.json, sweep.json,
    eval-*.json, forecast.json): the mode, model, versions and devices, when it started
    (`started`, a time.time()) and its wall seconds (this process only, not the parts of
    a resumed run done before); `facts`: the mode's own (a plan's groups, `scored_workdir`)."""
    devices = runtime.describe_devices()
    return {
        "mode": mode,
        "model": config.model.name,
        "seed": config.seed,
        "versions": runtime.versions(),
        "platform": devices["backend"],
        "device_count": devices["device_count"],
        "process_count": devices["process_count"],
        "devices": devices["devices"],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_seconds": time.time() - started,
        **facts,
    }


# The data fields that say where a run's candles came from (those its source reads).
_DATA_FACTS = ("source", "base_url", "local_dir", "months", "end", "max_candles")


def scored_workdir(config, workdir: str) -> dict:
    """`run_facts`' facts of --mode evaluate and predict: the workdir of the models (its
    name: the file lies in it, and a path would name the machine), when the results were
    made, and the data they were made from (less the fields data.source ignores)."""
    d = config.data
    ignored = {
        field
        for other, values, _, fields in rules.IGNORED
        if other == "data.source" and d.source in values
        for field in fields
    }
    return {
        "workdir": os.path.basename(os.path.abspath(workdir)),
        "created": parsing.iso(time.time() * 1000),
        "data": {k: d[k] for k in _DATA_FACTS if f"data.{k}" not in ignored},
    }
