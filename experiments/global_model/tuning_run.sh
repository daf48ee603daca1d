# Sourced by decay_runs.sh, long_val_runs.sh and yardstick_runs.sh: one launch.py run of
# configs/mlp.py on the tuning pairs with calendar splits and saved forecasts, skipped once
# its results.json exists. Needs MIRROR.
#   tuning_run WORKDIR VAL_START TEST_START LAST_MONTH [LAUNCH FLAGS...]
tuning_run() {
  local wd=$1 v0=$2 p0=$3 end=$4
  shift 4
  [ -f "$wd/results.json" ] || python launch.py --config configs/mlp.py --workdir "$wd" \
    --config.data.symbols="('@tuning',)" --config.eval.plots=False \
    --config.data.base_url="$MIRROR" --config.data.split_dates="('$v0','$p0')" \
    --config.data.end="$end" --config.eval.save_forecasts=True "$@" >"$wd.log" 2>&1
}

# The band's run beside a candidate's: one epoch that no improvement can clear, so the kept
# model is the untrained band, refit per series as every model's is.
#   band_run WORKDIR VAL_START TEST_START LAST_MONTH
band_run() {
  tuning_run "$@" --config.train.epochs=1 --config.train.min_delta=1e6
}

# The month after YYYY-MM (heldout.py's exclusive end).
next_month() { python -c "import numpy as np; print(np.datetime64('$1', 'M') + 1)"; }
