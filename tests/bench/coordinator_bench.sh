#!/usr/bin/env bash
# Control-plane capacity: starts a coordinator (journal off, dispatch
# throttle opened so the bench measures the RPC path, not the staleness
# bound) and runs coordinator_bench against it as a separate process.
#   tests/bench/coordinator_bench.sh [BUILD_DIR] [bench flags...]
# With JOURNAL=1 the coordinator keeps its journal (in a temporary
# directory), so every publish of `--trainer 1` syncs it; SYNC_DELAY_MS=N
# makes each of those syncs N ms slower (a slow disk; the journal's test
# seam). COORDINATOR=PATH runs another coordinator binary (an older build,
# for a before/after comparison).
set -euo pipefail
build=${1:-build}; shift || true
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
journal=()
if [ "${JOURNAL:-0}" = 1 ]; then journal=(--set "journal.dir=$tmp/journal"); fi
TANDEM_TEST_JOURNAL_SYNC_DELAY_MS=${SYNC_DELAY_MS:-0} \
"${COORDINATOR:-$build/bin/tandem-coordinator}" --grpc-address 127.0.0.1:0 \
  --metrics-address "" --ready-file "$tmp/ready.json" \
  --set max_lag=1000 --set training.groups_per_version=100000 \
  --set log.level=warn "${journal[@]}" 2>"$tmp/coordinator.log" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/ready.json" ] && break; sleep 0.1; done
address=$(sed -n 's/.*"grpc_address": "\([^"]*\)".*/\1/p' "$tmp/ready.json")
"$build/bin/coordinator_bench" --coordinator "$address" "$@"
