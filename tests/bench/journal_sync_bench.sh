#!/usr/bin/env bash
# Do leases and submits wait for the coordinator's disk? Runs
# coordinator_bench (16 simulated workers leasing and submitting, one
# simulated trainer publishing back to back) against two coordinator
# binaries in turn, each with its journal on and every fdatasync slowed by
# SYNC_DELAY_MS (default 50; the journal's test seam), ROUNDS times
# alternating, and prints each run's LeasePrompts / SubmitSamples p99.
#   tests/bench/journal_sync_bench.sh BUILD_DIR BASELINE_COORDINATOR [ROUNDS]
# BASELINE_COORDINATOR: e.g. a build of an older commit (with the same
# TANDEM_TEST_JOURNAL_SYNC_DELAY_MS seam) to compare against.
set -euo pipefail
build=$1
baseline=$2
rounds=${3:-3}
here=$(dirname "$0")
for _ in $(seq "$rounds"); do
  for which in baseline this; do
    bin=$build/bin/tandem-coordinator
    [ "$which" = baseline ] && bin=$baseline
    out=$(JOURNAL=1 SYNC_DELAY_MS=${SYNC_DELAY_MS:-50} COORDINATOR=$bin \
      "$here/coordinator_bench.sh" "$build" --workers 16 --seconds 10 \
      --trainer 1)
    lease=$(sed -n 's/^LeasePrompts: .* p99 \([0-9.]*\) ms/\1/p' <<<"$out")
    submit=$(sed -n 's/^SubmitSamples: .* p99 \([0-9.]*\) ms/\1/p' <<<"$out")
    rate=$(sed -n 's/^accepted samples: [0-9]* (\([0-9]*\) samples\/s.*/\1/p' <<<"$out")
    versions=$(sed -n 's/^versions published meanwhile: //p' <<<"$out")
    echo "$which: LeasePrompts p99 $lease ms, SubmitSamples p99 $submit ms," \
      "$rate samples/s, $versions versions"
  done
done
