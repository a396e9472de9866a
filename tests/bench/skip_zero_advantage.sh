#!/usr/bin/env bash
# Trainer time with and without forwarding completions whose advantage is 0
# (GrpoTrainerOptions::skip_zero_advantage), side by side: two
# `tandem-trainer rl-inprocess` runs with the same seed and settings start at
# the same moment on the same machine, one skipping and one forwarding
# every completion, and the script prints each run's train seconds and the
# ratio. The gradients are equal (trainer_grpo_step_test), so the runs
# learn alike; only the time differs.
#
#   tests/bench/skip_zero_advantage.sh [BIN_DIR] [MODEL_DIR] [STEPS]
#
# MODEL_DIR defaults to the demo's cached warm start.
set -euo pipefail
bin_dir=${1:-build/bin}
model=${2:-${TANDEM_CACHE_DIR:-$HOME/.cache/tandem}/warm-start/arith3-add}
steps=${3:-100}
if [[ ! -f "$model/config.json" ]]; then
  echo "no model at $model (run the demo once, or pass MODEL_DIR)" >&2
  exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {
  "$bin_dir/tandem-trainer" rl-inprocess --model "$model" --lr 3e-4 \
    --steps "$steps" --eval-every "$steps" --skip-zero-advantage "$1" \
    >"$out/$1.log" 2>&1
}
run true &
skip_pid=$!
run false &
forward_pid=$!
wait "$skip_pid" "$forward_pid"
train_seconds() { sed -n 's/^generate .*, train \([0-9.]*\)s$/\1/p' "$out/$1.log"; }
skip=$(train_seconds true)
forward=$(train_seconds false)
for mode in true false; do
  echo "skip_zero_advantage=$mode: $(tail -2 "$out/$mode.log" | tr '\n' ' ')"
done
awk -v s="$skip" -v f="$forward" \
  'BEGIN { printf "train seconds: skip %.1f, forward all %.1f, ratio %.2f\n", s, f, s / f }'
