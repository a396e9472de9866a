#!/usr/bin/env bash
# Configures and builds Tandem into build/ (or $TANDEM_BUILD_DIR) with Ninja
# and ccache. Assumes deploy/local/install-deps.sh has run (the Debian
# packages and the virtual environment with PyPI's torch). Extra arguments
# go to `cmake --build` (e.g. --target tandem-local).
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${TANDEM_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
# Paths relative to the checkout, so every clone shares one cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
venv=${TANDEM_VENV:-$PWD/.venv}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANDEM_PYTHON="$venv/bin/python"
cmake --build "$build_dir" -j"$(nproc)" "$@"
