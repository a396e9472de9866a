#!/usr/bin/env bash
# ctest gpu_bundle: deploy/local/bundle.sh makes a tarball under its size
# limit from this build; unpacked elsewhere, every program in it finds all
# its libraries in the bundle's lib/ plus the torch wheel's (nothing "not
# found"), the GPU test binary runs (exit 0 on a GPU, 77 = skipped without
# one), and the bundled tests/gpu/run.sh finds its binaries and exits 0
# (printing why it skipped where there is no GPU).
#   check_bundle.sh BUILD_DIR PYTHON
set -euo pipefail
build="$1"
python="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d /tmp/tandem-bundle-check-XXXXXX)"
trap 'rm -rf "$work"' EXIT

TANDEM_VENV="$(dirname "$(dirname "$python")")" \
  bash "$root/deploy/local/bundle.sh" --build "$build" --output "$work/b.tar.xz"
tar -C "$work" -xJf "$work/b.tar.xz"
top="$work/tandem-gpu-bundle"
torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
failed=0
for f in "$top"/bin/*; do
  if LD_LIBRARY_PATH="$top/lib:$torch_lib" ldd "$f" | grep -q "not found"; then
    echo "FAIL: $(basename "$f") misses libraries:"
    LD_LIBRARY_PATH="$top/lib:$torch_lib" ldd "$f" | grep "not found"
    failed=1
  fi
done
set +e
LD_LIBRARY_PATH="$top/lib:$torch_lib" "$top/bin/gpu_device_test" >"$work/gpu.log" 2>&1
rc=$?
set -e
cat "$work/gpu.log" | tail -n 3
if [[ $rc -ne 0 && $rc -ne 77 ]]; then
  echo "FAIL: gpu_device_test from the bundle exited $rc"
  failed=1
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
  out="$(TANDEM_GPU_PYTHON="$python" "$top/tests/gpu/run.sh" --minutes 0)"
  echo "$out"
  if ! grep -q "GPU acceptance skipped: nvidia-smi not found" <<<"$out"; then
    echo "FAIL: run.sh in the bundle did not skip for want of a GPU"
    failed=1
  fi
fi
[[ $failed -eq 0 ]] && echo "bundle OK: $(ls "$top/bin" | wc -l) programs, $(ls "$top/lib" | wc -l) libraries"
exit $failed
