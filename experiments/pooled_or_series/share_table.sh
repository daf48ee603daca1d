#!/usr/bin/env bash
# Backtests each model per series and pooled over seeds, then chooses between them on the
# earlier folds (experiments/fold_choice.py, one record per model and seed): the table of
# experiments/pooled_or_series/README.md.
#
#   bash experiments/pooled_or_series/share_table.sh BASE_URL RUNS_DIR [launch.py flags ...]
#
# e.g. bash experiments/pooled_or_series/share_table.sh "$MIRROR" runs/share --config.platform=gpu \
#          --config.eval.plots=False --config.logging.progress=plain
# MODELS="gru", SEEDS="0" or FOLDS=2 run less. Each backtest is a normal workdir,
# RUNS_DIR/<model>_<share>_s<seed>, that launch.py resumes if the script is re-run after a
# kill. "series" is the per-series model at the 1e-3 it was tuned at; "pooled" is the
# GRU's and the transformer's default (config.pool_by_default).
set -euo pipefail
base_url=$1
runs=$2
shift 2
python=${PYTHON:-python}
declare -A share_flags=(
  [series]="--config.train.share=series --config.train.learning_rate=1e-3"
  [pooled]="--config.train.share=pooled --config.train.learning_rate=3e-4"
)
mkdir -p "$runs"
for model in ${MODELS:-gru transformer}; do
  for seed in ${SEEDS:-0 1 2}; do
    for share in series pooled; do
      echo "=== $model $share seed $seed $(date -u '+%F %T UTC')"
      # shellcheck disable=SC2086  # the share's flags are words
      "$python" launch.py --config "configs/$model.py" --mode backtest \
        --config.backtest.folds="${FOLDS:-3}" --config.seed="$seed" \
        --config.data.base_url="$base_url" ${share_flags[$share]} \
        --workdir "$runs/${model}_${share}_s$seed" "$@"
    done
    "$python" experiments/fold_choice.py "series=$runs/${model}_series_s$seed" \
      "pooled=$runs/${model}_pooled_s$seed"
  done
done
