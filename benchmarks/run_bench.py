"""Whole runs: `launch.py` end to end per model, its wall time split into stages.

For each model, one run with a cold compile cache (a new empty cache folder) and one
with the cache it left (warm), each into a new workdir. The stages come from the run's
own <workdir>/timings.json (load, prepare, setup, compile, train, host, evaluate,
report) and its XLA programs: `programs` counts those built (compiled, or read from the
compile cache when warm), `xla s` their build seconds and `epoch xla s` those of the
epoch program; `startup` is the rest of the process's wall time (Python and jax imports,
device start, config); `peak GiB` the run's peak resident memory. Writes one record per
invocation to benchmarks/records/.

  python benchmarks/run_bench.py --models gru,transformer,lstm --variant demo
  python benchmarks/run_bench.py --models gru --variant "" \
      --flags="--config.data.base_url=$MIRROR --config.platform=gpu"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("startup", "load", "prepare", "setup", "compile", "train", "host", "evaluate", "report")
# Runs one command and prints its peak RSS (KiB) as the last line: RUSAGE_CHILDREN of a
# fresh wrapper process holds exactly that run's maximum.
_PEAK_RSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def config_path(model: str, variant: str) -> str:
    """--config's value for a model and an optional variant ("tiny")."""
    return f"configs/{model}.py" + (f":{variant}" if variant else "")


def run_once(config: str, flags: list[str], cache: str, workdir: str) -> dict:
    """One `launch.py` run with compile cache `cache`; returns its stage seconds, total wall
    seconds, XLA programs built (all, and of the train epoch) and peak resident memory."""
    cmd = [sys.executable, "launch.py", f"--config={config}", f"--workdir={workdir}", *flags]
    env = dict(os.environ, CPBJAX_COMPILATION_CACHE=cache)
    began = time.monotonic()
    wrapped = [sys.executable, "-c", _PEAK_RSS, *cmd]
    proc = subprocess.run(wrapped, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    peak_gib = int(proc.stdout.strip().splitlines()[-1]) / 2**20
    timings = json.loads((Path(workdir) / "timings.json").read_text())
    stages = {s: timings["stages"].get(s, 0.0) for s in STAGES[1:]}
    compiles = timings.get("compiles", [])  # XLA programs built (compiled, or read from the cache)
    epoch_s = [c["seconds"] for c in compiles if c["program"] == "jit(run_epoch)"]
    return {
        "startup": wall - timings["driver_seconds"],
        **stages,
        "wall": wall,
        "programs": len(compiles),
        "xla s": sum(c["seconds"] for c in compiles),
        "epoch programs": len(epoch_s),
        "epoch xla s": sum(epoch_s),
        "peak GiB": peak_gib,
    }


def bench(models: list[str], variant: str, flags: list[str]) -> list[dict]:
    """Cold then warm runs of each model; one row each."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            cache = os.path.join(tmp, f"cache-{model}")
            for kind in ("cold", "warm"):
                workdir = os.path.join(tmp, f"{model}-{kind}")
                seconds = run_once(config_path(model, variant), flags, cache, workdir)
                rows.append(
                    {"model": model, "cache": kind, **{k: round(v, 2) for k, v in seconds.items()}}
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gru,transformer,lstm")
    parser.add_argument("--variant", default="demo", help="configs/<model>.py:<variant>; '' = none")
    parser.add_argument("--flags", default="", help="extra launch.py flags, one string")
    common.add_records_dir_flag(parser)
    args = parser.parse_args()
    flags = ["--config.logging.progress=plain", *shlex.split(args.flags)]
    rows = bench(args.models.split(","), args.variant, flags)
    columns = ["model", "cache", *STAGES, "wall", "programs", "xla s", "epoch xla s", "peak GiB"]
    table = common.markdown_table(rows, columns)
    title = "Whole runs: stage seconds, cold and warm compile cache"
    common.print_and_record(args.records_dir, "run_bench", title, table)


if __name__ == "__main__":
    main()
