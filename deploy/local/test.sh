#!/usr/bin/env bash
# The README's second command: install dependencies, build, and run every
# test (unit, integration with real daemons and a real Prometheus, fuzz
# corpus replay). Exits non-zero if any test fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/install-deps.sh
bash deploy/local/build.sh
build_dir=${TANDEM_BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" "$@"
