#!/usr/bin/env bash
# The generation race (issue 20 item 2) in one command from a fresh
# checkout: builds generate_bench, installs the peers
# (tests/bench/requirements-peer-engines.txt) into the project venv ($TANDEM_VENV
# or .venv) with the project's pins as constraints, then runs
# tests/bench/peer_engines.py with any arguments given, e.g.
#   bash tests/bench/peer_engines.sh                 # full race, writes docs
#   bash tests/bench/peer_engines.sh --layers 2 --batches 1,8 --no-docs
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TANDEM_VENV:-$PWD/.venv}
build=${TANDEM_BUILD_DIR:-build}
TANDEM_VENV=$venv bash deploy/local/build.sh --target generate_bench
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$venv/bin/python" -m pip install -q -r tests/bench/requirements-peer-engines.txt \
  -c deploy/local/requirements.txt
exec "$venv/bin/python" tests/bench/peer_engines.py --build "$build" "$@"
