#!/usr/bin/env bash
# The LightGBM anchor on the yardstick's two pseudo-tests: the tuning pairs' window table
# split as the S runs of long_val_runs.sh (val the 2 months before P0, test from P0 to the
# data's end, nothing from 2025 read), fitted on train+val, scored on test. One JSON line
# per fold (anchor.py's, with the fold added); the tables are kept in RUNS.
#   MIRROR=/path/to/mirror experiments/global_model/anchor_pseudo_runs.sh RUNS
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=$1
mkdir -p "$runs"
for fold in 2023-03:2023-01:2024-12 2022-03:2022-01:2023-12; do
  IFS=: read -r p0 v0 end <<<"$fold"
  table="$runs/tuning-p$p0.npz"
  [ -f "$table" ] || python experiments/global_model/frame.py --pairs tuning --base-url "$MIRROR" \
    --split-dates "$v0,$p0" --end "$end" --out "$table" >&2
  python experiments/global_model/anchor.py "$table" --report-test --rows 200000 --trees 300 |
    tail -1 | python -c "import json, sys; print(json.dumps({'fold': '$p0', **json.loads(sys.stdin.read())}))"
done
