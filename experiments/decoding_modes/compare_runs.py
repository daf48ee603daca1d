"""Compares finished run workdirs on their test-split results (e.g. decoding modes).

  python experiments/decoding_modes/compare_runs.py runs/gru-autoregressive runs/gru-direct

Prints one markdown row per workdir. What a choice between runs may be based on comes
first, from the validation split: the median best val loss (in the run's `train.loss`,
normalised) and the median val close skill. Then the test split, reported but never
used to choose: median close skill against the better naive forecast (and how many
series are positive), how many beat naive at Diebold-Mariano p < 0.05, median
directional accuracy against the median up-share. Last, the training seconds of all
groups.
"""

import argparse
import json
import os
import statistics

COLUMNS = (
    "workdir",
    "model",
    "decoding",
    "series",
    "best_val_loss_median",
    "val_close_skill_median_pct",
    "close_skill_median_pct",
    "skill_positive",
    "dm_better_p05",
    "dir_acc_median_pct",
    "up_share_median_pct",
    "train_seconds",
)


def summarise(workdir: str) -> dict:
    """One row of the comparison from <workdir>/results.json and config.json."""
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    scored = [s for s in results["series"].values() if s.get("test")]
    tests = [s["test"] for s in scored]
    skills = [t["columns"]["close"]["skill"] for t in tests]
    dm = [t["dm"]["p_value_better"] for t in tests]
    groups = {s["group"]: s["group_train_seconds"] for s in results["series"].values()}
    return {
        "workdir": workdir,
        "model": config["model"]["name"],
        "decoding": config["model"]["decoding"],
        "series": len(tests),
        "best_val_loss_median": float(
            f"{statistics.median(s['best_val_loss'] for s in scored):.4g}"
        ),
        "val_close_skill_median_pct": round(
            100 * statistics.median(s["val"]["columns"]["close"]["skill"] for s in scored), 2
        ),
        "close_skill_median_pct": round(100 * statistics.median(skills), 2),
        "skill_positive": sum(s > 0 for s in skills),
        "dm_better_p05": sum(p is not None and p < 0.05 for p in dm),
        "dir_acc_median_pct": round(
            100 * statistics.median(t["direction"]["accuracy"] for t in tests), 1
        ),
        "up_share_median_pct": round(
            100 * statistics.median(t["direction"]["up_share"] for t in tests), 1
        ),
        "train_seconds": round(sum(groups.values()), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workdirs", nargs="+", help="finished run workdirs")
    workdirs = parser.parse_args(argv).workdirs
    for workdir in workdirs:
        if not os.path.isfile(os.path.join(workdir, "results.json")):
            parser.error(f"{workdir}: no results.json (not a finished run's workdir)")
    rows = [summarise(w) for w in workdirs]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
