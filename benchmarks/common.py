"""Shared benchmark helpers: median timing, machine facts, markdown tables, run records."""

from __future__ import annotations

import ast
import datetime
import importlib.metadata
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from cpbjax import writers
from cpbjax.config import schema as config_lib

# Packages whose versions every recorded figure carries (absent ones are left out).
_VERSIONED = ("jax", "jaxlib", "flax", "optax", "torch", "numpy")


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    """Calls `fn` `repeats` times and returns (median seconds, every call's seconds).

    `fn` must finish its work before returning (e.g. `jax.block_until_ready` or a
    `.item()`), or the time measured is only the time to dispatch it. The median,
    not the mean, is reported because the machine is shared and noisy.

    Raises:
      ValueError: if `repeats` < 1.
    """
    if repeats < 1:
        raise ValueError(f"median_time: repeats={repeats} must be >= 1")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def _cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib(meminfo: str = "/proc/meminfo") -> float | None:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    except OSError:
        pass
    return None


def machine_facts() -> dict:
    """Facts that make a figure reproducible: CPU, cores, memory, versions, date.

    Versions come from the installed package metadata, so nothing heavy is
    imported; a package that is not installed is left out.
    """
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }
    for name in _VERSIONED:
        try:
            facts[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return facts


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A GitHub markdown table of `rows` (dicts) with one column per key in `columns`.

    Floats are printed to 4 significant digits; a missing key is an empty cell.
    """
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _facts_line(facts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in facts.items() if k != "date")


# Where the benchmark scripts write their records by default (--records-dir).
RECORDS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")


def add_records_dir_flag(parser, default: str = RECORDS_DIR) -> None:
    """--records-dir: where this run's record goes (a new file per run; "" = none).

    Experiments (experiments/<name>/) pass their own records folder as the default.
    """
    parser.add_argument(
        "--records-dir",
        default=default,
        help='write this run\'s record to a new file in this folder ("" = none)',
    )


def _record_stamp(date: str) -> str:
    """'2026-11-23 03:54 UTC' -> '20261123T0354Z' (file-name safe, sorts by time)."""
    try:
        when = datetime.datetime.strptime(date, "%Y-%m-%d %H:%M UTC")
    except ValueError:
        when = datetime.datetime.now(datetime.timezone.utc)
    return when.strftime("%Y%m%dT%H%MZ")


def write_record(
    records_dir: str,
    script: str,
    title: str,
    command: str,
    table_md: str,
    facts: dict | None = None,
    data: dict | None = None,
) -> str:
    """Writes one run's record (title, date, machine, versions, command, tables) to a new file.

    The file is `<records_dir>/<script>-<YYYYMMDDTHHMMZ>.md`, named by the UTC minute
    of `facts["date"]`; a second record of the same script in the same minute gets
    `-2`, `-3`, ... An existing record is never touched. The file is written with
    `cpbjax.writers.atomic_write`, so it appears whole; a missing folder is created.
    With `data`, a JSON twin of the same name (`.json`) holds the title, command,
    machine facts and `data`'s keys, for figures that a script reads back.

    Args:
      records_dir: the folder of records, usually `RECORDS_DIR` (benchmarks/records).
      script: the script's name without `.py`, e.g. "train_bench".
      title: the record's heading, e.g. "Torch baseline: seconds per model-epoch".
      command: the exact command line that produced the tables.
      table_md: the tables, e.g. from `markdown_table`.
      facts: machine facts; None measures them now with `machine_facts()`.
      data: the figures of the JSON twin, or None for none.

    Returns:
      The path of the record written (the markdown).
    """
    facts = machine_facts() if facts is None else facts
    text = (
        f"# {title} ({facts.get('date', '')})\n\n"
        f"Machine: {_facts_line(facts)}.\n\n"
        f"Command: `{command}`\n\n{table_md}"
    )
    os.makedirs(records_dir, exist_ok=True)
    stem = f"{script}-{_record_stamp(facts.get('date', ''))}"
    path, n = os.path.join(records_dir, f"{stem}.md"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(records_dir, f"{stem}-{n}.md")
    if data is not None:  # first, so that the markdown's name stays the free one until now
        twin = {"title": title, "command": command, "machine": facts, **data}
        writers.write_json(path[: -len(".md")] + ".json", twin)
    writers.atomic_write(path, text)
    return path


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The command that ran `script` (its name without .py) with `argv` (default: this
    process's arguments), quoted so that it can be pasted back into a shell."""
    return f"python benchmarks/{script}.py " + shlex.join(sys.argv[1:] if argv is None else argv)


def print_and_record(
    records_dir: str,
    script: str,
    title: str,
    table_md: str,
    argv: Sequence[str] | None = None,
    facts: dict | None = None,
    data: dict | None = None,
) -> str | None:
    """Prints a benchmark's tables and, unless records_dir is '', writes them as a record
    (`write_record`, with `command_line(script, argv)` and `data`'s JSON twin); returns
    the record's path."""
    print(table_md, flush=True)
    if not records_dir:
        return None
    command = command_line(script, argv)
    path = write_record(records_dir, script, title, command, table_md, facts, data)
    print(f"Record: {path}")
    return path


def parse_overrides(text: str) -> dict:
    """'train.share=series,model.quantiles=(0.1,0.5,0.9)' -> {field: value} (a benchmark's
    --set): items split at the commas outside brackets; values are Python literals where
    they parse, strings otherwise.

    Raises:
      ValueError: naming an item that is not field=value.
    """
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    out = {}
    for item in filter(None, items):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set item {item!r} is not field=value")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def bench_config(path: str, overrides: dict, base_url: str, num_series: int | None):
    """A config for a benchmark run: `path`'s, quiet (plain progress, no plots), on the
    mirror at `base_url` (its config's series) or, without one, on `num_series` made-up
    1h symbols (synthetic, over one calendar span, so a pooled model keeps them all),
    then `overrides` (flattened field -> value)."""
    c = config_lib.load(path)
    c.logging.progress, c.eval.plots = "plain", False
    if base_url:
        c.data.source, c.data.base_url = "binance", base_url
    else:
        c.data.source = "synthetic"
        c.data.symbols = tuple(f"S{i:04d}USDT" for i in range(num_series))
        c.data.intervals = ("1h",)
    c.update_from_flattened_dict(overrides)
    return c
