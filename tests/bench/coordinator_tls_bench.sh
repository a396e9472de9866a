#!/usr/bin/env bash
# Control plane with mutual TLS vs plaintext, side by side: issues
# development certificates (tandemctl certs init), then alternates
# coordinator_bench runs against a plaintext coordinator and one with
# tls.mode mtls (the simulated workers present the rollout certificate and
# the simulated trainer the trainer's, as the coordinator's per-role
# authorization requires), ROUNDS times each, so both see the same background load.
# Prints every run's accepted samples/s and the ratio of the medians
# (TLS / plaintext). The issue's target is >= 0.9.
#   tests/bench/coordinator_tls_bench.sh [BUILD_DIR] [ROUNDS] [bench flags...]
# e.g. tests/bench/coordinator_tls_bench.sh build 3 --workers 8 --seconds 10
set -euo pipefail
build=${1:-build}; shift || true
rounds=${1:-3}; shift || true
[ $# -gt 0 ] || set -- --workers 8 --seconds 10
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
"$build/bin/tandemctl" certs init --dir "$tmp/certs" >/dev/null
c=$tmp/certs

run() {  # run MODE: one coordinator, one bench; prints samples/s
  local mode=$1 tls_set=() tls_flags=()
  shift
  if [ "$mode" = mtls ]; then
    tls_set=(--set tls.mode=mtls --set "tls.cert=$c/coordinator.pem"
             --set "tls.key=$c/coordinator.key" --set "tls.ca=$c/ca.pem")
    tls_flags=(--tls-cert "$c/rollout.pem" --tls-key "$c/rollout.key"
               --tls-ca "$c/ca.pem" --tls-trainer-cert "$c/trainer.pem"
               --tls-trainer-key "$c/trainer.key")
  fi
  rm -f "$tmp/ready.json"
  "$build/bin/tandem-coordinator" --grpc-address 127.0.0.1:0 \
    --metrics-address "" --ready-file "$tmp/ready.json" \
    --set max_lag=1000 --set training.groups_per_version=100000 \
    --set log.level=warn "${tls_set[@]}" 2>"$tmp/coordinator-$mode.log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$tmp/ready.json" ] && break; sleep 0.1; done
  if [ ! -s "$tmp/ready.json" ]; then
    echo "coordinator_tls_bench: the $mode coordinator wrote no ready file" \
         "in 10 s; its log:" >&2
    cat "$tmp/coordinator-$mode.log" >&2
    exit 1
  fi
  local address
  address=$(sed -n 's/.*"grpc_address": "\([^"]*\)".*/\1/p' "$tmp/ready.json")
  "$build/bin/coordinator_bench" --coordinator "$address" "$@" \
    "${tls_flags[@]}" >"$tmp/bench.out" 2>"$tmp/bench.err" || true
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  local rate
  rate=$(sed -n 's/.*(\([0-9]*\) samples\/s).*/\1/p' "$tmp/bench.out")
  if [ -z "$rate" ]; then
    echo "coordinator_tls_bench: the $mode run gave no samples/s; bench" \
         "output, bench errors, coordinator log:" >&2
    cat "$tmp/bench.out" "$tmp/bench.err" "$tmp/coordinator-$mode.log" >&2
    exit 1
  fi
  echo "$(date -u +%H:%M:%S) $mode $rate samples/s, load $(cut -d' ' -f1-3 /proc/loadavg) | $(grep -h 'p50' "$tmp/bench.out" | tr '\n' ' ')" >&2
  echo "$rate"
}

off=(); on=()
for _ in $(seq "$rounds"); do
  off+=("$(run off "$@")")
  on+=("$(run mtls "$@")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
m_off=$(median "${off[@]}"); m_on=$(median "${on[@]}")
echo "plaintext: ${off[*]} samples/s (median $m_off)"
echo "mtls:      ${on[*]} samples/s (median $m_on)"
awk -v a="$m_on" -v b="$m_off" 'BEGIN {printf "ratio mtls/plaintext: %.3f\n", a / b}'
