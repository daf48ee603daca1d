"""Re-scoring a finished run (`launch.py --mode evaluate`) at each numpy BLAS thread count.

The evaluation is numpy: forecasts come from one jitted program, then metrics, the
Diebold-Mariano tests and three fitted baselines (ridge, volatility band, HAR) per series
and split, whose least-squares fits are small (at most ~40,000 x 30). This script times
the whole process and its `evaluate` wall seconds at each OPENBLAS_NUM_THREADS value,
alternated round by round (A B A B ...) so load drifts hit every arm alike, and
reports medians. Writes one record to benchmarks/records/.

  python launch.py --config configs/gru.py:demo --workdir /tmp/demo --config.eval.plots=False
  python benchmarks/eval_bench.py --workdir /tmp/demo --config configs/gru.py:demo \
      --threads 1,2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402


def evaluate_once(workdir: str, config: str, threads: str) -> float:
    """Wall seconds of one `--mode evaluate` process with OPENBLAS_NUM_THREADS=threads."""
    cmd = [sys.executable, "launch.py", "--mode=evaluate", f"--config={config}"]
    cmd += [f"--workdir={workdir}", "--config.eval.plots=False"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed: {proc.stderr[-2000:]}")
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a finished run's folder")
    parser.add_argument("--config", required=True, help="the run's --config")
    parser.add_argument("--threads", default="1,2", help="OPENBLAS_NUM_THREADS values")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records-dir", default=common.RECORDS_DIR, help="'' = write none")
    args = parser.parse_args()
    arms = args.threads.split(",")
    seconds: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in arms if r % 2 == 0 else reversed(arms):
            seconds[arm].append(evaluate_once(args.workdir, args.config, arm))
            print(f"round {r + 1}: {arm} thread(s) {seconds[arm][-1]:.1f} s", flush=True)
    base = statistics.median(seconds[arms[-1]])
    rows = [
        {
            "OPENBLAS_NUM_THREADS": arm,
            "rounds": len(s),
            "median wall s": round(statistics.median(s), 1),
            "every round": " ".join(f"{x:.1f}" for x in s),
            f"x of {arms[-1]} thread(s)": round(statistics.median(s) / base, 2),
        }
        for arm, s in seconds.items()
    ]
    table = common.markdown_table(rows, list(rows[0]))
    title = "--mode evaluate of a finished run, per numpy BLAS thread count"
    common.print_and_record(args.records_dir, "eval_bench", title, table)


if __name__ == "__main__":
    main()
