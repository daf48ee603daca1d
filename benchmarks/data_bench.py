"""Data-layer speed: cold and warm loads, window preparation and one group's host arrays.

Times on a Binance Vision directory mirror (no download): `sources.load_all` cold (a
fresh, empty data.parsed_cache folder: sha256 checks, zip + CSV parsing in worker
processes once there are many, cache writes, validation) and warm (the same folder:
the parsed arrays read back instead of the CSVs); then `windows.prepare_all` (features,
windows, normalisation) and `stacking.stack_group` of every prepared series as one group
(the padded host arrays, persistence scales and band fits of the setup stage), with the
config's features and with every feature. Also times the synthetic source for the same
series (no parsed cache: its cold and warm loads are alike).

Usage:
  python benchmarks/data_bench.py --mirror $MIRROR --config configs/mlp.py --repeats 3
  Each run also writes its table to a new file benchmarks/records/data_bench-<UTC time>.md
  (--records-dir DIR elsewhere, --records-dir "" none).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # Run as a script: make the repo root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from cpbjax.config import schema as config_lib  # noqa: E402
from cpbjax.data import sources, stacking, windows  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("cold_load_s", "warm_load_s", "prepare_s", "stack_s")


def _timed(fn):
    """(fn(), seconds it took)."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _run(data_cfg, cache_folder: str) -> dict:
    """One full pass with an empty parsed cache in `cache_folder`; seconds per stage and counts."""
    data_cfg.parsed_cache = tempfile.mkdtemp(dir=cache_folder)
    (series, skipped), cold = _timed(lambda: sources.load_all(data_cfg))
    _, warm = _timed(lambda: sources.load_all(data_cfg))
    (preps, _), prepare = _timed(
        lambda: windows.prepare_all(series, data_cfg, keep_train_only=True)
    )
    t_max = stacking.padded_length(preps, data_cfg) if preps else 0
    _, stack = _timed(lambda: preps and stacking.stack_group(preps, len(preps), data_cfg, t_max))
    return {
        **dict(zip(STAGES, (cold, warm, prepare, stack), strict=True)),
        "series": len(series),
        "skipped": len(skipped),
        "prepared": len(preps),
        "candles": sum(s.notes["candles"] for s in series),
    }


def _median_row(name: str, data_cfg, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="data_bench-") as cache_folder:
        runs = [_run(data_cfg, cache_folder) for _ in range(repeats)]
    row = {"source": name}
    for key in STAGES:
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
    p.add_argument("--config", default=str(REPO / "configs/mlp.py"))
    p.add_argument("--repeats", type=int, default=3)
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
    columns = ["source", "series", "skipped", "prepared", "candles"]
    columns += [f"median_{key}" for key in STAGES]
    table = common.markdown_table(rows, columns)
    common.print_and_record(args.records_dir, "data_bench", "Data layer, all series", table, argv)
    return rows


if __name__ == "__main__":
    main()
