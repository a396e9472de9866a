#!/usr/bin/env bash
# The learning race against TRL (tests/bench/peer_trl.py) in one command,
# from a built checkout: installs tests/bench/requirements-peer-trl.txt into
# the project venv ($TANDEM_VENV, default .venv) with the project's pins as
# constraints (torch and transformers never change), then runs the race with
# the binaries in $TANDEM_BIN_DIR (default build/bin). Arguments go to the
# script, e.g.:
#   bash tests/bench/peer_trl.sh                # 10 minutes each
#   bash tests/bench/peer_trl.sh --minutes 2 --docs-dir /tmp/peer-docs
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TANDEM_VENV:-$PWD/.venv}
"$venv/bin/python" -m pip install -q -r tests/bench/requirements-peer-trl.txt \
  -c deploy/local/requirements.txt
exec "$venv/bin/python" tests/bench/peer_trl.py \
  --bin-dir "${TANDEM_BIN_DIR:-build/bin}" "$@"
