#!/usr/bin/env bash
# Early stopping and the column fallback on 12 months of val instead of 2: does the kept
# model's gain over the band then hold on the months that follow? Tuning pairs only, data
# ending before the protocol's val span (2025-01). Per fold: S (val the 2 months before
# P0), L (val the 12 months before P0) and the band (no epoch may clear the bar; refit
# on the same train+val, which ends at P0 for all three), forecasts saved; then
# heldout.py scores S - band and L - band on the pseudo-test [P0, END). One JSON line each.
#   MIRROR=/path/to/mirror experiments/global_model/long_val_runs.sh runs/longval
set -euo pipefail
cd "$(dirname "$0")/../.."
. experiments/global_model/tuning_run.sh
runs=${1:-runs/longval}
mkdir -p "$runs"
# fold: P0 (pseudo-test start = val end), S's val start, L's val start, END (last month)
folds=${FOLDS:-"2023-03:2023-01:2022-03:2024-12 2022-03:2022-01:2021-03:2023-12"}
for fold in $folds; do
  IFS=: read -r p0 s0 l0 end <<<"$fold"
  band_run "$runs/band$p0" "$s0" "$p0" "$end"
  tuning_run "$runs/S$p0" "$s0" "$p0" "$end"
  tuning_run "$runs/L$p0" "$l0" "$p0" "$end"
  next=$(next_month "$end")
  for kind in S L; do
    python experiments/global_model/heldout.py "$runs/band$p0" "$runs/$kind$p0" \
      --start "$p0" --end "$next"
  done
done
