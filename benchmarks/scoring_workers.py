"""Scoring series in threads (what cpbjax does) or in spawned worker processes: which is
faster on this machine's cores? Measured on a finished run with `--mode evaluate`.

`evaluate.map_series` scores a wave's series side by side in SCORING_THREADS threads,
after the wave's forward passes. Numpy releases the GIL in its sorts and least squares,
but not in the Python between them; processes would not share the GIL, at the cost of
sending each series' candles and forecasts to a worker (pickled) and its scores back.
The "processes" arm replaces the wave's scoring with a pool of `--workers` spawned
processes (cpbjax/process_pool.py), started and warmed before the evaluation so their
start is not counted; the "threads" arm runs cpbjax as it is with `--workers` threads.
Each run is a fresh `launch.py --mode evaluate` process on the workdir with an empty
cache folder (so every baseline is fitted, as in a cold run), rounds alternate the
arms, and the table gives the medians of the scoring seconds (the waves' scoring, after
their forecasts) and of evaluate_models' wall. One record goes to benchmarks/records/.

  python benchmarks/scoring_workers.py --workdir runs/global --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = ("threads", "processes")
MARK = "SCORING_SECONDS "


def score_in_worker(job):
    """One series' evaluate._score_series in a worker: job = (module, numpy params, prep,
    spec, its splits' normalised forecasts, the splits, its entry)."""
    from cpbjax.score import evaluate, forecast

    module, params, prep, spec, norms, splits, entry = job
    trained = {s: forecast.priced(prep, prep.ends[s], norms[k]) for k, s in enumerate(splits)}
    return evaluate._score_series(module, params, prep, spec, trained, entry, None)


def _warm(_):
    import cpbjax.score.evaluate  # noqa: F401  (what a job imports, before the clock starts)

    time.sleep(0.5)  # so that every worker, not one, takes a warm-up task
    return os.getpid()


def _score_waves_in_processes(workers: int, timed) -> None:
    """Makes evaluate score each wave in a pool of `workers` spawned processes, started and
    warmed now; timed(fn, "scoring") wraps the wave's scoring in the clock."""
    import jax
    import numpy as np

    from cpbjax import process_pool
    from cpbjax.score import evaluate

    pool = process_pool.spawn(workers)
    assert len(set(pool.map(_warm, range(workers)))) == workers
    forecast_jobs, decide = evaluate.batch_forecast.forecast_jobs, evaluate._decide_columns
    wave = {}  # what score_in_worker needs of the wave being scored

    def keep_decided(module, params_list, preps, spec):
        entries, params_list = decide(module, params_list, preps, spec)
        wave.update(module=module, spec=spec, preps=preps, entries=entries)
        wave["params"] = [jax.tree.map(np.asarray, p) for p in params_list]
        return entries, params_list

    def keep_forecasts(*args):
        wave["norms"] = forecast_jobs(*args)
        return wave["norms"]

    def in_workers(score, indices, counted):  # map_series of the wave, in processes
        splits = evaluate.forecast_splits(wave["module"], wave["spec"])
        n, norms = len(splits), wave["norms"]
        work = [
            (wave["module"], wave["params"][j], wave["preps"][j], wave["spec"])
            + (norms[j * n : (j + 1) * n], splits, wave["entries"][j])
            for j in indices
        ]
        return list(pool.map(score_in_worker, work))

    evaluate._decide_columns = keep_decided
    evaluate.batch_forecast.forecast_jobs = keep_forecasts
    evaluate.map_series = timed(in_workers, "scoring")


def _run_arm(arm: str, workers: int, workdir: str) -> None:
    """Runs launch.py --mode evaluate on `workdir` in this process with the arm's scoring
    and prints MARK + JSON {scoring, evaluate} seconds."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as launch.py, before numpy loads
    from absl import app

    import launch
    from cpbjax.modes import evaluate as evaluate_mode
    from cpbjax.score import evaluate

    seconds = {"scoring": 0.0, "evaluate": 0.0}

    def timed(fn, key):
        def run(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            seconds[key] += time.perf_counter() - start
            return out

        return run

    evaluate.SCORING_THREADS = workers
    if arm == "processes":
        _score_waves_in_processes(workers, timed)
    else:
        evaluate.map_series = timed(evaluate.map_series, "scoring")
    evaluate_mode.evaluate_models = timed(evaluate.evaluate_models, "evaluate")
    sys.argv = ["launch.py", "--mode", "evaluate", "--workdir", workdir]
    try:
        app.run(launch.main, flags_parser=launch._parse_flags)
    except SystemExit as e:
        if e.code:
            raise
    print(MARK + json.dumps(seconds), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="a finished run to re-score")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one run, internal
    args = parser.parse_args()
    if args.arm:
        return _run_arm(args.arm, args.workers, os.path.abspath(args.workdir))
    from benchmarks import common

    figures = {arm: {"scoring": [], "evaluate": []} for arm in ARMS}
    for _ in range(args.rounds):
        for arm in ARMS:
            with tempfile.TemporaryDirectory() as cache:
                cmd = [sys.executable, __file__, "--arm", arm, "--workdir", args.workdir]
                cmd += ["--workers", str(args.workers)]
                env = dict(os.environ, XDG_CACHE_HOME=cache)
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            line = [x for x in out.stdout.splitlines() if x.startswith(MARK)][-1]
            for key, value in json.loads(line[len(MARK) :]).items():
                figures[arm][key].append(value)
    rows = [
        {"arm": arm, "workers": args.workers}
        | {
            f"{key} s, median (runs)": f"{statistics.median(v):.2f} ("
            + ", ".join(f"{x:.2f}" for x in v)
            + ")"
            for key, v in figures[arm].items()
        }
        for arm in ARMS
    ]
    table = common.markdown_table(rows, list(rows[0]))
    title = "Scoring series in threads or in spawned processes (--mode evaluate)"
    common.print_and_record(common.RECORDS_DIR, "scoring_workers", title, table, data=figures)


if __name__ == "__main__":
    main()
