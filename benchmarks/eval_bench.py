"""Re-scoring a finished run (`launch.py --mode evaluate`): per numpy BLAS thread count,
or per source tree (the same run scored by two versions of cpbjax).

The evaluation is numpy: forecasts come from one jitted program, then metrics, the
Diebold-Mariano tests and three fitted baselines (ridge, volatility band, HAR) per series
and split, whose least-squares fits are small (at most ~40,000 x 30). This script times
the whole process at each arm (a source tree x an OPENBLAS_NUM_THREADS value), alternated
round by round (A B A B ...) so load drifts hit every arm alike, and reports medians.
Each arm scores its own copy of the workdir (models/, config.json, results.json), so the
finished run is never touched; the table also gives the largest relative difference of
any series' val or test MAE (open, high, low, close) from the first arm's, read from
each copy's newest eval-<stamp>.json. Writes one record to benchmarks/records/.

  python launch.py --config configs/gru.py:demo --workdir runs/demo --config.eval.plots=False
  python benchmarks/eval_bench.py --workdir runs/demo --config configs/gru.py:demo \
      --threads 1,2 --rounds 3
  git worktree add ../before <commit>   # then the same run scored by both versions:
  python benchmarks/eval_bench.py --workdir runs/X --trees ../before,. --threads 1 \
      --config.data.base_url=$MIRROR

Flags the script does not know (as that base_url) go to launch.py unchanged.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import common  # noqa: E402

COPIED = ("models", "config.json", "results.json")


def copy_run(workdir: str, into: str) -> str:
    """A copy of what `--mode evaluate` reads and rewrites in `workdir`; returns its path."""
    os.makedirs(into)
    for name in COPIED:
        src = os.path.join(workdir, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(into, name))
        elif os.path.exists(src):
            shutil.copy2(src, os.path.join(into, name))
    return into


def evaluate_once(tree: str, workdir: str, config: str | None, threads: str, flags=()) -> float:
    """Wall seconds of one `--mode evaluate` process of source `tree`, at
    OPENBLAS_NUM_THREADS=threads, with extra launch.py `flags`; config None: the
    workdir's own config.json."""
    config = config or f"configs/workdir.py:{workdir}"
    cmd = [sys.executable, "launch.py", "--mode=evaluate", f"--config={config}"]
    cmd += [f"--workdir={workdir}", "--config.eval.plots=False", *flags]
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads)
    began = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} in {tree} failed: {proc.stderr[-2000:]}")
    return time.monotonic() - began


def column_maes(workdir: str) -> dict:
    """(series, split, column) -> MAE of the newest `--mode evaluate` results of a workdir
    (<workdir>/eval-<stamp>.json; training's results.json is not rewritten by it)."""
    stamped = sorted(glob.glob(os.path.join(workdir, "eval-*.json")))
    if not stamped:
        raise RuntimeError(f"{workdir}: no eval-*.json: --mode evaluate wrote no results")
    with open(stamped[-1]) as f:
        results = json.load(f)
    return {
        (name, split, col): entry[split]["columns"][col]["mae"]
        for name, entry in results["series"].items()
        for split in ("val", "test")
        if (entry.get(split) or {}).get("columns")
        for col in entry[split]["columns"]
    }


def largest_difference(got: dict, want: dict) -> float:
    """The largest relative difference of one scoring's MAEs from another's."""
    if set(got) != set(want):
        raise RuntimeError("the arms scored different series, splits or columns")
    return max(abs(got[k] - want[k]) / abs(want[k]) for k in want)


def _arms(args) -> list[tuple[str, str]]:
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    return [(tree, threads) for tree in trees for threads in args.threads.split(",")]


def _label(arm: tuple[str, str], arms) -> str:
    tree, threads = arm
    many_trees = len({t for t, _ in arms}) > 1
    return f"{tree} @ {threads} thread(s)" if many_trees else f"{threads} thread(s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a finished run's folder")
    parser.add_argument("--config", default=None, help="the run's --config (default: its own)")
    parser.add_argument("--threads", default="1,2", help="OPENBLAS_NUM_THREADS values")
    parser.add_argument("--trees", default=ROOT, help="comma-separated cpbjax source trees")
    parser.add_argument("--rounds", type=int, default=3)
    common.add_records_dir_flag(parser)
    args, flags = parser.parse_known_args()  # the rest go to launch.py as they are
    arms = _arms(args)
    seconds = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as scratch:
        copies = {arm: os.path.join(scratch, f"arm{i}") for i, arm in enumerate(arms)}
        for arm in arms:
            copy_run(os.path.abspath(args.workdir), copies[arm])
        for r in range(args.rounds):
            for arm in arms if r % 2 == 0 else reversed(arms):
                tree, threads = arm
                seconds[arm].append(evaluate_once(tree, copies[arm], args.config, threads, flags))
                print(f"round {r + 1}: {_label(arm, arms)} {seconds[arm][-1]:.1f} s", flush=True)
        maes = {arm: column_maes(copies[arm]) for arm in arms}
    base = statistics.median(seconds[arms[-1]])
    rows = [
        {
            "arm": _label(arm, arms),
            "rounds": len(s),
            "median wall s": round(statistics.median(s), 1),
            "every round": " ".join(f"{x:.1f}" for x in s),
            f"x of {_label(arms[-1], arms)}": round(statistics.median(s) / base, 2),
            "largest MAE change vs arm 1": f"{largest_difference(maes[arm], maes[arms[0]]):.1e}",
        }
        for arm, s in seconds.items()
    ]
    table = common.markdown_table(rows, list(rows[0]))
    title = "--mode evaluate of a finished run, per source tree and numpy BLAS thread count"
    common.print_and_record(args.records_dir, "eval_bench", title, table)


if __name__ == "__main__":
    main()
