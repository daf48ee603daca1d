"""Speed of band.weighted_quantiles, the scoring fits' kernel (docs/performance.md, "Evaluation").

  python benchmarks/quantile_speed.py --windows 60000 --repeats 5

On one synthetic 1h series, the volatility band's scores of `--windows` fit windows
(log(price[t+h] / close[t]) / sigma, sigma-weighted, H = 10 steps x 4 columns) are fitted
as scoring fits them: the interval's two levels (0.1, 0.9) of all 40 columns, and the
band's median of 20. Each is timed by the search long columns get (the strided sample's
bracket, band.BRACKET_MIN_ROWS) and by a sort of every whole column, with the median of
`--repeats` calls; both must pick the same values, or the script stops.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from cpbjax import band  # noqa: E402
from cpbjax.data import synthetic  # noqa: E402

L, H = 30, 10


def band_scores(windows: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [N, H * C] with NaN where sigma is 0, sigma [N]) of a synthetic series."""
    series = synthetic.generate("BTCUSDT", "1h", windows + L + H, seed=0)
    ohlc, ends = series.ohlcv[:, :4], np.arange(L - 1, windows + L - 1)
    sigma = band.ewma_range(ohlc, ends, L)
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = band.future_log_ratios(ohlc, ends, H) / sigma[:, None, None]
    return np.where((sigma > 0)[:, None, None], scores, np.nan).reshape(windows, -1), sigma


def timed(scores, sigma, levels, min_rows: int, repeats: int):
    """(median seconds, the quantiles) of weighted_quantiles with BRACKET_MIN_ROWS = min_rows."""
    kept, band.BRACKET_MIN_ROWS = band.BRACKET_MIN_ROWS, min_rows
    try:
        seconds, _ = common.median_time(
            lambda: band.weighted_quantiles(scores, sigma, levels), repeats
        )
        return seconds, band.weighted_quantiles(scores, sigma, levels)
    finally:
        band.BRACKET_MIN_ROWS = kept


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=60000)
    parser.add_argument("--repeats", type=int, default=5)
    common.add_records_dir_flag(parser)
    args = parser.parse_args(argv)
    scores, sigma = band_scores(args.windows)
    rows = []
    for fit, columns, levels in (("interval", 40, (0.1, 0.9)), ("band median", 20, (0.5,))):
        bracketed, got = timed(
            scores[:, :columns], sigma, levels, band.BRACKET_MIN_ROWS, args.repeats
        )
        whole, want = timed(scores[:, :columns], sigma, levels, sys.maxsize, args.repeats)
        if not np.array_equal(got, want):
            raise SystemExit(f"{fit}: the bracketed search picked other values than the sort")
        rows.append(
            {
                "fit": fit,
                "columns x levels": f"{columns} x {len(levels)}",
                "sort (ms)": round(1e3 * whole, 1),
                "bracket (ms)": round(1e3 * bracketed, 1),
                "speed-up": round(whole / bracketed, 2),
            }
        )
    table = common.markdown_table(rows, list(rows[0]))
    title = f"band.weighted_quantiles, {args.windows} windows, median of {args.repeats}"
    common.print_and_record(args.records_dir, "quantile_speed", title, table)


if __name__ == "__main__":
    main()
