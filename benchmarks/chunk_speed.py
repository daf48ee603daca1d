"""What `train.pooled_chunk` costs in speed: seconds per epoch of one pooled config at
several chunk sizes, alternated in one run, beside the memory each needs.

  python benchmarks/chunk_speed.py --config configs/gru.py --chunks 0,8 --series 40 \
      --candles 1500 --epochs 4 --rounds 3

Each cell is one `cpbjax.train` of the config (pooled) on N synthetic 1h series, or on
--base-url's series, cut to the newest --candles (data.min_candles lowered to fit), for
--epochs epochs with early stopping off (patience > epochs), at `train.pooled_chunk` = Z.
A chunk changes only how the one gradient of a step is summed, so every cell does the
same work in exact arithmetic. Its
epoch seconds are metrics.jsonl's `seconds` of every epoch after the first (the first
also runs setup the later ones do not). Each round runs every Z once, in order, and
each Z's ratio to the first Z is taken within the round, so a machine that is slower in
one round slows both sides of that round's ratio; the table gives medians over rounds.
`GiB per device` is the need the driver measured before the first epoch (timings.json
`epoch_memory`, cpbjax/memory.py). Writes one record to benchmarks/records/.
"""

from __future__ import annotations

import argparse
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


def measure(args, overrides: dict) -> list[dict]:
    """Rounds of one cell per chunk size; one row per chunk size."""
    chunks = [int(z) for z in args.chunks.split(",")]
    steady = {z: [] for z in chunks}  # every steady epoch's seconds, all rounds
    ratios = {z: [] for z in chunks}  # per round: median epoch at z / at chunks[0]
    gib = {}
    for round_index in range(args.rounds):
        medians = {}
        for z in chunks:
            fields = {
                **overrides,
                "train.share": "pooled",
                "train.pooled_chunk": z,
                "train.epochs": args.epochs,
                "train.patience": args.epochs + 1,
                "data.max_candles": args.candles,
                "data.min_candles": min(args.candles, 1000),
            }
            config = common.bench_config(args.config, fields, args.base_url, args.series)
            seconds, gib[z] = run_cell(config)
            steady[z] += seconds
            medians[z] = statistics.median(seconds)
            print(json.dumps({"round": round_index, "chunk": z, "epoch_s": seconds}), flush=True)
        for z in chunks:
            ratios[z].append(medians[z] / medians[chunks[0]])
    return [
        {
            "pooled_chunk (Z)": z,
            "s per epoch (median)": statistics.median(steady[z]),
            f"x Z={chunks[0]} (median of rounds)": statistics.median(ratios[z]),
            "GiB per device": None if gib[z] is None else round(gib[z], 3),
            "epochs timed": len(steady[z]),
        }
        for z in chunks
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/gru.py", help="a config path")
    parser.add_argument("--chunks", default="0,8", help="pooled_chunk sizes, first = reference")
    parser.add_argument("--series", type=int, default=40, help="synthetic series")
    parser.add_argument("--base-url", default="", help="a kline mirror; default synthetic")
    parser.add_argument("--candles", type=int, default=1500, help="data.max_candles per series")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per cell (>= 2)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds")
    parser.add_argument("--set", default="", help="config overrides: key=value,...")
    common.add_records_dir_flag(parser)
    args = parser.parse_args()
    if args.epochs < 2 or args.rounds < 1:
        parser.error("--epochs must be >= 2 (the first is not timed) and --rounds >= 1")
    rows = measure(args, common.parse_overrides(args.set))
    table = common.markdown_table(rows, list(rows[0]))
    common.print_and_record(
        args.records_dir, "chunk_speed", "Speed of a chunked pooled step", table
    )


if __name__ == "__main__":
    main()
