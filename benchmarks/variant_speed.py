"""What one config field costs in speed: seconds per epoch of a config at several values of
ONE field, alternated in one run, beside the memory each needs.

  python benchmarks/variant_speed.py --config configs/transformer.py --field model.ensemble \
      --values 1,3 --series 40 --candles 1500 --epochs 4 --rounds 3 --set train.share=pooled

Each cell is one `cpbjax.train` of the config on N synthetic 1h series, or on --base-url's
series, cut to the newest --candles (data.min_candles lowered to fit), for --epochs epochs
with early stopping off (patience > epochs), with --field at one of --values (then --set's
overrides). Its epoch seconds are metrics.jsonl's `seconds` of every epoch after the first
(the first also compiles and runs setup the later ones do not). Each round runs every
value once, in order, and each value's ratio to the first is taken within the round, so
a machine that is slower in one round slows both sides of that round's ratio; the table
gives medians over rounds. `GiB per device` is the need the driver measured before the
first epoch (timings.json `epoch_memory`, cpbjax/training/memory.py). Writes one record to
benchmarks/records/.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

# The CPU devices launch.py makes (one per core), so the programs are the ones it runs.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={os.cpu_count() or 1}"
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cpbjax  # noqa: E402
from benchmarks import common  # noqa: E402

GIB = 2**30


def run_cell(config) -> tuple[list[float], float | None]:
    """Trains `config` in a scratch workdir: (steady epoch seconds, GiB per device)."""
    with tempfile.TemporaryDirectory() as workdir:
        cpbjax.train(config, workdir)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            seconds = [json.loads(line)["seconds"] for line in f]
        with open(os.path.join(workdir, "timings.json")) as f:
            needs = json.load(f)["epoch_memory"]
    per_device = needs[0]["per_device"] if needs else None
    return seconds[1:], None if per_device is None else per_device / GIB


def measure(args, field: str, values: list, overrides: dict) -> list[dict]:
    """Rounds of one cell per value of `field`; one row per value."""
    steady = {v: [] for v in values}  # every steady epoch's seconds, all rounds
    ratios = {v: [] for v in values}  # per round: median epoch at v / at values[0]
    gib = {}
    for round_index in range(args.rounds):
        medians = {}
        for v in values:
            fields = {
                field: v,
                "train.epochs": args.epochs,
                "train.patience": args.epochs + 1,
                "data.max_candles": args.candles,
                "data.min_candles": min(args.candles, 1000),
                **overrides,
            }
            config = common.bench_config(args.config, fields, args.base_url, args.series)
            seconds, gib[v] = run_cell(config)
            steady[v] += seconds
            medians[v] = statistics.median(seconds)
            print(json.dumps({"round": round_index, field: v, "epoch_s": seconds}), flush=True)
        for v in values:
            ratios[v].append(medians[v] / medians[values[0]])
    return [
        {
            field: v,
            "s per epoch (median)": statistics.median(steady[v]),
            f"x {values[0]} (median of rounds)": statistics.median(ratios[v]),
            "GiB per device": None if gib[v] is None else round(gib[v], 3),
            "epochs timed": len(steady[v]),
        }
        for v in values
    ]


def add_cell_flags(parser) -> None:
    """The flags of a cell and of the rounds, shared with chunk_speed.py."""
    parser.add_argument("--config", default="configs/gru.py", help="a config path")
    parser.add_argument("--series", type=int, default=40, help="synthetic series")
    parser.add_argument("--base-url", default="", help="a kline mirror; default synthetic")
    parser.add_argument("--candles", type=int, default=1500, help="data.max_candles per series")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per cell (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    parser.add_argument("--set", default="", help="config overrides: key=value,...")
    common.add_records_dir_flag(parser)


def check_rounds(parser, args) -> None:
    if args.epochs < 2 or args.rounds < 1:
        parser.error("--epochs must be >= 2 (the first is not timed) and --rounds >= 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", required=True, help="the flattened config field varied")
    parser.add_argument("--values", required=True, help="its values, first = reference")
    add_cell_flags(parser)
    args = parser.parse_args()
    check_rounds(parser, args)
    values = [ast.literal_eval(v) for v in args.values.split(",")]
    rows = measure(args, args.field, values, common.parse_overrides(args.set))
    table = common.markdown_table(rows, list(rows[0]))
    common.print_and_record(args.records_dir, "variant_speed", f"Speed by {args.field}", table)


if __name__ == "__main__":
    main()
