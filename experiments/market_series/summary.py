"""The per-setting table of a --mode ablate workdir (or a record of its "ablate"
section): median skill of high and low against the volatility band, in points, per
setting and split, and the sentences the run printed.

  python experiments/market_series/summary.py runs/market/ablate/results.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    with open(path) as f:
        ablate = json.load(f)["ablate"]
    print("setting              val high  val low  test high  test low  (vs band, points)")
    for setting, by_split in ablate["by_setting"].items():
        cells = [
            100 * by_split[split][col]["vs_band"]
            for split in ("val", "test")
            for col in ("high", "low")
        ]
        print(f"{setting:<20}" + "".join(f"{c:+9.2f}" for c in cells))
    print("\n".join(ablate["sentences"]))


if __name__ == "__main__":
    main(sys.argv[1])
