"""Would averaging finished runs (e.g. the same config at seeds 0-2) forecast better?

  python experiments/ensemble_default/seed_ensemble.py runs/gru_default_cpu runs/gru_default_cpu_seed1 \
      runs/gru_default_cpu_seed2 --base-url $MIRROR

Every run's saved models forecast every split of every series, each refit as evaluation
refits it (eval.refit_band: val by the band refit on train, test on train+val). The
ensemble's forecast is the geometric mean of the members' prices (the mean of their
log forecasts: the models forecast log ratios to the last close).
Members and ensemble are then scored by `evaluate.evaluate_split` on the same windows,
and summarised as experiments/ablation.py does: median val skill per column and their
mean (the number a choice is made by), then test (reported only). A member's row must
equal its own results.json; the script checks this, so the comparison is like for like.
Writes one record to experiments/ensemble_default/records/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import common  # noqa: E402
from configs import workdir as workdir_config  # noqa: E402
from cpbjax import workdir as workdir_lib  # noqa: E402
from cpbjax import writers
from cpbjax.modes import trained_run
from cpbjax.score import (
    band_refit,
    evaluate,
    forecast,
    saved,  # noqa: E402
)
from experiments import ablation  # noqa: E402

SCORED = ("val", "test")
# Rescoring the saved float32 models moves an MAE by rounding only (<= 6e-9 seen).
MAX_DRIFT = 1e-6


def member_forecasts(workdir: str, base_url: str, series: list[str] | None):
    """(name -> PreparedSeries, name -> split -> refit SplitForecast) of one run."""
    config = workdir_config.get_config(workdir)
    if base_url:
        config.data.base_url = base_url
    available = saved.available_models(workdir)
    names = [n for n in available if series is None or n in series]
    loaded, trained, _ = saved.load_models(available, names)
    cfg = trained_run.run_config(config, trained, list(loaded))
    preps, _ = trained_run.prepare(cfg, loaded)
    L, H = cfg.data.lookback, cfg.data.horizon
    out = {}
    for name, prep in preps.items():
        model = loaded[name]
        raw = {
            s: forecast.split_forecast(model.module, model.params, prep, s, evaluate.EvalSpec(L, H))
            for s in ("train", *SCORED)
        }
        out[name] = {s: _refit(prep, raw, s, model.module, cfg) for s in SCORED}
    return preps, out, (L, H)


def _refit(prep, raw, split, module, cfg):
    if not (cfg.eval.get("refit_band", False) and band_refit.applies(module)):
        return raw[split]
    return band_refit.refit_for(split, prep, raw, evaluate.make_spec(cfg))[0][split]


def geometric_mean(fcs: list[forecast.SplitForecast]) -> forecast.SplitForecast:
    """The members' forecasts of one split combined: mean of log prices (and norms)."""
    if any(not np.array_equal(f.ends_N, fcs[0].ends_N) for f in fcs):
        raise ValueError("the runs forecast different windows: not the same data")
    prices_NHC = np.exp(np.mean([np.log(f.prices_NHC) for f in fcs], axis=0))
    norm_NHC = np.mean([f.norm_NHC for f in fcs], axis=0).astype(fcs[0].norm_NHC.dtype)
    return forecast.SplitForecast(fcs[0].ends_N, prices_NHC, norm_NHC)


def score(preps, fcs_by_series, L, H) -> dict:
    """name -> {"val": ..., "test": ...} entries, as results.json's (no intervals)."""
    return {
        name: {
            s: evaluate.evaluate_split(preps[name], fcs[s], s, evaluate.EvalSpec(L, H))
            for s in SCORED
        }
        for name, fcs in fcs_by_series.items()
    }


def check_member(workdir: str, entries: dict) -> float:
    """The largest relative difference of a member's MAEs from its results.json."""
    results = writers.read_json(workdir_lib.results_json(workdir))["series"]
    worst = 0.0
    for name, entry in entries.items():
        for s in SCORED:
            for col, m in entry[s]["columns"].items():
                ref = results[name][s]["columns"][col]["mae"]
                worst = max(worst, abs(m["mae"] - ref) / ref)
    return worst


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workdirs", nargs="+", help="finished runs of the same series")
    parser.add_argument("--base-url", default="", help="data.base_url (default: the run's)")
    parser.add_argument("--series", default="", help="comma-separated names (default: all)")
    common.add_records_dir_flag(
        parser, os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")
    )
    args = parser.parse_args(argv)
    series = args.series.split(",") if args.series else None
    members, rows = [], []
    for workdir in args.workdirs:
        preps, fcs, (L, H) = member_forecasts(workdir, args.base_url, series)
        entries = score(preps, fcs, L, H)
        drift = check_member(workdir, entries)
        print(
            f"{workdir}: {len(entries)} series, largest MAE difference from results.json {drift:.1e}"
        )
        if drift > MAX_DRIFT:
            raise RuntimeError(f"{workdir}: its models no longer score as its results.json")
        rows.append(ablation.summarise_entries(workdir, entries))
        members.append(fcs)
    shared = sorted(set.intersection(*(set(m) for m in members)))
    ensemble = {n: {s: geometric_mean([m[n][s] for m in members]) for s in SCORED} for n in shared}
    rows.append(ablation.summarise_entries("geometric mean", score(preps, ensemble, L, H)))
    table = ablation.table(rows).replace("| lever |", "| run |", 1)
    common.print_and_record(args.records_dir, "seed_ensemble", "Seed ensemble", table, argv)
    return rows


if __name__ == "__main__":
    main()
