"""Scaling curve: whole runs on 40 to 1,000 synthetic series, wall time and peak memory.

  python benchmarks/scaling.py --sizes 40,120,360,1000 --model gru --variant tiny

Each size N is one `launch.py` run of N synthetic series (N/2 made-up symbols x 15m, 1h)
into a new workdir, all sizes sharing one compile cache that a first, smallest run warms
(so the figures are what a repeated run pays; the compile is its own column). Per size:
whole_run's stage seconds, wall time, XLA programs and peak resident memory, and the
seconds per series. Plots are off (`eval.plots=False`): they are per-series work that a
user with 1,000 series turns off.
Writes one record to benchmarks/records/.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, whole_run  # noqa: E402

INTERVALS = ("15m", "1h")


def symbols_flag(num_series: int) -> str:
    """--config.data.symbols of num_series / 2 synthetic symbols (S0000USDT, ...)."""
    names = tuple(f"S{i:04d}USDT" for i in range(-(-num_series // len(INTERVALS))))
    return f"--config.data.symbols={names!r}"


def run_size(n: int, args, flags: list[str], cache: str, workdir: str) -> dict:
    """One run of n series: whole_run's stage seconds and peak memory, and per-series cost."""
    flags = [*flags, symbols_flag(n), f"--config.data.intervals={INTERVALS!r}"]
    config = whole_run.config_path(args.model, args.variant)
    got = whole_run.run_once(config, flags, cache, workdir)
    series = len(json.loads((Path(workdir) / "results.json").read_text())["series"])
    return {
        "series": series,
        **{k: round(v, 2) for k, v in got.items()},
        "s/series": round(got["wall"] / series, 3),
        "train+eval s/series": round((got["train"] + got["evaluate"]) / series, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="40,120,360,1000", help="series per run")
    parser.add_argument("--model", default="gru")
    parser.add_argument("--variant", default="tiny", help="configs/<model>.py:<variant>")
    parser.add_argument("--flags", default="", help="extra launch.py flags, one string")
    common.add_records_dir_flag(parser)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    flags = ["--config.logging.progress=plain", "--config.eval.plots=False"]
    flags += shlex.split(args.flags)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        run_size(min(sizes), args, flags, cache, os.path.join(tmp, "warm-up"))
        for n in sizes:
            rows.append(run_size(n, args, flags, cache, os.path.join(tmp, f"n{n}")))
            print(json.dumps(rows[-1]), flush=True)
    columns = list(rows[0])
    table = common.markdown_table(rows, columns)
    title = f"Scaling: whole {args.model} runs over synthetic series (warm compile cache)"
    common.print_and_record(args.records_dir, "scaling", title, table)


if __name__ == "__main__":
    main()
