#!/usr/bin/env bash
# Trains and evaluates all three models in both decoding modes on one data source, then
# prints the comparison of experiments/decoding_modes/README.md (experiments/decoding_modes/compare_runs.py).
#
#   bash experiments/decoding_modes/decoding_table.sh BASE_URL RUNS_DIR [launch.py flags ...]
#
# e.g. bash experiments/decoding_modes/decoding_table.sh "$MIRROR" runs/decoding \
#          --config.platform=gpu --config.eval.plots=False
# MODELS="gru lstm" or DECODINGS=direct run a subset. Each run is a normal workdir,
# RUNS_DIR/<model>-<decoding>, that launch.py resumes if the table is re-run after a kill.
set -euo pipefail
base_url=$1
runs=$2
shift 2
python=${PYTHON:-python}
mkdir -p "$runs"
for model in ${MODELS:-gru transformer lstm}; do
  for decoding in ${DECODINGS:-direct autoregressive}; do
    echo "=== $model $decoding $(date -u '+%F %T UTC')"
    # The replaced system's model and objective (one model per series, no baseline, no
    # window scale, MSE), which autoregressive decoding needs: the table compares the
    # decoding alone.
    "$python" launch.py --config "configs/$model.py:replaced" --config.data.base_url="$base_url" \
      --config.model.decoding="$decoding" --workdir "$runs/$model-$decoding" "$@"
  done
done
"$python" experiments/decoding_modes/compare_runs.py "$runs"/*-*
