#!/usr/bin/env bash
# The README's first command: install dependencies, build, and run the whole
# suite on the embedded default (one coordinator, trainer, verifier and two
# rollout workers as local processes). Ctrl-C stops everything cleanly.
# Extra arguments go to tandem-local (see build/bin/tandem-local --help).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/install-deps.sh
bash deploy/local/build.sh
exec build/bin/tandem-local "$@"
