#!/usr/bin/env bash
# Issue #42's table on the confirmation pairs' test split, seeds 0-2: the global model
# trained on the tuning pairs only, scored zero-shot on the confirmation pairs
# (train.epochs=0 from it) and fine-tuned on their train split; the default trained on
# every pair's train split; and the LightGBM anchor on every pair. One run per line, each
# resumed if its workdir exists; then confirm.py prints the rows.
#   MIRROR=/path/to/mirror experiments/global_model/confirm_runs.sh [runs/confirm]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-runs/confirm}
run() { python launch.py --config configs/mlp.py --config.data.base_url="$MIRROR" --config.eval.plots=False "$@" >>"$runs/log.txt" 2>&1; }
mkdir -p "$runs"
for seed in 0 1 2; do
  run --workdir "$runs/tuning-$seed" --config.seed=$seed "--config.data.symbols=('@tuning',)"
  run --workdir "$runs/zero-shot-$seed" --config.seed=$seed "--config.data.symbols=('@confirmation',)" \
    --config.train.init_from="$runs/tuning-$seed" --config.train.epochs=0
  run --workdir "$runs/fine-tuned-$seed" --config.seed=$seed "--config.data.symbols=('@confirmation',)" \
    --config.train.init_from="$runs/tuning-$seed"
  run --workdir "$runs/global-$seed" --config.seed=$seed
done
[ -f "$runs/mirror.npz" ] || python experiments/global_model/frame.py --pairs mirror --base-url "$MIRROR" --out "$runs/mirror.npz"
[ -f "$runs/anchor.json" ] || python experiments/global_model/anchor.py "$runs/mirror.npz" --report-test \
  --score confirmation --rows 200000 --trees 300 | tail -1 >"$runs/anchor.json"
dirs() { echo "$runs/$1-0,$runs/$1-1,$runs/$1-2"; }
python experiments/global_model/confirm.py --row "global (every pair)=$(dirs global)" \
  --row "zero-shot (tuning pairs only)=$(dirs zero-shot)" --row "fine-tuned=$(dirs fine-tuned)" \
  --anchor "$runs/anchor.json"
