#!/usr/bin/env bash
# Does the global model's gain over the band fade with the months since its training data
# ended? On the tuning pairs only, with data that ends before the protocol's val span
# (2025-01): for each fold V0 (val V0..V0+2 months, as tune.py's folds), the default and
# the band (no epoch may clear the bar: the kept model is the untrained band, refit per
# series as every model is), test = the 20 months after val, forecasts saved; then
# heldout.py scores model - band on spans of months after val. One JSON line per span.
#   MIRROR=/path/to/mirror experiments/global_model/decay_runs.sh runs/decay
set -euo pipefail
cd "$(dirname "$0")/../.."
. experiments/global_model/tuning_run.sh
runs=${1:-runs/decay}
mkdir -p "$runs"
folds=${FOLDS:-"2023-03:2023-05:2024-12 2022-03:2022-05:2023-12"}
for fold in $folds; do
  IFS=: read -r v0 v1 end <<<"$fold"
  tuning_run "$runs/model$v0" "$v0" "$v1" "$end"
  band_run "$runs/band$v0" "$v0" "$v1" "$end"
  # Spans of months after val: [0, 2), [2, 6), [6, 12), [12, 20).
  python - "$runs" "$v0" "$v1" "$end" <<'PY'
import subprocess, sys
import numpy as np
runs, v0, v1, end = sys.argv[1:]
start = np.datetime64(v1, "M")
for a, b in ((0, 2), (2, 6), (6, 12), (12, 20)):
    lo, hi = str(start + a), str(start + b)
    subprocess.run([sys.executable, "experiments/global_model/heldout.py", f"{runs}/band{v0}",
                    f"{runs}/model{v0}", "--start", lo, "--end", hi], check=True)
PY
done
