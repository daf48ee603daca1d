#!/usr/bin/env bash
# Every probe.py run behind experiments/global_model/README.md, one JSON line per epoch, in
# records/probe-<UTC time>.jsonl. Needs the tuning pairs' window table:
#   python experiments/global_model/frame.py --pairs tuning --base-url $MIRROR --out runs/gm/tuning.npz
set -euo pipefail
cd "$(dirname "$0")/../.."
table=${1:-runs/gm/tuning.npz}
out=experiments/global_model/records/probe-$(date -u +%Y%m%dT%H%MZ).jsonl
probe() { echo "# $*" >>"$out"; python experiments/global_model/probe.py "$table" "$@" >>"$out"; }
for seed in 0 1; do
  probe --inputs window --seed "$seed"                      # the window alone
  probe --inputs context --seed "$seed"                     # the context alone
done
for seed in 0 1 2 3; do probe --seed "$seed"; done           # both, standardised
for lr in 3e-5 3e-4 1e-3; do probe --lr "$lr"; done
for drop in lr_ ret_ hour_,dow_ seas_ vol_ interval mkt_; do  # one context group left out
  for seed in 0 1; do probe --drop "$drop" --seed "$seed"; done
done
for drop in lr_,mkt_ lr_,mkt_,vol_,ret_; do
  for seed in 0 1 2 3; do probe --drop "$drop" --seed "$seed"; done
done
for seed in 0 1; do                                           # the product's inputs
  probe --drop lr_,mkt_ --pooled-band --raw --seed "$seed"
  probe --drop lr_,mkt_ --pooled-band --raw --candles --seed "$seed"
done
probe --arch gru --hidden 64                                  # a GRU with the context
echo "$out"
