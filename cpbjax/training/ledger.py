"""The resume ledger: <workdir>/checkpoints/groups.json, the run's group plan and finished groups.

Each finished group's results.json entries go to a file of their own
(checkpoints/finished/<group>.json, written before groups.json names it), so finishing a
group writes that group's entries once: one growing file rewritten after every group
would cost O(groups x series) of JSON, minutes at 1,000 series of about 40 KB each.

A rerun with the same --workdir skips the groups recorded here and refuses to mix in a
different config or set of series (`RunMismatch`). The fingerprint holds the config fields
that decide what a run trains; fields that only say where candles come from or how the
coins are computed may change between a run and its resume.
"""

from __future__ import annotations

import os

from cpbjax import sharding, writers
from cpbjax import workdir as workdir_lib
from cpbjax.config import schema as config_lib


class RunMismatch(ValueError):
    """--workdir holds a run of another config or series set, so it cannot resume."""


# Data fields that change where or how candles are fetched, never which candles.
FETCH_FIELDS = (
    "base_url",
    "cache_dir",
    "parsed_cache",
    "download_workers",
    "timeout_seconds",
    "download_deadline_s",
    "retries",
)
# Train fields that change how the coins are computed, never what they train (a streamed
# epoch trains as the device-resident one, tests/streaming_test.py).
EXECUTION_FIELDS = ("compact_groups", "stream_chunk_steps")


def training_fields(config) -> dict:
    """The config fields that decide what a run trains (JSON types)."""
    keys = ("seed", "dtype", "matmul_precision", "data", "model", "train")
    fields = writers.to_jsonable({k: config[k] for k in keys})
    for name in FETCH_FIELDS:
        del fields["data"][name]
    for name in EXECUTION_FIELDS:
        del fields["train"][name]
    return fields


def fingerprint(config, plan: list[list[str]], padded_candles: int | None = None) -> dict:
    """What a resumed run must share with the run that wrote the checkpoints: the config,
    the group plan, and the padded length T of the checkpointed arrays (default
    data.max_candles, what every run padded to before T followed the data)."""
    t = config.data.max_candles if padded_candles is None else padded_candles
    return {"config": training_fields(config), "groups": plan, "padded_candles": t}


def _differences(old, new, prefix="") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for k in sorted(set(old) | set(new))
            for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        ]
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def _read(path: str) -> dict:
    """The ledger's JSON; RunMismatch naming the file if it is damaged."""
    try:
        data = writers.read_json(path)
        data["fingerprint"]["config"], data["fingerprint"]["groups"], data["finished"]
    except (ValueError, KeyError, TypeError) as e:
        raise RunMismatch(
            f"{path} is damaged ({str(e).splitlines()[0][:120]}), so the run cannot be resumed: "
            "move the workdir aside and rerun, or use a new --workdir"
        ) from None
    return data


class Ledger:
    """The run's group plan and each finished group's results.json entries."""

    def __init__(self, workdir: str, run_fingerprint: dict):
        """Opens the ledger of `workdir`, creating it for a new run.

        Raises:
          RunMismatch: the workdir's ledger has another fingerprint.
        """
        self.workdir, self.path = workdir, workdir_lib.ledger(workdir)
        self.data = {"fingerprint": run_fingerprint, "finished": {}}
        if os.path.exists(self.path):
            old = _read(self.path)
            # Written by an earlier cpbjax: in today's schema (a field added since at the
            # value that reproduces the run, a retired one refused unless at its default).
            old_config = training_fields(config_lib.upgrade(old["fingerprint"]["config"]))
            # A ledger from before T followed the data padded to data.max_candles.
            old_t = old["fingerprint"].get("padded_candles", old_config["data"]["max_candles"])
            old_print = {**old["fingerprint"], "config": old_config, "padded_candles": old_t}
            diffs = _differences(old_print, run_fingerprint)
            if diffs:
                raise RunMismatch(
                    f"{workdir} holds a run with a different config or series, so it cannot be "
                    f"resumed ({'; '.join(diffs[:5])}); rerun the same command or use a new --workdir"
                )
            self.data = old
        else:
            self._write()

    def finished(self, group: str) -> dict | None:
        """The results.json entries of a finished group, None if it has not finished.

        Raises:
          RunMismatch: its entries file is missing or damaged.
        """
        done = self.data["finished"].get(group)
        if not isinstance(done, str):  # None, or entries inline (a ledger of cpbjax <= 0.1)
            return done
        path = os.path.join(os.path.dirname(self.path), done)
        try:
            return writers.read_json(path)
        except (OSError, ValueError) as e:
            raise RunMismatch(
                f"{path} is missing or damaged ({str(e).splitlines()[0][:120]}), so {group} "
                "cannot be resumed: move the workdir aside and rerun, or use a new --workdir"
            ) from None

    def finish(self, group: str, entries: dict) -> None:
        """Records `group` as finished with its entries (its own file, then groups.json)."""
        path = workdir_lib.finished_group(self.workdir, group)
        if sharding.is_primary():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            writers.write_json(path, entries)
        self.data["finished"][group] = os.path.relpath(path, os.path.dirname(self.path))
        self._write()

    def _write(self) -> None:
        if sharding.is_primary():
            writers.write_json(self.path, self.data)
