#!/usr/bin/env bash
# Control-plane capacity: starts a coordinator (journal off, dispatch
# throttle opened so the bench measures the RPC path, not the staleness
# bound) and runs coordinator_bench against it as a separate process.
#   tests/bench/coordinator_bench.sh [BUILD_DIR] [bench flags...]
set -euo pipefail
build=${1:-build}; shift || true
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
"$build/bin/tandem-coordinator" --grpc-address 127.0.0.1:0 \
  --metrics-address "" --ready-file "$tmp/ready.json" \
  --set max_lag=1000 --set training.groups_per_version=100000 \
  --set log.level=warn 2>"$tmp/coordinator.log" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/ready.json" ] && break; sleep 0.1; done
address=$(sed -n 's/.*"grpc_address": "\([^"]*\)".*/\1/p' "$tmp/ready.json")
"$build/bin/coordinator_bench" --coordinator "$address" "$@"
