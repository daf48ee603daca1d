"""Data-layer speed: load (read, verify, parse, validate) and prepare all series of a mirror.

Times `sources.load_all` on a Binance Vision directory mirror (sha256 checks,
zip + CSV parsing, validation; no download, no processed-series cache, so every
run is a cold run of the data layer, with the OS page cache warm after the
first) and then `windows.prepare_series` (features, windows, normalisation) for
every loaded series, with the default OHLC features and with every feature.
Also times the synthetic source for the same series.

Usage:
  python benchmarks/data_bench.py --mirror $MIRROR --repeats 5
  Each run also writes its table to a new file benchmarks/records/data_bench-<UTC time>.md
  (--records-dir DIR elsewhere, --records-dir "" none).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # Run as a script: make the repo root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.data import sources, windows  # noqa: E402
from cpbjax.data.series import SeriesSkipped  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _run(data_cfg) -> dict:
    """One full pass; returns seconds per stage and counts."""
    start = time.perf_counter()
    series, skipped = sources.load_all(data_cfg)
    loaded = time.perf_counter()
    prepared = 0
    for s in series:
        try:
            windows.prepare_series(s, data_cfg)
            prepared += 1
        except SeriesSkipped:
            continue
    done = time.perf_counter()
    return {
        "load_s": loaded - start,
        "prepare_s": done - loaded,
        "total_s": done - start,
        "series": len(series),
        "skipped": len(skipped),
        "prepared": prepared,
        "candles": sum(s.notes["candles"] for s in series),
    }


def _median_row(name: str, data_cfg, repeats: int) -> dict:
    runs = [_run(data_cfg) for _ in range(repeats)]
    row = {"source": name, "first_total_s": runs[0]["total_s"]}
    for key in ("load_s", "prepare_s", "total_s"):
        row[f"median_{key}"] = sorted(r[key] for r in runs)[len(runs) // 2]
    row.update({k: runs[0][k] for k in ("series", "skipped", "prepared", "candles")})
    return row


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--mirror",
        default=str(REPO.parent / "shared/data/binance-vision"),
        help="Binance Vision directory mirror (data.base_url)",
    )
    p.add_argument("--config", default=str(REPO / "configs/transformer.py"))
    p.add_argument("--repeats", type=int, default=5)
    common.add_records_dir_flag(p)
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = _args(argv)
    config = config_lib.validate(config_lib.load(args.config))
    config.data.base_url = args.mirror
    rows = [_median_row("binance (directory mirror)", config.data, args.repeats)]
    config.data.features = config_lib.FEATURES
    rows.append(_median_row("binance, all features", config.data, args.repeats))
    config.data.source = "synthetic"
    rows.append(_median_row("synthetic, all features", config.data, args.repeats))
    columns = [
        "source",
        "series",
        "skipped",
        "prepared",
        "candles",
        "first_total_s",
        "median_load_s",
        "median_prepare_s",
        "median_total_s",
    ]
    table = common.markdown_table(rows, columns)
    common.print_and_record(args.records_dir, "data_bench", "Data layer, all series", table, argv)
    return rows


if __name__ == "__main__":
    main()
