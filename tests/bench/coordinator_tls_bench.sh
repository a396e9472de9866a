#!/usr/bin/env bash
# Control plane with mutual TLS vs plaintext, side by side: issues
# development certificates (tandemctl certs init), then alternates
# coordinator_bench runs against a plaintext coordinator and one with
# tls.mode mtls (the simulated workers present the rollout certificate and
# the simulated trainer the trainer's, as the coordinator's per-role
# authorization requires), ROUNDS times each, so both see the same background load.
# Prints every run's accepted samples/s and the ratio of the medians
# (TLS / plaintext). The issue's target is >= 0.9. Each run's line also
# gives the CPU time (user + system) the coordinator and the bench process
# spent per accepted sample, so the server's cost of TLS shows apart from
# the client's even when the two share the cores.
#   tests/bench/coordinator_tls_bench.sh [BUILD_DIR] [ROUNDS] [--pin] [bench flags...]
# e.g. tests/bench/coordinator_tls_bench.sh build 3 --workers 8 --seconds 10
# --pin runs the coordinator on CPU 0 and the bench on CPU 1 (taskset), so
# neither end's TLS is paid from the other's core.
set -euo pipefail
build=${1:-build}; shift || true
rounds=${1:-3}; shift || true
pin=0
args=()
for a in "$@"; do
  if [ "$a" = --pin ]; then pin=1; else args+=("$a"); fi
done
set -- "${args[@]}"
[ $# -gt 0 ] || set -- --workers 8 --seconds 10
coordinator_cpu=(); bench_cpu=()
if [ "$pin" = 1 ]; then
  coordinator_cpu=(taskset -c 0); bench_cpu=(taskset -c 1)
fi
ticks=$(getconf CLK_TCK)
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
  "${coordinator_cpu[@]}" "$build/bin/tandem-coordinator" --grpc-address 127.0.0.1:0 \
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
  local before
  before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  "${bench_cpu[@]}" "$build/bin/coordinator_bench" --coordinator "$address" \
    "$@" "${tls_flags[@]}" >"$tmp/bench.out" 2>"$tmp/bench.err" || true
  # The coordinator's CPU time during the bench (utime + stime, in ticks).
  local used
  used=$(awk -v b="$before" '{print $14 + $15 - b}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  local rate
  rate=$(sed -n 's/.*(\([0-9]*\) samples\/s).*/\1/p' "$tmp/bench.out")
  if [ -z "$rate" ]; then
    echo "coordinator_tls_bench: the $mode run gave no samples/s; bench" \
         "output, bench errors, coordinator log:" >&2
    cat "$tmp/bench.out" "$tmp/bench.err" "$tmp/coordinator-$mode.log" >&2
    exit 1
  fi
  local accepted bench_s cpu
  accepted=$(sed -n 's/^accepted samples: \([0-9]*\).*/\1/p' "$tmp/bench.out")
  bench_s=$(sed -n 's/^bench cpu: \([0-9.]*\) s user, \([0-9.]*\) s system/\1 \2/p' \
              "$tmp/bench.out" | awk '{print $1 + $2}')
  # CPU microseconds per accepted sample, coordinator and bench; kept per
  # mode for the medians below.
  awk -v c="$used" -v t="$ticks" -v b="${bench_s:-0}" -v n="$accepted" \
    'BEGIN {printf "%.2f %.2f\n", c / t / n * 1e6, b / n * 1e6}' \
    >>"$tmp/cpu-$mode"
  cpu=$(tail -1 "$tmp/cpu-$mode" |
        awk '{printf "cpu/sample coordinator %s us, bench %s us", $1, $2}')
  echo "$(date -u +%H:%M:%S) $mode $rate samples/s, load $(cut -d' ' -f1-3 /proc/loadavg) | $(grep -h 'p50' "$tmp/bench.out" | tr '\n' ' ')| $cpu" >&2
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
for mode in off mtls; do
  echo "$mode: median CPU per sample, coordinator" \
       "$(median $(awk '{print $1}' "$tmp/cpu-$mode")) us, bench" \
       "$(median $(awk '{print $2}' "$tmp/cpu-$mode")) us"
done
