#!/usr/bin/env bash
# One candidate on the tuning pairs' yardstick of ten figures: high and low − band on the
# three val folds (tune.py: 2025-01..02, 2024-03..04, 2023-03..04) and on two pseudo-tests
# (the S runs of long_val_runs.sh: val the 2 months before P0, scored from P0 to the
# data's end, 2023-03..2024-12 and 2022-03..2023-12; nothing from 2025 is read there).
# FLAGS are one shell word per flag; a tuple's quotes go inside: '--config.x="(1,2)"'.
# Runs the checkout it sits in (a branch: its worktree), FLAGS are launch.py flags; the
# pseudo-tests' band runs are made once in RUNS/band<P0>. One JSON line per figure set.
#   MIRROR=/path/to/mirror experiments/global_model/yardstick_runs.sh RUNS NAME [FLAGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
. experiments/global_model/tuning_run.sh
runs=$1 name=$2
shift 2
flags="$*"
# FLAGS as tune.py splits a lever's (shlex), so one quoted tuple works in both runs.
words=()
[ -z "$flags" ] || mapfile -t words < <(python -c 'import shlex, sys
print(*shlex.split(sys.argv[1]), sep="\n")' "$flags")
mkdir -p "$runs"
python experiments/global_model/tune.py "$runs" --lever "$name=$flags" \
  --lever "${name}v2024=$flags --config.data.split_dates=\"('2024-03','2024-05')\"" \
  --lever "${name}v2023=$flags --config.data.split_dates=\"('2023-03','2023-05')\"" \
  -- --config.data.base_url="$MIRROR"
for fold in 2023-03:2023-01:2024-12 2022-03:2022-01:2023-12; do
  IFS=: read -r p0 v0 end <<<"$fold"
  band_run "$runs/band$p0" "$v0" "$p0" "$end"
  tuning_run "$runs/${name}S$p0" "$v0" "$p0" "$end" "${words[@]}"
  next=$(next_month "$end")
  python experiments/global_model/heldout.py "$runs/band$p0" "$runs/${name}S$p0" \
    --start "$p0" --end "$next"
done
