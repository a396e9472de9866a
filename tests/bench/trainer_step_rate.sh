#!/usr/bin/env bash
# The trainer's step rate in the demo, two builds side by side: each side's
# own tandem-local (with its own daemons, --bin-dir) runs the demo from the
# cached warm start for DURATION seconds with the trainer's held-out
# evaluation off (TANDEM_EVAL_EVERY_VERSIONS=0, as in the race against TRL,
# docs/peer-trl.md), alternating OLD, NEW, OLD, NEW, ... ROUNDS times.
# Prints per run the policy versions made (= optimizer steps), the median
# and mean seconds of the trainer's steps (GrpoTrainer::Step, from its log)
# and the load average before and after; then the totals, the ratio NEW /
# OLD of the versions made and OLD / NEW of the runs' median step seconds.
#
#   bash tests/bench/trainer_step_rate.sh OLD_BIN_DIR NEW_BIN_DIR [ROUNDS] [DURATION]
#
# Both bin dirs need tandem-local and the four daemons. The warm start is
# the launcher's cache (~/.cache/tandem/warm-start/arith3-add); run the demo
# once to make it. Extra environment (e.g. TANDEM_DATASET_SEED) reaches
# both sides alike.
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} duration=${4:-60}
for dir in "$old" "$new"; do
  for bin in tandem-local tandem-trainer tandem-coordinator tandem-rollout \
    tandem-verifier; do
    if [[ ! -x "$dir/$bin" ]]; then
      echo "$dir/$bin: missing (each side needs tandem-local and the four daemons)" >&2
      exit 2
    fi
  done
done
out=$(mktemp -d /tmp/tandem-step-rate-XXXXXX)
declare -A total=([OLD]=0 [NEW]=0) medians=([OLD]="" [NEW]="")
printf '%-4s %-5s %9s %14s %12s  %-16s %-16s\n' side round versions \
  "step s median" "step s mean" "load before" "load after"
for round in $(seq 1 "$rounds"); do
  for side in OLD NEW; do
    bin=$old
    [[ $side == NEW ]] && bin=$new
    run="$out/$side-$round"
    before=$(cut -d' ' -f1-3 /proc/loadavg)
    TANDEM_EVAL_EVERY_VERSIONS=0 "$bin/tandem-local" --bin-dir "$bin" \
      --run-dir "$run" --duration "$duration" >"$run.out" 2>&1 || {
      echo "$side round $round failed; see $run.out" >&2
      exit 1
    }
    after=$(cut -d' ' -f1-3 /proc/loadavg)
    versions=$(sed -n 's/^ *policy versions *\([0-9]*\),.*/\1/p' "$run.out")
    # The trainer logs "version N: ..., 0.05s" per optimizer step.
    read -r median mean < <(
      grep -h -o 'version [0-9]*: batch .*, [0-9.]*s$' "$run"/logs/trainer*.log 2>/dev/null |
        sed 's/.*, \([0-9.]*\)s$/\1/' | sort -g |
        awk '{ v[NR] = $1; s += $1 }
             END { if (NR == 0) { print "- -"; exit }
                   printf "%.4f %.4f\n", v[int((NR + 1) / 2)], s / NR }')
    total[$side]=$((total[$side] + versions))
    medians[$side]+=" $median"
    printf '%-4s %-5s %9s %14s %12s  %-16s %-16s\n' "$side" "$round" \
      "$versions" "$median" "$mean" "$before" "$after"
  done
done
awk -v o="${total[OLD]}" -v n="${total[NEW]}" -v r="$rounds" -v d="$duration" \
  -v om="${medians[OLD]}" -v nm="${medians[NEW]}" '
  function mean(list,   a, k, s) { k = split(list, a, " "); s = 0
    for (i = 1; i <= k; ++i) s += a[i]; return k > 0 ? s / k : 0 }
  BEGIN { printf "versions in %d x %d s: OLD %d, NEW %d, NEW / OLD %.2f\n",
            r, d, o, n, (o > 0 ? n / o : 0)
          printf "median step seconds (mean of the runs): OLD %.3f, NEW %.3f, OLD / NEW %.2f\n",
            mean(om), mean(nm), (mean(nm) > 0 ? mean(om) / mean(nm) : 0) }'
echo "runs kept in $out"
