#!/usr/bin/env bash
# The README's first command: install dependencies, build, and run the whole
# suite on the embedded default (one coordinator, trainer, verifier and two
# rollout workers as local processes). Ctrl-C stops everything cleanly.
# Extra arguments go to tandem-local (see build/bin/tandem-local --help), e.g.
# `--task tools` for the multi-turn calculator task (docs/environments.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "demo: installing dependencies (Debian packages, then PyPI's torch into .venv)"
bash deploy/local/install-deps.sh
echo "demo: building the five binaries the demo runs (tandem-local and the" \
  "coordinator, trainer, rollout worker and verifier it starts); tests and" \
  "benchmarks are left for deploy/local/test.sh"
bash deploy/local/build.sh --target tandem-local
build_dir=${TANDEM_BUILD_DIR:-build}
echo "demo: starting $build_dir/bin/tandem-local $*"
exec "$build_dir/bin/tandem-local" "$@"
