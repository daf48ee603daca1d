#!/usr/bin/env bash
# The GPU table of issue #53 in one call of the `run` device tool: whole runs of the named
# defaults on the shared mirror, cold then warm (benchmarks/whole_run.py), records to $OUT;
# first, whether scoring's kernels pay on the device (benchmarks/device_scoring_probe.py,
# about 20 s; PROBE=0 skips it).
# Prepare .gpu/ first (benchmarks/device_setup.sh says how), then, at most 10 min a call
# (about 2.5 min for mlp, 3.5 for transformer, 2 for gru, 3 for lstm on one H200):
#   run(command="OUT=$OUT bash benchmarks/device_whole_runs.sh mlp,gru", carry=[".gpu"],
#       timeout_s=590), then give_back unless another call follows at once.
#
# usage: bash benchmarks/device_whole_runs.sh [MODELS, default mlp] [REPEATS, default 1]
# env: PLATFORM (default gpu; cpu checks the script on any machine), EXTRA (more launch.py
# flags; whole_run.py splits them as a shell does, so quote tuples twice, e.g. for that
# check EXTRA="--config.data.symbols=\"('BTCUSDT',)\" --config.data.intervals=\"('1h',)\"",
# 46 s on the 2-core CPU), PROBE (0 skips the scoring probe), OUT (the records' folder,
# default benchmarks/records).
set -euo pipefail
models=${1:-mlp}
repeats=${2:-1}
out=${OUT:-benchmarks/records}
mkdir -p "$out"
source benchmarks/device_setup.sh
if [ "${PROBE:-1}" = 1 ]; then
  python3 benchmarks/device_scoring_probe.py --records-dir "$out" || echo "the scoring probe failed"
fi
python3 benchmarks/whole_run.py --models "$models" --repeats "$repeats" \
  --base-url "$MIRROR" --records-dir "$out" \
  --flags="--config.platform=${PLATFORM:-gpu} --config.eval.plots=False ${EXTRA:-}"
