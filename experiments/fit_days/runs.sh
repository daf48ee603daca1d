#!/usr/bin/env bash
# How far back the band refit and the calibrated interval should read the trained model's
# forecasts (eval.fit_days): the global default trained on the tuning pairs only, then
# scored by --mode evaluate once per setting of DAYS (0: every window of the splits
# before). Each evaluation's results.json goes to <runs>/eval-<days>.json and its
# wall seconds to <runs>/seconds.tsv; summary.py prints the table.
#   MIRROR=/path/to/mirror experiments/fit_days/runs.sh [runs/fit_days]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-runs/fit_days}
days=${DAYS:-0 730 365 180 90}
mkdir -p "$runs"
work="$runs/global-tuning"
[ -f "$work/results.json" ] || python launch.py --config configs/mlp.py --workdir "$work" \
  --config.data.base_url="$MIRROR" "--config.data.symbols=('@tuning',)" \
  --config.eval.plots=False ${FLAGS:-} >>"$runs/log.txt" 2>&1
for d in $days; do
  [ -f "$runs/eval-$d.json" ] && continue
  start=$(date +%s.%N)
  python launch.py --mode evaluate --workdir "$work" --config.eval.plots=False \
    --config.eval.fit_days="$d" >>"$runs/log.txt" 2>&1
  printf '%s\t%.1f\n' "$d" "$(echo "$(date +%s.%N) - $start" | bc)" >>"$runs/seconds.tsv"
  cp "$(ls -t "$work"/eval-*.json | head -1)" "$runs/eval-$d.json"
done
