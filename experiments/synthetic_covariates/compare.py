"""Test skill of two workdirs side by side: the model with covariates (A) and without (B).

Per series and column (high, low): each model's skill against the volatility band it
corrects (the verdict's "vs band", in points), and A's gain over B (1 - MAE_A / MAE_B, in
points); then the medians and how many series are ahead. A series whose column fell back
to the band (eval.column_fallback) scores 0 against it. Where both workdirs saved their
forecasts (eval.save_forecasts=True), also on how many series A's gain is significant:
Diebold-Mariano on the windows' horizon-averaged absolute errors (lag H-1, one-sided
p < 0.05), as results.json tests close.

Usage: python experiments/synthetic_covariates/compare.py WORKDIR_A WORKDIR_B
"""

import os
import statistics
import sys

import numpy as np

from cpbjax import writers
from cpbjax.report import verdict
from cpbjax.score import metrics

COLUMNS = ("high", "low")
SIGNIFICANT = 0.05  # one-sided DM p-value


def _dm_better(workdir_a: str, workdir_b: str, name: str, column: str) -> float | None:
    """DM p-value that A's horizon-averaged absolute error on `column` is lower than B's
    (None where the two forecasts are the same)."""
    paths = [os.path.join(w, "forecasts", f"{name}.npz") for w in (workdir_a, workdir_b)]
    a, b = (np.load(p) for p in paths)
    j = list(a["columns"]).index(column)
    np.testing.assert_array_equal(a["actual"], b["actual"])  # the same windows
    loss = [np.abs(x["predicted"][..., j] - x["actual"][..., j]).mean(axis=1) for x in (a, b)]
    return metrics.diebold_mariano(*loss, a["actual"].shape[1] - 1)["p_value_better"]


def _rows(results_a: dict, results_b: dict) -> dict:
    """{column: [(series, A vs band, B vs band, A over B)]}, in points."""
    out = {c: [] for c in COLUMNS}
    for name, a in results_a["series"].items():
        b = results_b["series"].get(name)
        if b is None or "test" not in a or "test" not in b:
            continue
        for c in COLUMNS:
            gain = metrics.skill(a["test"]["columns"][c]["mae"], b["test"]["columns"][c]["mae"])
            vs = (verdict.vs_band(x["test"], c) for x in (a, b))
            out[c].append((name, *(100 * v for v in vs), 100 * gain))
    return out


def main(workdir_a: str, workdir_b: str) -> None:
    results = [writers.read_json(f"{w}/results.json") for w in (workdir_a, workdir_b)]
    saved = all(os.path.isdir(os.path.join(w, "forecasts")) for w in (workdir_a, workdir_b))
    for column, rows in _rows(*results).items():
        print(f"{column}: series, A vs band, B vs band, A over B (points)")
        for name, a, b, gain in rows:
            print(f"  {name:14s} {a:+6.2f} {b:+6.2f} {gain:+6.2f}")
        n = len(rows)
        for i, label in ((1, "A vs band"), (2, "B vs band"), (3, "A over B")):
            values = [r[i] for r in rows]
            ahead = sum(v > 0 for v in values)
            print(f"  {label}: median {statistics.median(values):+.2f}, ahead on {ahead}/{n}")
        if saved:
            p_values = [_dm_better(workdir_a, workdir_b, r[0], column) for r in rows]
            hits = sum(p is not None and p < SIGNIFICANT for p in p_values)
            print(f"  A over B significant (DM, p < {SIGNIFICANT}) on {hits}/{n}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
