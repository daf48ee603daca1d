#!/usr/bin/env bash
# How many windows the fits after training need (eval.fit_windows): the global default
# trained on the tuning pairs only, then scored by --mode evaluate once per setting of
# CAPS (0: every window), the baseline cache off so that every fit is computed. Each
# evaluation's results.json goes to <runs>/eval-<cap>.json and its wall seconds to
# <runs>/seconds.tsv; summary.py prints the tables.
#   MIRROR=/path/to/mirror experiments/fit_windows/runs.sh [runs/fit_windows]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-runs/fit_windows}
caps=${CAPS:-0 50000 20000 10000 5000}
mkdir -p "$runs"
work="$runs/global-tuning"
[ -f "$work/results.json" ] || python launch.py --config configs/mlp.py --workdir "$work" \
  --config.data.base_url="$MIRROR" "--config.data.symbols=('@tuning',)" \
  --config.eval.plots=False ${FLAGS:-} >>"$runs/log.txt" 2>&1
for cap in $caps; do
  [ -f "$runs/eval-$cap.json" ] && continue
  start=$(date +%s.%N)
  python launch.py --mode evaluate --workdir "$work" --config.eval.plots=False \
    --config.eval.baseline_cache=off --config.eval.fit_windows="$cap" >>"$runs/log.txt" 2>&1
  printf '%s\t%.1f\n' "$cap" "$(echo "$(date +%s.%N) - $start" | bc)" >>"$runs/seconds.tsv"
  cp "$(ls -t "$work"/eval-*.json | head -1)" "$runs/eval-$cap.json"
done
