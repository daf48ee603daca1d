"""What `train.pooled_chunk` costs in speed: seconds per epoch of one pooled config at
several chunk sizes, alternated in one run, beside the memory each needs.

  python benchmarks/chunk_speed.py --config configs/gru.py --chunks 0,8 --series 40 \
      --candles 1500 --epochs 4 --rounds 3

benchmarks/variant_speed.py with --field train.pooled_chunk --values <--chunks> on the
config made pooled (train.share=pooled): its cells, rounds and table. A chunk changes
only how the one gradient of a step is summed, so every cell does the same work in exact
arithmetic. Writes one record to benchmarks/records/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, variant_speed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="0,8", help="pooled_chunk sizes, first = reference")
    variant_speed.add_cell_flags(parser)
    args = parser.parse_args()
    variant_speed.check_rounds(parser, args)
    chunks = [int(z) for z in args.chunks.split(",")]
    overrides = {"train.share": "pooled", **common.parse_overrides(args.set)}
    rows = variant_speed.measure(args, "train.pooled_chunk", chunks, overrides)
    table = common.markdown_table(rows, list(rows[0]))
    common.print_and_record(
        args.records_dir, "chunk_speed", "Speed of a chunked pooled step", table
    )


if __name__ == "__main__":
    main()
