#!/bin/bash
# The demo (tandem-local, embedded defaults, cached warm start) with two
# builds of the daemons, alternating, ROUNDS times each, DURATION seconds
# of RL per run; prints each run's summary and the load average before it.
# A/B of one daemon: point B at a folder of symlinks to build/bin with that
# one binary replaced by the other build's.
#
#   bash tests/bench/demo_ab.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [DURATION]
set -euo pipefail
a=$1 b=$2 rounds=${3:-2} duration=${4:-120}
launcher=$(dirname "$0")/../../build/bin/tandem-local
out=$(mktemp -d /tmp/tandem-demo-ab-XXXXXX)
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    bin=$a; [ "$side" = B ] && bin=$b
    echo "== $side ($bin) round $round, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    "$launcher" --bin-dir "$bin" --run-dir "$out/$side-$round" \
      --duration "$duration" > "$out/$side-$round.out" 2>&1
    sed -n '/Run summary/,$p' "$out/$side-$round.out"
  done
done
echo "runs kept in $out"
