"""Test scores of a trained workdir's saved models three ways: with the per-column fallback
the run decided (eval.column_fallback, as results.json), with the mask removed (the kept
model on every column, its band refit again), and decided again at train.min_delta=0.

Usage: python experiments/column_fallback/compare.py WORKDIR
"""

import dataclasses
import sys

from cpbjax import writers
from cpbjax.config import schema as config_lib
from cpbjax.models import heads
from cpbjax.modes import trained_run
from cpbjax.score import evaluate, metrics, saved


def _row(test: dict) -> str:
    band, cols = test["vol_band"]["columns"], test["columns"]
    vs_band = {c: 100 * metrics.skill(cols[c]["mae"], band[c]["mae"]) for c in ("high", "low")}
    return (
        f"close {100 * cols['close']['skill']:+.2f}% (DM z {test['dm']['statistic']:+.1f}) "
        f"high vs band {vs_band['high']:+.2f}% low vs band {vs_band['low']:+.2f}%"
    )


def main(workdir: str) -> None:
    results = writers.read_json(f"{workdir}/results.json")
    cfg = config_lib.upgrade(writers.read_json(f"{workdir}/config.json"))
    available = saved.available_models(workdir)
    loaded, trained, _ = saved.load_models(available, list(available))
    preps, _ = trained_run.prepare(trained_run.run_config(cfg, trained, list(loaded)), loaded)
    run_spec = evaluate.make_spec(cfg)
    specs = {
        "mask removed": dataclasses.replace(run_spec, column_fallback=False),
        "min_delta=0": dataclasses.replace(run_spec, min_delta=0.0),
    }
    for name, prep in preps.items():
        entry, model = results["series"][name], loaded[name]
        print(f"{name}: best_epoch {entry['best_epoch']}")
        print(f"   {'as run':13s} {_row(entry['test'])} {entry.get('baseline_columns')}")
        for label, spec in specs.items():
            params = heads.without_keep(model.params)
            got = evaluate.evaluate_model(model.module, params, prep, spec).entry
            print(f"   {label:13s} {_row(got['test'])} {got.get('baseline_columns', '')}")


if __name__ == "__main__":
    main(sys.argv[1])
