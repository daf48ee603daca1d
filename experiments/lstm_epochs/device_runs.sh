#!/usr/bin/env bash
# The LSTM default's epoch cap and patience on the 32 tuning series of its list (16
# tuning pairs x 15m, 1h), on a lent GPU: one run at cap CAP with patience CAP (nothing
# stops before the cap), its metrics.jsonl read by stopping.py for every shorter
# patience. Run it with CAP=200, then in a second call with CAP=50 (another cap is
# another run: it sets the warmup and the cosine decay). Prepare .gpu/ first
# (benchmarks/device_setup.sh), then:
#   run(command="OUT=$OUT bash experiments/lstm_epochs/device_runs.sh 200", carry=[".gpu"],
#       timeout_s=590)
# usage: bash experiments/lstm_epochs/device_runs.sh [CAP, default 200]
# env: PLATFORM (default gpu; cpu checks the script on any machine), SYMBOLS (in place of
# the tuning pairs, for that check), EXTRA (more launch.py flags, split at spaces, no
# quoting), OUT (default experiments/lstm_epochs/records).
set -euo pipefail
cap=${1:-200}
out=${OUT:-experiments/lstm_epochs/records}
mkdir -p "$out"
source benchmarks/device_setup.sh
# The default list's pairs that are tuning pairs (cpbjax/data/pairs.py); the other four
# (XRP, SOL, DOGE, ARB) are confirmation pairs, never chosen on.
tuning="('BTCUSDT','ETHUSDT','BNBUSDT','LTCUSDT','ADAUSDT','AVAXUSDT','LINKUSDT','UNIUSDT',"
tuning+="'ATOMUSDT','NEARUSDT','DYDXUSDT','OPUSDT','PEPEUSDT','INJUSDT','SHIBUSDT','LUNAUSDT')"
start=$(date +%s)
timeout 560 python3 launch.py --config configs/lstm.py --workdir "$S/run" \
  --config.data.base_url="$MIRROR" --config.data.symbols="${SYMBOLS:-$tuning}" \
  --config.train.epochs="$cap" --config.train.patience="$cap" \
  --config.platform="${PLATFORM:-gpu}" --config.eval.plots=False ${EXTRA:-} \
  >"$out/lstm-cap$cap.log" 2>&1 || echo "launch.py ended with $? (see lstm-cap$cap.log)"
echo "run: $(($(date +%s) - start)) s"
cp "$S/run/metrics.jsonl" "$out/metrics-cap$cap-$(date -u +%Y%m%d).jsonl"
cp "$S/run/timings.json" "$out/timings-cap$cap.json" 2>/dev/null || true
python3 experiments/lstm_epochs/stopping.py "$S/run/metrics.jsonl" \
  --patience "$cap" --epochs "$cap" | tee "$out/stopping-cap$cap.md"
