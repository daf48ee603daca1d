"""How far a pooled run's val loss got below its best, epoch by epoch, in standard errors.

Early stopping keeps an epoch only if its pooled val loss beats the best so far by
train.min_delta standard errors of the paired gain (cpbjax/training/early_stopping.py). This prints,
for each workdir of a finished or running pooled run, every epoch's pooled val loss and
its gain over the best before it in those standard errors, so one can see whether a
run that kept its untrained band missed the bar narrowly or never came near it.

A run logged before metrics.jsonl carried `pooled_val_loss` gets it rebuilt: the
window-weighted mean of the per-series val losses over the val windows the purge across
series keeps (cpbjax/data/pooling.py), recomputed from the run's own config and data.

  python experiments/ensemble_default/val_gains.py runs/tf_default_cpu runs/tf_default_cpu_seed2
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app

from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.data import pooling
from cpbjax.modes import plan


def pooled_val(config, records: list[dict]) -> np.ndarray:
    """float [E]: each epoch's pooled val loss, logged or rebuilt from the purged counts."""
    if all(r.get("pooled_val_loss") is not None for r in records):
        return np.array([r["pooled_val_loss"] for r in records])
    preps, _ = plan.prepare_all(config)
    kept, _ = pooling.pool_ends(preps, config.data.lookback, config.data.horizon)
    n_S = np.array([len(kept[name]["val"]) for name in records[0]["series"]])
    return np.array([np.asarray(r["val_loss"], float) @ n_S / n_S.sum() for r in records])


def gains(records: list[dict], val_E: np.ndarray) -> list[tuple[int, float, float, bool]]:
    """(epoch, pooled val, gain over the best before it in standard errors, kept) per
    epoch; the gain of epoch 1 is NaN when it was kept (the untrained best is not logged).
    Kept is the logged `improved`; a run logged before it had one is read as kept where
    the best after the epoch is its val loss."""
    rows, best_before = [], None
    for r, val in zip(records, val_E, strict=True):
        best_after, se = r["best_val_loss"][0], (r.get("val_gain_se") or [None])[0]
        kept = bool(
            r["improved"][0] if "improved" in r else np.isclose(best_after, val, rtol=0, atol=1e-7)
        )
        before = best_before if best_before is not None else (None if kept else best_after)
        gain = (before - val) / se if before is not None and se else float("nan")
        rows.append((r["epoch"], float(val), gain, kept))
        best_before = best_after
    return rows


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: python experiments/ensemble_default/val_gains.py WORKDIR [WORKDIR ...]")
    for workdir in argv[1:]:
        config = config_lib.load(f"configs/workdir.py:{workdir}")
        records = writers.MetricsLog(workdir).records()
        if config.train.share != "pooled" or not records:
            print(f"{workdir}: not a pooled run with epochs logged")
            continue
        rows = gains(records, pooled_val(config, records))
        print(f"\n{os.path.basename(os.path.normpath(workdir))}")
        print("| epoch | pooled val | gain over best (SE) | kept |\n|---|---|---|---|")
        for epoch, val, gain, kept in rows:
            print(f"| {epoch} | {val:.5f} | {gain:+.2f} | {'yes' if kept else ''} |")
        missed = [g for _, _, g, k in rows if not k and np.isfinite(g)]
        print(f"largest gain of an epoch not kept: {max(missed, default=float('nan')):+.2f} SE")


if __name__ == "__main__":
    app.run(main)
