"""What `train.min_delta_mode=se` costs per epoch: the extra val pass of the best params.

For each `train.share`, the default config of the model (configs/<model>.py, its
defaults otherwise) builds two compiled group epochs of K coins on the same data, one
with the bar in standard errors (`se`) and one without it (`rel`); their epochs are
timed alternately, A B A B, so that the machine's load falls on both alike, and

  ratio = median se epoch seconds / median rel epoch seconds.

Usage:
  python experiments/early_stopping_margin/bar_cost.py [--model gru] [--coins 8] [--rounds 5] [--candles 5000]
      [--source synthetic|binance --base-url DIR] [--records-dir experiments/early_stopping_margin/records]
  The table also goes to a new record, experiments/early_stopping_margin/records/bar_cost-<UTC time>.md.
"""

from __future__ import annotations

import os

# One XLA device: a pooled model trains on one (GroupTrainer refuses a larger mesh), so
# both shares run there and their rows compare alike. A user's own XLA_FLAGS win.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common, train_bench  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402

MODES = ("rel", "se")


def mode_config(args, share: str, mode: str):
    """The model's default config with the benchmark's data, `share` and bar mode."""
    config = config_lib.load(str(train_bench.REPO / "configs" / f"{args.model}.py"))
    train_bench.set_bench_data(config, args)
    config.train.share, config.train.min_delta_mode = share, mode
    # One standard error (today's default), or the 0.5% share that was the default before.
    config.train.min_delta = 1.0 if mode == "se" else 0.005
    config.train.patience = config.train.epochs  # no coin stops while it is timed
    return config_lib.validate(config)


def share_row(args, share: str) -> dict:
    """Both modes' groups of one share, timed alternately; one table row."""
    groups = {}
    for mode in MODES:
        config = mode_config(args, share, mode)
        _, preps = train_bench.load_group_data(config)
        groups[mode] = train_bench.build_group(config, preps, args.coins)
        groups[mode].epoch()  # warm-up
    seconds = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            seconds[mode].append(groups[mode].epoch())
    rel, se = (statistics.median(seconds[m]) for m in MODES)
    return {
        "model": args.model,
        "share": share,
        "K": args.coins,
        "rounds": args.rounds,
        "rel_s_per_epoch": rel,
        "se_s_per_epoch": se,
        "ratio": se / rel,
        "rel_all": [round(s, 2) for s in seconds["rel"]],
        "se_all": [round(s, 2) for s in seconds["se"]],
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gru")
    p.add_argument("--coins", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--candles", type=int, default=5000)
    p.add_argument("--source", choices=("synthetic", "binance"), default="synthetic")
    p.add_argument("--base-url", default="")
    common.add_records_dir_flag(
        p, os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
    )
    args = p.parse_args(argv)
    if args.coins < 1 or args.rounds < 1:
        p.error("--coins and --rounds must be >= 1")
    if args.source == "binance" and not args.base_url:
        p.error("--source binance needs --base-url (a Binance Vision mirror)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    rows = [share_row(args, share) for share in ("series", "pooled")]
    columns = list(rows[0])
    table = common.markdown_table(rows, columns)
    common.print_and_record(
        args.records_dir, "bar_cost", "Epoch cost of the bar in standard errors", table, argv
    )


if __name__ == "__main__":
    main()
