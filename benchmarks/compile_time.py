"""Cold compile seconds of each default's run programs: the group init and the epoch.

  python benchmarks/compile_time.py --models transformer,gru,lstm,mlp --rounds 3

For each configs/<model>.py default, builds the GroupTrainer that `--mode train` builds
for its series on this machine (K coins by plan.group_size over --series series, or the
model's DEFAULT_SERIES; T the config's data.max_candles, or --candles for a config
without a cap) and lowers and compiles its init and epoch programs from abstract shapes
(no data). Each measurement runs in a fresh process after runtime.configure, as launch.py
applies it, with an empty XLA compilation cache (CPBJAX_COMPILATION_CACHE): every
compile is cold. The rounds alternate the models; each cell is the median over them,
compile wall seconds with the process's CPU seconds beside (the machine may be shared).
Writes one record to benchmarks/records/.
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

from benchmarks import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Series of a default run: the 40 real series of the sequence models' configs; the global
# model's 87, every series of the shared mirror (docs/performance.md).
DEFAULT_SERIES = {"mlp": 87}
SEQUENCE_SERIES = 40
# T of a config without a candle cap (the global model's): the mirror's 27 months of 15m
# candles (80,352) rounded up to stacking.LENGTH_BUCKET.
UNCAPPED_CANDLES = 80_384
PROGRAMS = ("init", "epoch")


def timed(run) -> tuple[float, float, object]:
    """(wall seconds, this process's CPU seconds, result) of run()."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = run()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def measure(model: str, num_series: int, candles: int) -> dict:
    """Lowers and compiles the init and epoch programs of configs/<model>.py's default run
    (in this process: run it in a fresh one for a cold compile)."""
    import jax
    import numpy as np

    from cpbjax import models, runtime, sharding
    from cpbjax.config import schema as config_lib
    from cpbjax.modes import plan
    from cpbjax.training import epoch_spec
    from cpbjax.training.group import GroupTrainer

    config = config_lib.load(str(ROOT / "configs" / f"{model}.py"))
    backend = runtime.configure(config)
    t_max = config.data.max_candles or candles
    spec = epoch_spec.make_spec(config, models.build(models.make_config(config)), t_max)
    mesh = sharding.coin_mesh()
    k = plan.group_size(num_series, config.train, mesh.size, backend)
    trainer = GroupTrainer(spec, k, mesh)
    arrays = trainer.abstract_arrays()
    keys = jax.ShapeDtypeStruct((k, 2), np.uint32, sharding=trainer.coin_sharding)
    lower = {
        "init": lambda: trainer.lowered_init(keys, arrays),
        "epoch": lambda: trainer.lowered_epoch(trainer.abstract_state(), arrays),
    }
    row = {"model": model, "K": k, "T": t_max}
    for name in PROGRAMS:
        lower_s, _, lowered = timed(lower[name])
        compile_s, cpu_s, _ = timed(lowered.compile)
        row[f"{name} lower s"], row[f"{name} compile s"] = round(lower_s, 2), round(compile_s, 2)
        row[f"{name} compile cpu s"] = round(cpu_s, 2)
    return row


def measure_cold(model: str, num_series: int, candles: int) -> dict:
    """`measure` in a fresh process with an empty compilation cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CPBJAX_COMPILATION_CACHE=cache)
        flags = ["--one", model, "--series", str(num_series), "--candles", str(candles)]
        proc = subprocess.run(
            [sys.executable, __file__, *flags], env=env, capture_output=True, text=True
        )
    if proc.returncode:
        raise RuntimeError(f"{model}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """Per model, every timed cell's median over the rounds (K and T as measured)."""
    rows = []
    for cells in zip(*rounds, strict=True):
        row = dict(cells[0])
        for key in list(row):
            if key.endswith(" s"):
                row[key] = round(statistics.median(c[key] for c in cells), 2)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="transformer,gru,lstm,mlp")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per model")
    parser.add_argument("--series", type=int, default=0, help="0 = each model's default run's")
    parser.add_argument("--candles", type=int, default=UNCAPPED_CANDLES)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one model, JSON out
    common.add_records_dir_flag(parser)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.series, args.candles)), flush=True)
        return
    names = args.models.split(",")
    series = {m: args.series or DEFAULT_SERIES.get(m, SEQUENCE_SERIES) for m in names}
    rounds = []
    for r in range(args.rounds):
        rounds.append([measure_cold(m, series[m], args.candles) for m in names])
        print(f"round {r + 1}: {rounds[-1]}", flush=True)
    rows = median_rows(rounds)
    table = common.markdown_table(rows, list(rows[0]))
    common.print_and_record(
        args.records_dir, "compile_time", "Cold compile of the run programs", table
    )


if __name__ == "__main__":
    main()
