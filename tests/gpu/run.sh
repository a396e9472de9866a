#!/usr/bin/env bash
# GPU acceptance in one command (issue 22 item 6; docs/gpu.md).
#
#   tests/gpu/run.sh [--build DIR] [--minutes M] [--report FILE]
#
# On a Linux machine with an NVIDIA GPU, its driver and a python3 whose
# torch is the release this build linked (2.11.0+cu130), runs in order and
# writes one Markdown report (default DIR/gpu-report.md):
#   1. the GPU tests (device forward = CPU forward, GRPO step on the GPU =
#      on the CPU, mixed precision, placement, the CUDA kernels, CUDA IPC
#      weight sync between two processes; NCCL broadcast with two or more
#      GPUs), each PASS / FAIL / SKIPPED; CUDA IPC publish-to-live of
#      1 GiB as the worker goes live on the device, stage by stage,
#      against a device-to-device copy (cuda_ipc_bench); with two or
#      more GPUs, NCCL broadcast of device memory bit-exact and its GB/s
#      against a GPU-to-GPU copy (1b);
#   2. decode tokens/s of a random model shaped like Qwen2.5-0.5B in
#      bfloat16 at batch 1/8/64/256 with the engine's defaults (paged KV
#      cache, engine.paged_attention's default), and at batch 64/256 with
#      the paged decode kernel, next to the GPU's memory-bandwidth bound
#      for the same work (weights + the KV rows the kernel reads in place,
#      per step / measured device-to-device copy bandwidth);
#   3. the engine's Olmo 3 table (static + drain, continuous + drain,
#      continuous + inflight, no updates) on the same model, batch 64,
#      long-tailed lengths (mean/max 0.44); and what is not built yet;
#   4. an end-to-end run (coordinator, verifier, trainer and two rollout
#      workers on GPU 0, workers pulling every version, by CUDA IPC) for M
#      minutes (default 5) with its held-out curve.
# DIR is a build directory (default: build/ next to this script's
# checkout) or an unpacked deploy/local/bundle.sh tarball; it need not have
# been built on this machine, and nothing is downloaded. Without a GPU it
# prints why it skipped and exits 0. Exit status: 0 when every section that
# ran passed, 1 otherwise.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build=""
minutes=5
report=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --report) report="$2"; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$build" ]]; then
  if [[ -x "$here/../../bin/tandem-trainer" ]]; then
    build="$(cd "$here/../.." && pwd)"       # inside an unpacked bundle
  else
    build="$(cd "$here/../.." && pwd)/build"  # a checkout's build/
  fi
fi
bin="$build/bin"
if [[ ! -x "$bin/tandem-trainer" ]]; then
  echo "run.sh: no tandem-trainer under $bin (--build DIR: a build directory or an unpacked bundle)" >&2
  exit 2
fi
if ! [[ "$minutes" =~ ^[0-9]+$ ]]; then
  echo "run.sh: --minutes must be a whole number, got '$minutes'" >&2
  exit 2
fi
report="${report:-$build/gpu-report.md}"

# ---- Is there a GPU? ----
why=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  why="nvidia-smi not found (no NVIDIA driver)"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  why="nvidia-smi lists no GPU"
fi
python="${TANDEM_GPU_PYTHON:-python3}"
if [[ -z "$why" ]] && ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  why="$python has no torch that sees a CUDA device"
fi
if [[ -n "$why" ]]; then
  echo "GPU acceptance skipped: $why."
  exit 0
fi

# ---- The libraries: the bundle's own, then this python's LibTorch, CUDA and NCCL ----
torch_libs="$("$python" - <<'EOF'
import glob, os, torch
base = os.path.dirname(torch.__file__)
dirs = [os.path.join(base, "lib")]
site = os.path.dirname(base)
dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
dirs += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib")))
print(":".join(dict.fromkeys(d for d in dirs if os.path.isdir(d))))
EOF
)"
# Only for our programs (run_bin): python keeps its own libraries.
libpath="$build/lib:$torch_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run_bin() { LD_LIBRARY_PATH="$libpath" "$@"; }
# The tree digest's hashlib reference (kernels_cuda_test): the bundle's
# copy, else the checkout's; run by this python.
for ref in "$here/tree_digest_reference.py" "$here/../unit/tree_digest_reference.py"; do
  if [[ -f "$ref" ]]; then export TANDEM_TREE_DIGEST_REFERENCE="$ref"; break; fi
done
export TANDEM_TEST_PYTHON="$python"
work="$(mktemp -d /tmp/tandem-gpu-XXXXXX)"
trap 'rm -rf "$work"' EXIT
status=0

gpu_names="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/  - /')"
gpu_count="$(nvidia-smi -L | grep -c '^GPU ')"
torch_version="$("$python" -c 'import torch; print(torch.__version__)')"
{
  echo "# Tandem GPU acceptance report"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- host: $(hostname); GPUs ($gpu_count):"
  echo "$gpu_names"
  echo "- python torch: $torch_version; build: $build"
  echo "- command: tests/gpu/run.sh --build $build --minutes $minutes"
  echo
} >"$report"
echo "GPU acceptance on $gpu_count GPU(s); report: $report"

# ---- 1. GPU tests ----
echo "## 1. GPU tests" >>"$report"
echo >>"$report"
echo "| test | result | seconds |" >>"$report"
echo "|---|---|---|" >>"$report"
details="$work/details.md"
: >"$details"
for t in gpu_device_test gpu_cuda_ipc_test kernels_logprobs_cuda_test kernels_cuda_test weights_nccl_test weights_device_sync_test trainer_publish_test; do
  if [[ ! -x "$bin/$t" ]]; then
    echo "| $t | NOT BUILT | |" >>"$report"
    continue
  fi
  start=$(date +%s.%N)
  run_bin timeout 600 "$bin/$t" >"$work/$t.log" 2>&1
  rc=$?
  secs=$(awk "BEGIN { print $(date +%s.%N) - $start }")
  case $rc in
    0) result=PASS ;;
    77) result="SKIPPED: $(grep -m1 SKIPPED "$work/$t.log" | cut -c10-)" ;;
    *) result="FAIL (exit $rc)"; status=1 ;;
  esac
  # A case that cannot run here (e.g. it needs 2 GPUs) prints WARN("...
  # skipping") and passes; the others in the binary still ran, so the line
  # says PASS with how many cases skipped and the first reason.
  if [[ $rc -eq 0 ]] && grep -q "skipping" "$work/$t.log"; then
    skipped=$(grep -c "skipping" "$work/$t.log")
    result="PASS, $skipped case(s) skipped: $(grep -m1 -o '[^:]*skipping.*' "$work/$t.log")"
  fi
  printf '| %s | %s | %.1f |\n' "$t" "$result" "$secs" >>"$report"
  echo "  $t: $result"
  { echo "<details><summary>$t output (tail)</summary>"; echo; echo '```';
    tail -n 40 "$work/$t.log"; echo '```'; echo "</details>"; echo; } >>"$details"
done
echo >>"$report"
# CUDA IPC publish-to-live of 1 GiB (two processes on GPU 0) the way a
# worker goes live on the device (pull receiver handoff, D2D copy,
# GoLiveFromStagedTensor, the engine's swap), stage by stage, against a
# device-to-device copy of the same bytes in the same run; medians of 5
# versions.
if [[ -x "$bin/cuda_ipc_bench" ]]; then
  run_bin timeout 600 "$bin/cuda_ipc_bench" --mib 1024 --versions 6 \
    >"$work/cuda_ipc.jsonl" 2>"$work/cuda_ipc.err"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    status=1
    { echo "CUDA IPC publish-to-live, 1 GiB: FAIL (cuda_ipc_bench exit $rc)"; echo '```';
      tail -n 20 "$work/cuda_ipc.err"; echo '```'; } >>"$report"
  elif ! grep -q '"summary"' "$work/cuda_ipc.jsonl"; then
    echo "CUDA IPC publish-to-live, 1 GiB: $(grep -m1 SKIPPED "$work/cuda_ipc.jsonl" || echo 'no summary line') (cuda_ipc_bench)" >>"$report"
  else
    "$python" - "$work/cuda_ipc.jsonl" >>"$report" <<'EOF'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
tree = s.get("tree_digest_ms_median")
tree = "not built" if tree is None else f"{tree:.2f} ms"
print(f"CUDA IPC publish-to-live, {s['mib']:.0f} MiB (cuda_ipc_bench: the "
      f"worker's device go-live, trainer ring -> pull receiver handoff -> "
      f"GoLiveFromStagedTensor -> engine swap; median of {s['versions']} "
      f"versions): {s['publish_to_live_ms_median']:.1f} ms; device-to-device "
      f"copy of the same bytes: {s['baseline_copy_ms_median']:.2f} ms "
      f"(ratio {s['ratio']:.1f}). Stages: rpc {s['rpc_ms_median']:.1f} ms, "
      f"IPC copy {s['ipc_copy_ms_median']:.2f} ms, go-live "
      f"{s['go_live_ms_median']:.1f} ms (CRC-32C {s['crc_ms_median']:.2f} ms; "
      f"separate passes: finite {s['finite_ms_median']:.2f} ms, SHA-256 "
      f"{s['digest_ms_median']:.1f} ms, tree digest {tree}), swap "
      f"{s['stage_ms_median']:.2f} ms. Target (issue 22): <= 10 ms.")
EOF
  fi
else
  echo "CUDA IPC publish-to-live, 1 GiB: NOT BUILT (cuda_ipc_bench)" >>"$report"
fi
echo >>"$report"
# The tree digest of 1 GiB on the device against a device-to-device copy
# of the same bytes, with the host's plain SHA-256 and tree beside it
# (tree_digest_bench; the device root is checked equal to the host's).
if [[ -x "$bin/tree_digest_bench" ]]; then
  run_bin timeout 600 "$bin/tree_digest_bench" 1024 5 >"$work/tree.txt" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "Tree digest of 1 GiB: FAIL (tree_digest_bench exit $rc)" >>"$report"
  else
    echo "Tree digest of 1 GiB on the device (tree_digest_bench 1024 5, medians; target: well under the 10 ms publish-to-live budget):" >>"$report"
  fi
  { echo '```'; tail -n 12 "$work/tree.txt"; echo '```'; } >>"$report"
  echo "  tree_digest_bench: $(grep -m1 'tree_dev /' "$work/tree.txt" || echo "exit $rc")"
else
  echo "Tree digest of 1 GiB: NOT BUILT (tree_digest_bench)" >>"$report"
fi
echo >>"$report"
cat "$details" >>"$report"

# ---- 1b. NCCL broadcast of device memory against a GPU-to-GPU copy ----
echo "## 1b. NCCL broadcast: device memory, against a GPU 0 -> GPU 1 copy" >>"$report"
echo >>"$report"
if [[ "$gpu_count" -lt 2 ]]; then
  echo "SKIPPED: $gpu_count GPU(s); a 2-rank NCCL group needs 2 (NCCL rejects two ranks on one GPU)." >>"$report"
  echo "  nccl_broadcast_bench: SKIPPED ($gpu_count GPU(s), needs 2)"
elif [[ ! -x "$bin/nccl_broadcast_bench" ]]; then
  echo "NOT BUILT: nccl_broadcast_bench" >>"$report"
else
  run_bin timeout 600 "$bin/nccl_broadcast_bench" --mib 1024 --repeat 5 \
    >"$work/nccl_bench.txt" 2>&1
  rc=$?
  case $rc in
    0) echo "  nccl_broadcast_bench: PASS (bit-exact)" ;;
    77) echo "  nccl_broadcast_bench: SKIPPED" ;;
    *) status=1; echo "FAIL: nccl_broadcast_bench exit $rc" >>"$report"
       echo "  nccl_broadcast_bench: FAIL (exit $rc)" ;;
  esac
  { echo "Command: nccl_broadcast_bench --mib 1024 --repeat 5"; echo;
    tail -n 12 "$work/nccl_bench.txt"; } >>"$report"
fi
echo >>"$report"

# ---- 2. Decode throughput against the memory-bandwidth bound ----
echo "## 2. Decode tokens/s, Qwen2.5-0.5B-shaped random model, bfloat16" >>"$report"
echo >>"$report"
model="$work/qwen05b"
if "$python" - "$model" >"$work/model.log" 2>&1 <<'EOF'
import sys, torch, transformers
# Qwen2.5-0.5B's shape (its config.json), random weights: no download.
config = transformers.Qwen2Config(
    vocab_size=151936, hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, torch_dtype="bfloat16")
torch.manual_seed(0)
model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
EOF
then
  run_bin timeout 900 "$bin/generate_bench" --model "$model" --device cuda \
    --dtype bfloat16 --batch 1,8,64,256 --prompt-tokens 128 \
    --new-tokens 64 --prefill-tokens 512 --repeat 3 --threads 4 \
    >"$work/decode.jsonl" 2>"$work/decode.err"
  rc=$?
  # The paged decode kernel (engine.paged_attention kernel) on the batches
  # of the target, decode only.
  if [[ $rc -eq 0 ]]; then
    run_bin timeout 900 "$bin/generate_bench" --model "$model" --device cuda \
      --dtype bfloat16 --batch 64,256 --prompt-tokens 128 --new-tokens 64 \
      --prefill-tokens 0 --repeat 3 --threads 4 --paged-attention kernel \
      >>"$work/decode.jsonl" 2>>"$work/decode.err"
    rc=$?
  fi
  if [[ $rc -ne 0 ]]; then
    status=1
    { echo "FAIL: generate_bench exit $rc"; echo '```'; tail -n 30 "$work/decode.err"; echo '```'; } >>"$report"
  else
    "$python" - "$model" "$work/decode.jsonl" >>"$report" <<'EOF'
import json, sys, time, torch
model_dir, results = sys.argv[1], sys.argv[2]
config = json.load(open(f"{model_dir}/config.json"))
# Device-to-device copy bandwidth, bytes read + written.
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10):
    b.copy_(a)
torch.cuda.synchronize()
bandwidth = 2 * n * 10 / (time.perf_counter() - t)
h, L = config["hidden_size"], config["num_hidden_layers"]
kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
params = (config["vocab_size"] * h +
          L * (h * h * 2 + 2 * h * kv + 3 * h * config["intermediate_size"]))
weight_bytes = 2 * params
print(f"Device-to-device copy: {bandwidth / 1e9:.0f} GB/s (read + write). "
      f"Weights: {weight_bytes / 1e6:.0f} MB in bf16. Bytes per step = the "
      f"weights once + the KV rows a decode step must read: for each "
      f"sequence, its context tokens x layers x (K and V) x kv_heads x "
      f"head_dim x 2 bytes, read in place from the pool's blocks (what the "
      f"paged decode kernel reads; the gather path also writes and re-reads "
      f"a copy of them, 3x those bytes, which the bound does not count).\n")
print("| batch | KV layout / attention | tokens/s | bytes read per step (weights + KV) | bound tokens/s | share of bound |")
print("|---|---|---|---|---|---|")
for line in open(results):
    r = json.loads(line)
    if r["case"] != "decode":
        continue
    B = r["batch"]
    context = r["prompt_tokens"] + r["new_tokens"] / 2  # mean over decode
    kv_bytes = B * context * L * 2 * kv * 2
    step_bytes = weight_bytes + kv_bytes
    bound = B * bandwidth / step_bytes
    path = f"{r.get('kv_layout', '?')} / {r.get('paged_attention', '?')}"
    print(f"| {B} | {path} | {r['tokens_per_second']:.0f} | {step_bytes / 1e6:.0f} MB "
          f"| {bound:.0f} | {r['tokens_per_second'] / bound:.1%} |")
for line in open(results):
    r = json.loads(line)
    if r["case"] == "prefill":
        print(f"\nPrefill of {r['prompt_tokens']} tokens: "
              f"{r['tokens_per_second']:.0f} tokens/s.")
print("\nTarget (issue 22): decode at batch 64 >= 50% of the bound.")
EOF
  fi
else
  status=1
  { echo "FAIL: could not make the model with transformers"; echo '```'; tail -n 20 "$work/model.log"; echo '```'; } >>"$report"
fi
echo >>"$report"

# ---- 3. The Olmo 3 table on the GPU ----
echo "## 3. The engine's Olmo 3 table on the GPU (same model, bf16)" >>"$report"
echo >>"$report"
if [[ -f "$model/config.json" ]]; then
  run_bin timeout 1200 "$bin/engine_bench" --model "$model" --device cuda \
    --dtype bfloat16 --batch 64 --requests 512 --max-tokens 256 \
    --update-every 8 --repeat 2 --threads 4 >"$work/olmo3.txt" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && { status=1; echo "FAIL: engine_bench exit $rc"; } >>"$report"
  { echo '```'; tail -n 12 "$work/olmo3.txt"; echo '```'; echo;
    echo "Targets (issue 22): (c)/(a) >= 2.0, (c)/(d) >= 0.9, inflight pause p99 <= 1 ms."; } >>"$report"
else
  echo "NOT RUN: no model (section 2 failed)." >>"$report"
fi
echo >>"$report"
cat >>"$report" <<'EOF'
This table runs the engine's defaults (paged KV layout, engine.kv_layout
auto; engine.paged_attention gather; no CUDA graphs: engine_bench
--cuda-graphs 1 measures them). The paged decode kernel
(engine.paged_attention kernel, kernels/cuda/paged_attention_cuda.h) is
built and tested in section 1 (gpu_device_test) but off by default until
it passes there; section 2 measures it.
Built, never run on a GPU before this report (issue 22, docs/gpu.md): the
worker goes live from device memory, a version copied by CUDA IPC
(weight_subscriber_device.cc, gpu_cuda_ipc_test) or received by an NCCL
broadcast (weight_subscriber_broadcast_device.cc; its two-GPU case is the
last of trainer_publish_test, section 1, the GB/s in section 1b), checked
there by device_go_live.h (CRC-32C and the tree digest on the device).

EOF

# ---- 4. End to end ----
echo "## 4. End to end on GPU 0: ${minutes} min" >>"$report"
echo >>"$report"
if [[ "$minutes" -gt 0 ]]; then
  run_dir="$work/e2e"
  # Workers pull every version, so each comes by CUDA IPC from the
  # trainer's device copy (weight_sync.cuda_ipc_versions, on by default).
  TANDEM_MODEL_DEVICE=cuda:0 TANDEM_WEIGHT_SYNC_MODE=pull \
    run_bin timeout $((minutes * 60 + 600)) \
    "$bin/tandem-local" --run-dir "$run_dir" --bin-dir "$bin" \
    --rollout-workers 2 --duration $((minutes * 60)) \
    --cache-dir "$work/cache" >"$work/e2e.out" 2>&1
  rc=$?
  trainer_log="$run_dir/logs/trainer.log"
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "FAIL: tandem-local exit $rc" >>"$report"
  fi
  { echo "Placement from the logs:"; echo '```';
    grep -h -m1 -E "policy: |model: " "$run_dir"/logs/trainer.log "$run_dir"/logs/rollout-0.log 2>/dev/null;
    echo '```'; echo; echo "CUDA IPC (rollout logs; a warning means a fallback):"; echo '```';
    grep -h -E "CUDA IPC|cuda_ipc" "$run_dir"/logs/rollout-*.log "$trainer_log" 2>/dev/null | head -n 8;
    echo '```'; echo; echo "Held-out accuracy (trainer log):"; echo '```';
    grep -h "held-out accuracy at version" "$trainer_log" 2>/dev/null | sed 's/.*held-out/held-out/' | tail -n 40;
    echo '```'; echo; echo "Launcher output (tail):"; echo '```';
    tail -n 15 "$work/e2e.out"; echo '```'; } >>"$report"
else
  echo "Skipped (--minutes 0)." >>"$report"
fi

echo
echo "Report written to $report (exit $status)."
exit $status
