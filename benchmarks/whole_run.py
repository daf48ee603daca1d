"""Whole runs: `launch.py` end to end per model, cold then warm caches, the wall in stages.

For each repeat and model: one run with cold caches (a new empty folder as XDG_CACHE_HOME,
so the parsed-array cache starts empty, and as CPBJAX_COMPILATION_CACHE's parent, so the
XLA cache does), then one warm (the same folders again, a new workdir). The stages come
from the run's <workdir>/timings.json, which partition launch.py's clock: startup
(imports, device start, config), load, prepare, setup, compile, train, host, evaluate,
report, other (the driver's seconds in no named stage); `untimed` is the rest of the
process's wall that clock cannot see (the interpreter's start before launch.py's first
line, its exit after timings.json), so the stages sum to the wall. Also: `programs` the
XLA programs built (compiled, or read from the XLA cache when warm), `xla s` their build
seconds, `epoch xla s` those of the epoch program, `peak GiB` the run's peak resident
memory. The table shows each figure's median over the repeats and each stage's share of
the median wall; one record per invocation goes to benchmarks/records/ (markdown, and
JSON with every run's figures).

  python benchmarks/whole_run.py --models mlp --variant demo --repeats 1
  python benchmarks/whole_run.py --base-url "$MIRROR" --repeats 3 \\
      --flags="--config.platform=gpu --config.eval.plots=False"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
MODELS = ("mlp", "transformer", "gru", "lstm")
# timings.json's stages (cpbjax/report/runlog.py StageClock), then the process's untimed rest.
CLOCKED = (
    "startup",
    "load",
    "prepare",
    "setup",
    "compile",
    "train",
    "host",
    "evaluate",
    "report",
    "other",
)
STAGES = (*CLOCKED, "untimed")
# "all but train": the wall less the train stage, issue #53's figure (warm <= half of cold).
FIGURES = ("all but train", "programs", "xla s", "epoch xla s", "peak GiB")
# Runs one command and prints its peak RSS (KiB) as the last line: RUSAGE_CHILDREN of a
# fresh wrapper process holds exactly that run's maximum.
_PEAK_RSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def config_path(model: str, variant: str) -> str:
    """--config's value for a model and an optional variant ("tiny")."""
    return f"configs/{model}.py" + (f":{variant}" if variant else "")


def figures(timings: dict, wall: float, peak_gib: float) -> dict:
    """One run's figures from its timings.json and the wall seconds of its process:
    the seconds of each of STAGES (a stage the run did not enter is 0), which sum to
    "wall", and the XLA programs it built."""
    stages = {s: timings["stages"].get(s, 0.0) for s in CLOCKED}
    compiles = timings.get("compiles", [])  # XLA programs built (compiled, or read from the cache)
    epoch_s = [c["seconds"] for c in compiles if c["program"] == "jit(run_epoch)"]
    return {
        **stages,
        "untimed": wall - sum(stages.values()),
        "wall": wall,
        "all but train": wall - stages["train"],
        "programs": len(compiles),
        "xla s": sum(c["seconds"] for c in compiles),
        "epoch programs": len(epoch_s),
        "epoch xla s": sum(epoch_s),
        "peak GiB": peak_gib,
    }


def run_once(config: str, flags: list[str], caches: str, workdir: str) -> dict:
    """One `launch.py` run whose caches are under `caches` (XDG_CACHE_HOME: the parsed
    arrays; <caches>/xla: the XLA programs); returns its `figures`.

    Raises:
      RuntimeError: the run failed (its command, exit status and the end of its stderr).
    """
    cmd = [sys.executable, "launch.py", f"--config={config}", f"--workdir={workdir}", *flags]
    xla = os.path.join(caches, "xla")
    env = dict(os.environ, XDG_CACHE_HOME=caches, CPBJAX_COMPILATION_CACHE=xla)
    began = time.monotonic()
    wrapped = [sys.executable, "-c", _PEAK_RSS, *cmd]
    proc = subprocess.run(wrapped, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    peak_gib = int(proc.stdout.strip().splitlines()[-1]) / 2**20
    timings = json.loads((Path(workdir) / "timings.json").read_text())
    return figures(timings, wall, peak_gib)


def bench(models: list[str], variant: str, flags: list[str], repeats: int) -> dict:
    """`repeats` rounds of, per model, a cold run and then a warm one; returns
    (model, "cold" | "warm") -> every round's figures."""
    runs: dict = {(m, kind): [] for m in models for kind in ("cold", "warm")}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for model in models:
                caches = os.path.join(tmp, f"caches-{model}-{r}")  # new and empty: cold
                for kind in ("cold", "warm"):
                    workdir = os.path.join(tmp, f"{model}-{kind}-{r}")
                    got = run_once(config_path(model, variant), flags, caches, workdir)
                    runs[model, kind].append(got)
                    print(
                        json.dumps({"model": model, "cache": kind, "round": r, **got}), flush=True
                    )
    return runs


def median_row(model: str, kind: str, runs: list[dict]) -> dict:
    """The table row of one model's cold or warm runs: each figure's median, and each
    stage as "seconds (share of the median wall)". The median stages need not sum to the
    median wall over several repeats; over one they do."""
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    row = {"model": model, "cache": kind, "runs": len(runs), "wall": round(median["wall"], 1)}
    for s in STAGES:
        row[s] = f"{median[s]:.1f} ({median[s] / median['wall']:.0%})"
    row.update({f: round(median[f], 2) for f in FIGURES})
    return row


def table(runs: dict) -> str:
    """The markdown table of `bench`'s runs: one row per model and cache; then, per model,
    the median of its warm runs' all-but-training seconds over its cold runs'."""
    rows = [median_row(model, kind, got) for (model, kind), got in runs.items()]
    lines = [common.markdown_table(rows, ["model", "cache", "runs", "wall", *STAGES, *FIGURES])]
    for model in dict.fromkeys(m for m, _ in runs):
        cold, warm = (
            statistics.median(r["all but train"] for r in runs[model, kind])
            for kind in ("cold", "warm")
        )
        lines.append(
            f"\n{model}: all but training, warm / cold = {warm:.1f} / {cold:.1f} s = {warm / cold:.0%}"
        )
    return "\n".join(lines)


def _args(argv=None) -> argparse.Namespace:
    """The flags; a bad one exits 2 with one line naming it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="configs/<model>.py each")
    parser.add_argument("--base-url", default="", help="a Binance Vision mirror: real series")
    parser.add_argument(
        "--variant",
        default=None,
        help="configs/<model>.py:<variant>; default demo, none with --base-url",
    )
    parser.add_argument("--repeats", type=int, default=1, help="cold-warm rounds; medians shown")
    parser.add_argument("--flags", default="", help="extra launch.py flags, one string")
    common.add_records_dir_flag(parser)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats} must be at least 1")
    args.models = args.models.split(",")
    for model in args.models:
        if not (ROOT / config_path(model, "")).is_file():
            parser.error(f"--models: no config {config_path(model, '')}")
    if args.variant is None:
        args.variant = "" if args.base_url else "demo"
    return args


def main() -> None:
    args = _args()
    flags = ["--config.logging.progress=plain", *shlex.split(args.flags)]
    if args.base_url:
        flags.append(f"--config.data.base_url={args.base_url}")
    runs = bench(args.models, args.variant, flags, args.repeats)
    title = "Whole runs: stage seconds and share of the wall, cold and warm caches"
    data = {
        "models": args.models,
        "variant": args.variant,
        "base_url": args.base_url,
        "launch_flags": flags,
        "runs": [{"model": m, "cache": k, "rounds": got} for (m, k), got in runs.items()],
    }
    common.print_and_record(args.records_dir, "whole_run", title, table(runs), data=data)


if __name__ == "__main__":
    main()
