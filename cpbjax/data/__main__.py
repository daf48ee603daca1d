"""Prints one row per configured series: candles, time range, gaps, months, skip reason.

  python -m cpbjax.data --config configs/transformer.py \\
      --config.data.base_url=../shared/data/binance-vision
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from cpbjax import cli_errors
from cpbjax import config as config_lib
from cpbjax.data import sources

_CONFIG = config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
flags.mark_flags_as_required(["config"])

_HEADER = ("series", "candles", "first", "last", "gaps", "longest", "months", "failed", "status")


def table_rows(data_cfg, series, skipped) -> list[tuple[str, ...]]:
    """Rows of strings in config order, one per (symbol, interval) of data_cfg."""
    by_name = {s.name: s for s in series}
    rows = []
    for name in (f"{s}-{i}" for s in data_cfg.symbols for i in data_cfg.intervals):
        if name in skipped:
            rows.append((name, "-", "-", "-", "-", "-", "-", "-", f"skipped: {skipped[name]}"))
            continue
        n = by_name[name].notes
        failed = n.get("failed_months", {})
        status = "ok" if not failed else "partly loaded: " + sources.format_failed(failed)
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


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        config = _CONFIG.value
        config.to_dict()  # a config file that failed to load raises only when read
    except (OSError, ValueError) as e:
        cli_errors.fail(cli_errors.load_error(e))
    try:
        config_lib.validate(config)
        series, skipped = sources.load_all(config.data)
    except config_lib.ConfigError as e:
        cli_errors.fail(str(e))
    print(format_table(table_rows(config.data, series, skipped)))
    print(f"\n{len(series)} of {len(series) + len(skipped)} series loaded.")


if __name__ == "__main__":
    app.run(main, flags_parser=cli_errors.parse_flags)
