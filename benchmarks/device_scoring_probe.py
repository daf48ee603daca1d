"""Would scoring's kernels pay on the device? The weighted quantile and the ridge normal
equations, numpy (as evaluate runs them) against JAX on the default backend.

  python benchmarks/device_scoring_probe.py --windows 60000,140000 --repeats 5

Issue #53 asks for the baselines, the interval and the metrics as JAX programs, with
today's numpy code as their oracle. Before building them: on one synthetic series'
band scores (benchmarks/quantile_speed.py's, `--windows` fit windows, 40 columns, the
interval's levels 0.1 and 0.9), time band.weighted_quantiles (numpy, one BLAS thread)
against a sort-based weighted quantile in JAX float64 (`jax.enable_x64`: float32 keys
would tie values numpy tells apart), and the ridge Gram matrix of 62 features against
JAX's. "device" times include copying the inputs over and the result back; "kernel"
times the program alone on inputs already there. The JAX quantile must pick the numpy
one's values, bit for bit, or the script stops. On the 2-core CPU JAX's sort loses
(measured 2026-11-28: 0.5 s against 0.03 s at 60,000 windows); run it on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from benchmarks.quantile_speed import band_scores  # noqa: E402
from cpbjax import band  # noqa: E402

LEVELS = (0.1, 0.9)
RIDGE_FEATURES = 62  # baselines.ridge_features: 29 returns, 30 ranges, 3 shapes


@jax.jit
def weighted_quantiles(keys_NV, weights_N, levels_J):
    """band.weighted_quantiles of columns without left-out entries, [V, J]: the first
    value, ascending, whose cumulative weight reaches q of the column's total."""
    order_VN = jnp.argsort(keys_NV.T, axis=1)
    sorted_VN = jnp.take_along_axis(keys_NV.T, order_VN, axis=1)
    cum_VN = jnp.cumsum(weights_N[order_VN], axis=1)
    target_VJ = levels_J[None, :] * cum_VN[:, -1:]
    at_VJ = jax.vmap(jnp.searchsorted)(cum_VN, target_VJ)
    return jnp.take_along_axis(sorted_VN, at_VJ, axis=1)


@jax.jit
def gram(z_NX):
    return z_NX.T @ z_NX


def _timed(fn, repeats: int) -> float:
    """Median seconds of fn() after one warm-up call (its compile)."""
    jax.block_until_ready(fn())
    return common.median_time(lambda: jax.block_until_ready(fn()), repeats)[0]


def probe(windows: int, repeats: int) -> list[dict]:
    """The rows of one size: the quantile and the Gram matrix, numpy against JAX."""
    scores, sigma = band_scores(windows)
    ranged_N = sigma > 0  # the windows band_scores leaves out (NaN): none left out here
    scores, sigma = scores[ranged_N], sigma[ranged_N]
    z = np.random.default_rng(0).standard_normal((len(scores), RIDGE_FEATURES))
    # BLAS held to one thread, as evaluate's scoring threads hold it
    with jax.enable_x64(True), threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        on_device = [jax.device_put(a) for a in (scores, sigma, np.asarray(LEVELS), z)]
        picked = np.asarray(weighted_quantiles(*on_device[:3]))
        if not np.array_equal(picked, band.weighted_quantiles(scores, sigma, LEVELS)):
            raise SystemExit("the JAX weighted quantile picked other values than band.py's")
        cases = {
            f"weighted quantile {scores.shape[1]} x {len(LEVELS)}": (
                lambda: band.weighted_quantiles(scores, sigma, LEVELS),
                lambda: np.asarray(weighted_quantiles(scores, sigma, np.asarray(LEVELS))),
                lambda: weighted_quantiles(*on_device[:3]),
            ),
            f"ridge Gram {RIDGE_FEATURES} x {RIDGE_FEATURES}": (
                lambda: z.T @ z,
                lambda: np.asarray(gram(z)),
                lambda: gram(on_device[3]),
            ),
        }
        rows = []
        for name, (numpy_fn, device_fn, kernel_fn) in cases.items():
            host, device, kernel = (_timed(f, repeats) for f in (numpy_fn, device_fn, kernel_fn))
            rows.append(
                {
                    "windows": len(scores),
                    "kernel": name,
                    "numpy ms": round(1e3 * host, 2),
                    "device ms": round(1e3 * device, 2),
                    "kernel ms": round(1e3 * kernel, 2),
                    "numpy / device": round(host / device, 2),
                }
            )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="60000,140000")
    parser.add_argument("--repeats", type=int, default=5)
    common.add_records_dir_flag(parser)
    args = parser.parse_args(argv)
    rows = [row for n in args.windows.split(",") for row in probe(int(n), args.repeats)]
    table = common.markdown_table(rows, list(rows[0]))
    title = (
        f"Scoring kernels, numpy against JAX on {jax.default_backend()}, median of {args.repeats}"
    )
    common.print_and_record(args.records_dir, "device_scoring_probe", title, table)


if __name__ == "__main__":
    main()
