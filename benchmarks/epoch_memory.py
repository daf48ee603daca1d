"""Memory one training epoch needs, from XLA's buffer assignment, without training.

  python benchmarks/epoch_memory.py --configs configs/gru.py,configs/transformer.py,configs/lstm.py \
      --base-url $MIRROR
  python benchmarks/epoch_memory.py --configs configs/gru.py --series 40,200,1000

Each row is one `cpbjax.train` of a config that stops as soon as its first group's epoch
program has compiled, where the driver asks cpbjax/training/memory.py whether it fits: the bytes
one epoch allocates beyond its data (temporaries and outputs, less the donated state),
per device and in all on this host's CPU devices, for a program of K coins (a pooled
model's K is every series that keeps train windows). With --base-url the data are that
mirror's series (the config's 40); without, N synthetic series per --series size (N
made-up symbols at 1h: over one calendar span, so a pooled model keeps them all). --set overrides config fields (key=value, comma-separated),
e.g. --set train.share=series. Writes one record to benchmarks/records/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# The CPU devices launch.py makes (one per core), so the programs are the ones it runs.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpbjax  # noqa: E402
from benchmarks import common  # noqa: E402
from cpbjax.training import memory  # noqa: E402

GIB = 2**30


class _Compiled(Exception):
    """Raised in place of the memory check, once the epoch program has compiled."""

    def __init__(self, need: memory.Need, backend: str):
        super().__init__(need)
        self.need, self.backend = need, backend


_COINS = []  # K of each program checked: the driver names it to memory.remedy first
_remedy = memory.remedy


def _note_coins(train_cfg, num_coins: int) -> str:
    _COINS.append(num_coins)
    return _remedy(train_cfg, num_coins)


def _stop_at_check(where, need, backend, capacity, remedy):
    raise _Compiled(need, backend)


def measure(path: str, overrides: dict, base_url: str, num_series: int | None) -> dict:
    """One row: the config's first epoch program, its need and compile wall seconds."""
    config = common.bench_config(path, overrides, base_url, num_series)
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        try:
            cpbjax.train(config, workdir)
        except _Compiled as done:
            need, backend = done.need, done.backend
        else:
            raise RuntimeError(f"{path}: trained without compiling an epoch program")
    t = config.train
    return {
        "config": path,
        "share": t.share,
        "series": len(config.data.symbols) * len(config.data.intervals),
        "coins (K)": _COINS[-1],
        "batch_size": t.batch_size,
        "GiB per device": round(need.per_device / GIB, 3),
        "devices": need.devices,
        f"GiB ({backend} pool)": round(need.on(backend) / GIB, 3),
        "wall s (load + compile)": round(time.monotonic() - began, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="configs/gru.py", help="comma-separated paths")
    parser.add_argument("--base-url", default="", help="a kline mirror; default synthetic")
    parser.add_argument("--series", default="40", help="synthetic series per row")
    parser.add_argument("--set", default="", help="config overrides: key=value,...")
    common.add_records_dir_flag(parser)
    args = parser.parse_args()
    memory.check = _stop_at_check  # the driver calls it right after the compile
    memory.remedy = _note_coins
    sizes = [None] if args.base_url else [int(n) for n in args.series.split(",")]
    rows = []
    for path in args.configs.split(","):
        for n in sizes:
            rows.append(measure(path, common.parse_overrides(args.set), args.base_url, n))
            print(json.dumps(rows[-1]), flush=True)
    table = common.markdown_table(rows, list(rows[0]))
    common.print_and_record(args.records_dir, "epoch_memory", "Memory of one epoch", table)


if __name__ == "__main__":
    main()
