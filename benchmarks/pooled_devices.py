"""Seconds per epoch of a pooled model (train.share=pooled) on 1 and more XLA host devices.

  python benchmarks/pooled_devices.py --config configs/gru.py --devices 1,2,4 --series 8 \
      --candles 1500 --epochs 4 --rounds 2

The pooled model trains data-parallel over every device (cpbjax/training/pooled.py): each takes a
share of the coins of every step and one all-reduce adds their gradients. A device count
is fixed when jax starts, so each cell is a subprocess with
--xla_force_host_platform_device_count=N training the config with benchmarks/
variant_speed.py's `run_cell` (N synthetic 1h series, or --base-url's, early stopping
off; the steady epochs are those after the first). Each round runs every device count
once, in order; the table gives medians. Host devices share the CPU's cores, so on the
CPU this measures what splitting the step and its all-reduce cost, not a speed-up that
separate accelerators would give. Writes one record to benchmarks/records/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, variant_speed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def cell(args, devices: int) -> list[float]:
    """Steady epoch seconds of one pooled training on `devices` host devices."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker(args) -> None:
    """In the subprocess: trains the pooled config; prints its steady epoch seconds."""
    fields = {
        "train.share": "pooled",
        "train.epochs": args.epochs,
        "train.patience": args.epochs + 1,
        "data.max_candles": args.candles,
        "data.min_candles": min(args.candles, 1000),
        **common.parse_overrides(args.set),
    }
    config = common.bench_config(args.config, fields, args.base_url, args.series)
    seconds, _ = variant_speed.run_cell(config)
    print(json.dumps(seconds), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="1,4", help="host device counts, first = reference")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    variant_speed.add_cell_flags(parser)
    args = parser.parse_args()
    variant_speed.check_rounds(parser, args)
    if args.worker:
        worker(args)
        return
    counts = [int(n) for n in args.devices.split(",")]
    steady = {n: [] for n in counts}
    for round_index in range(args.rounds):
        for n in counts:
            steady[n] += cell(args, n)
            print(json.dumps({"round": round_index, "devices": n, "epoch_s": steady[n]}))
    reference = statistics.median(steady[counts[0]])
    rows = [
        {
            "host devices": n,
            "s per epoch (median)": statistics.median(steady[n]),
            f"x {counts[0]} device(s)": statistics.median(steady[n]) / reference,
            "epochs timed": len(steady[n]),
        }
        for n in counts
    ]
    table = common.markdown_table(rows, list(rows[0]))
    common.print_and_record(
        args.records_dir, "pooled_devices", "A pooled epoch on host devices", table
    )


if __name__ == "__main__":
    main()
