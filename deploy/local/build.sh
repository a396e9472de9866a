#!/usr/bin/env bash
# Configures and builds Tandem into build/ (or $TANDEM_BUILD_DIR) with Ninja
# and ccache. Assumes deploy/local/install-deps.sh has run.
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${TANDEM_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
# Paths relative to the checkout, so every clone shares one cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build_dir" -j"$(nproc)"
