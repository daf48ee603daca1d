"""--mode data: one row per configured series (candles, time range, gaps, months, the
windows of each split, the reason a series is skipped), then the totals and times.

  python launch.py --mode data --config configs/mlp.py --config.data.base_url=/path/to/mirror

The windows are each series' own (`windows.prepare_all`); a pooled run (train.share=
pooled) may purge some more with fractional splits (`pooling`), none with split_dates.
"""

from __future__ import annotations

import time

from cpbjax.data import sources, windows

_HEADER = (
    "series",
    "candles",
    "first",
    "last",
    "gaps",
    "longest",
    "months",
    "failed",
    *windows.SPLITS,
    "status",
)


def table_rows(data_cfg, series, skipped, preps=()) -> list[tuple[str, ...]]:
    """Rows of strings in config order, one per (symbol, interval) of data_cfg; the window
    counts come from `preps` (a series in `skipped` after loading, or absent, shows "-")."""
    by_name = {s.name: s for s in series}
    counts = {p.name: [str(len(p.ends[split])) for split in windows.SPLITS] for p in preps}
    rows = []
    for name in (f"{s}-{i}" for s in data_cfg.symbols for i in data_cfg.intervals):
        if name not in by_name:
            rows.append((name, *["-"] * (len(_HEADER) - 2), f"skipped: {skipped[name]}"))
            continue
        n = by_name[name].notes
        failed = n.get("failed_months", {})
        status = "ok" if not failed else "partly loaded: " + sources.format_failed(failed)
        if name in skipped:  # loaded, but it has no windows to train or score
            status = f"no windows: {skipped[name]}" + ("" if status == "ok" else f"; {status}")
        if n.get("dropped_rows"):
            status += f" ({n['dropped_rows']} invalid candles dropped)"
        rows.append(
            (
                name,
                str(n["candles"]),
                n["first"][:16],
                n["last"][:16],
                str(n["gaps"]),
                str(n["longest_gap"]),
                str(len(n.get("months", []))),
                str(len(failed)),
                *counts.get(name, ["-"] * len(windows.SPLITS)),
                status,
            )
        )
    return rows


def format_table(rows) -> str:
    """Left-aligned columns under _HEADER; the last (status) column is not padded."""
    widths = [max(len(r[j]) for r in [_HEADER, *rows]) for j in range(len(_HEADER) - 1)]
    lines = []
    for row in [_HEADER, *rows]:
        cells = [cell.ljust(w) for cell, w in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]))
    return "\n".join(lines)


def run_data_table(config) -> None:
    """Loads and windows the series of `config` (validated) and prints their table."""
    started = time.perf_counter()
    series, skipped = sources.load_all(config.data)
    loaded = time.perf_counter()
    preps, unusable = windows.prepare_all(series, config.data)
    prepared = time.perf_counter()
    print(format_table(table_rows(config.data, series, {**skipped, **unusable}, preps)))
    print(f"\n{len(series)} of {len(series) + len(skipped)} series loaded.")
    totals = {split: sum(len(p.ends[split]) for p in preps) for split in windows.SPLITS}
    print(
        f"{len(preps)} series have windows in every split, {sum(len(p.ohlc) for p in preps)} "
        f"candles; windows: " + ", ".join(f"{k} {v}" for k, v in totals.items()) + f"; "
        f"{len(unusable)} loaded series have none to score (their status says why)."
    )
    print(
        f"Loading took {loaded - started:.1f} s, preparing the windows {prepared - loaded:.1f} s."
    )
