"""A learning-rate sweep as one run vs one run per rate, side by side: wall seconds.

Runs `launch.py` once with `--config.sweep.learning_rate=<rates>` (every series x rate a
coin of the same programs) and once per rate with `--config.train.learning_rate=<rate>`,
each with its own empty compile cache (a learning rate is a constant of a plain run's
program, so each separate run compiles its own). Reports per arm the summed process wall
seconds, the training part (setup + compile + train + host stages of timings.json), its
epochs after each program's first ("train" stage), the epoch programs' XLA build
seconds, and the median over --repeats. On a CPU an epoch's cost
grows with its coins, so the sweep saves mainly the extra compiles and process starts; on
an accelerator with room for the extra coins the epoch costs about the same, so the sweep
should take about 1/len(rates) of the separate runs' training time. Writes one record to
benchmarks/records/.

  python benchmarks/sweep_bench.py --config configs/gru.py:tiny --rates 3e-4,1e-3,3e-3 \
      --flags="--config.data.intervals=\"('1h',)\" --config.train.epochs=5"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, whole_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAIN_STAGES = ("setup", "compile", "train", "host")


def run_once(config: str, flags: list[str], tmp: str, name: str) -> dict:
    """One `launch.py` run (whole_run's) in a new workdir with new (cold) caches."""
    workdir, caches = os.path.join(tmp, name), os.path.join(tmp, f"caches-{name}")
    got = whole_run.run_once(config, flags, caches, workdir)
    return {
        "wall": got["wall"],
        "training": sum(got[s] for s in TRAIN_STAGES),
        "epochs s": got["train"],
        "epoch programs": got["epoch programs"],
        "epoch xla s": got["epoch xla s"],
    }


def _summed(runs: list[dict]) -> dict:
    return {k: sum(r[k] for r in runs) for k in runs[0]}


def bench(config: str, rates: list[str], flags: list[str], repeats: int) -> list[dict]:
    """`repeats` rounds of (the sweep, the separate runs); one row per arm, medians."""
    arms: dict = {"sweep (1 run)": [], f"separate ({len(rates)} runs)": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            sweep = [f"--config.sweep.learning_rate=({','.join(rates)},)"]
            arms["sweep (1 run)"].append(run_once(config, flags + sweep, tmp, f"sweep-{r}"))
            separate = [
                run_once(config, [*flags, f"--config.train.learning_rate={lr}"], tmp, f"lr{i}-{r}")
                for i, lr in enumerate(rates)
            ]
            arms[f"separate ({len(rates)} runs)"].append(_summed(separate))
            print(json.dumps({k: v[-1] for k, v in arms.items()}), flush=True)
    rows = []
    for arm, runs in arms.items():
        medians = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        rows.append(
            {"arm": arm, "repeats": repeats, **{k: round(v, 1) for k, v in medians.items()}}
        )
    rows.append({"arm": "ratio sweep / separate", **_ratios(rows[0], rows[1])})
    return rows


def _ratios(sweep: dict, separate: dict) -> dict:
    keys = ("wall", "training", "epochs s", "epoch xla s")
    return {k: round(sweep[k] / separate[k], 2) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/gru.py:tiny")
    parser.add_argument("--rates", default="3e-4,1e-3,3e-3", help="learning rates, comma-separated")
    parser.add_argument("--flags", default="", help="extra launch.py flags, one string")
    parser.add_argument("--repeats", type=int, default=1)
    common.add_records_dir_flag(parser)
    args = parser.parse_args()
    flags = ["--config.logging.progress=plain", "--config.eval.plots=False"]
    flags += shlex.split(args.flags)
    rows = bench(args.config, args.rates.split(","), flags, args.repeats)
    columns = ["arm", "repeats", "wall", "training", "epochs s", "epoch programs", "epoch xla s"]
    table = common.markdown_table(rows, columns)
    title = "Sweep cost: one learning-rate sweep vs one run per rate (seconds)"
    common.print_and_record(args.records_dir, "sweep_bench", title, table)


if __name__ == "__main__":
    main()
