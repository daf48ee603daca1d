"""Issue #42's choices on the tuning pairs' validation split: one launch.py run of
configs/mlp.py per lever on the tuning pairs (resumed where its workdir exists), then one
val-only row per lever (val_skill.py). Test is never read here.

  python experiments/global_model/tune.py RUNS_DIR --lever base= \
      --lever lr3e-4="--config.train.learning_rate=3e-4" -- --config.data.base_url=$MIRROR
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.global_model import val_skill  # noqa: E402

TUNING = ["--config.data.symbols=('@tuning',)", "--config.eval.plots=False"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("--config", default="configs/mlp.py")
    parser.add_argument("--lever", action="append", required=True, help="NAME=FLAGS")
    args, shared = parser.parse_known_args()
    shared = [a for a in shared if a != "--"]
    for lever in args.lever:
        name, _, flags = lever.partition("=")
        workdir = os.path.join(args.runs, name)
        cmd = [sys.executable, "launch.py", "--config", args.config, "--workdir", workdir]
        started = time.perf_counter()
        with open(workdir + ".log", "a") as log:
            subprocess.run(
                cmd + TUNING + shared + shlex.split(flags), check=True, stdout=log, stderr=log
            )
        row = val_skill.row(workdir)
        row["flags"], row["seconds"] = flags, round(time.perf_counter() - started)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
