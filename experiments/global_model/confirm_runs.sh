#!/usr/bin/env bash
# Issue #42's table on the confirmation pairs' test split, seeds 0-2: the default trained
# on every pair's train split; the global model trained on the tuning pairs only, scored
# zero-shot on the confirmation pairs (train.epochs=0 from it) and fine-tuned on their
# train split; and the LightGBM anchor on every pair. One run per line, skipped once its
# results.json exists (resumed from its checkpoints if it stopped before); then confirm.py
# prints the rows. SEEDS picks the seeds, FLAGS adds launch.py flags (on a GPU:
# FLAGS=--config.platform=gpu), ANCHOR=0 skips the anchor.
#   MIRROR=/path/to/mirror experiments/global_model/confirm_runs.sh [runs/confirm]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-runs/confirm}
seeds=${SEEDS:-0 1 2}
run() {
  [ -f "$2/results.json" ] || python launch.py --config configs/mlp.py --config.data.base_url="$MIRROR" \
    --config.eval.plots=False ${FLAGS:-} "$@" >>"$runs/log.txt" 2>&1
}
mkdir -p "$runs"
for seed in $seeds; do
  run --workdir "$runs/global-$seed" --config.seed="$seed"
  run --workdir "$runs/tuning-$seed" --config.seed="$seed" "--config.data.symbols=('@tuning',)"
  run --workdir "$runs/zero-shot-$seed" --config.seed="$seed" "--config.data.symbols=('@confirmation',)" \
    --config.train.init_from="$runs/tuning-$seed" --config.train.epochs=0
  run --workdir "$runs/fine-tuned-$seed" --config.seed="$seed" "--config.data.symbols=('@confirmation',)" \
    --config.train.init_from="$runs/tuning-$seed"
done
anchor=()
if [ "${ANCHOR:-1}" = 1 ]; then
  [ -f "$runs/mirror.npz" ] || python experiments/global_model/frame.py --pairs mirror --base-url "$MIRROR" --out "$runs/mirror.npz"
  [ -f "$runs/anchor.json" ] || python experiments/global_model/anchor.py "$runs/mirror.npz" --report-test \
    --score confirmation --rows 200000 --trees 300 | tail -1 >"$runs/anchor.json"
  anchor=(--anchor "$runs/anchor.json")
fi
dirs() { local d=(); for seed in $seeds; do d+=("$runs/$1-$seed"); done; (IFS=,; echo "${d[*]}"); }
python experiments/global_model/confirm.py --row "global (every pair)=$(dirs global)" \
  --row "zero-shot (tuning pairs only)=$(dirs zero-shot)" --row "fine-tuned=$(dirs fine-tuned)" "${anchor[@]}"
