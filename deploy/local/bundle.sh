#!/usr/bin/env bash
# Packs what a GPU acceptance run needs into one tarball (issue 22 item 6;
# docs/gpu.md), so a machine with an NVIDIA GPU and a matching PyTorch
# (torch 2.11.0+cu130, the release this build links) runs it without
# building or downloading anything:
#
#   bash deploy/local/bundle.sh [--build DIR] [--output FILE]
#   # on the GPU machine:
#   tar xf tandem-gpu-bundle.tar.xz && tandem-gpu-bundle/tests/gpu/run.sh
#
# Contents: bin/ (the daemons, tandemctl, tandem-local, tandem-model, the
# benchmarks and GPU tests, stripped), lib/ (every shared library they load
# except LibTorch, CUDA, NCCL and the C/C++ runtime, which come from the GPU
# machine's PyTorch and system), tests/gpu/run.sh and a MANIFEST. The
# tarball must stay under 60 MiB; the script fails otherwise.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build"
output="$root/dist/tandem-gpu-bundle.tar.xz"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
limit_mib=60

programs=(tandem-coordinator tandem-trainer tandem-rollout tandem-verifier
  tandem-local tandemctl tandem-model generate_bench engine_bench
  gpu_device_test gpu_cuda_ipc_test cuda_ipc_bench tree_digest_bench
  kernels_logprobs_cuda_test kernels_cuda_test
  weights_nccl_test weights_device_sync_test trainer_publish_test
  nccl_broadcast_bench)
stage="$(mktemp -d /tmp/tandem-bundle-XXXXXX)"
trap 'rm -rf "$stage"' EXIT
top="$stage/tandem-gpu-bundle"
mkdir -p "$top/bin" "$top/lib" "$top/tests/gpu"

missing=()
for p in "${programs[@]}"; do
  if [[ -x "$build/bin/$p" ]]; then
    strip -o "$top/bin/$p" "$build/bin/$p"
  else
    missing+=("$p")
  fi
done
for p in tandem-coordinator tandem-trainer tandem-rollout tandem-verifier tandem-local; do
  if [[ ! -x "$top/bin/$p" ]]; then
    echo "bundle.sh: $build/bin/$p is missing: build first (bash deploy/local/build.sh)" >&2
    exit 1
  fi
done

# Libraries the GPU machine provides: its PyTorch (LibTorch, c10, Gloo,
# CUDA runtime and libraries, NCCL, its OpenMP), the driver, and the C and
# C++ runtime (glibc, libstdc++, libgcc_s).
provided='^(libtorch|libc10|libcuda|libcudart|libcublas|libcudnn|libcufft|libcurand|libcusolver|libcusparse|libnccl|libnvrtc|libnvJitLink|libnvToolsExt|libcupti|libnvshmem|libcufile|libgomp|libshm|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libutil|ld-linux|libgcc_s|libstdc\+\+|linux-vdso)'
declare -A copied=()
for f in "$top"/bin/*; do
  while read -r name path; do
    [[ "$name" =~ $provided ]] && continue
    [[ -n "${copied[$name]:-}" || ! -f "$path" ]] && continue
    cp -L "$path" "$top/lib/$name"
    strip --strip-unneeded "$top/lib/$name" 2>/dev/null || true
    copied[$name]=1
  done < <(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }')
done

cp "$root/tests/gpu/run.sh" "$top/tests/gpu/run.sh"
# kernels_cuda_test's hashlib reference for the tree digest.
cp "$root/tests/unit/tree_digest_reference.py" "$top/tests/gpu/"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
{
  echo "Tandem GPU bundle, commit $commit, made $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "Needs: an NVIDIA driver and a python3 whose torch is $(
    "${TANDEM_VENV:-$root/.venv}/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null ||
    echo 'the release this build linked')"
  echo "Run: tests/gpu/run.sh [--minutes M]"
  [[ ${#missing[@]} -gt 0 ]] && echo "Not in this build: ${missing[*]}"
  echo "bin:"; (cd "$top/bin" && ls -1)
  echo "lib:"; (cd "$top/lib" && ls -1)
} >"$top/MANIFEST"

mkdir -p "$(dirname "$output")"
tar -C "$stage" -cJf "$output" tandem-gpu-bundle
bytes=$(stat -c %s "$output")
mib=$(awk "BEGIN { printf \"%.1f\", $bytes / 1048576 }")
echo "bundle: $output ($mib MiB, ${#copied[@]} libraries; limit $limit_mib MiB)"
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "bundle: not built here, left out: ${missing[*]}"
fi
if (( bytes > limit_mib * 1048576 )); then
  echo "bundle.sh: $output is $mib MiB, over the $limit_mib MiB limit" >&2
  exit 1
fi
