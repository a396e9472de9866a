#!/usr/bin/env bash
# Installs every Debian 12 package that Tandem's build, tests and demo need.
# Run as root on a fresh machine. Idempotent: when everything is already
# present it only checks and returns.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  # libraries
  libtorch-dev libgloo-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  libabsl-dev libboost-dev libyaml-cpp-dev prometheus-cpp-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libpcre2-dev libutf8proc-dev
  # optimized BLAS for LibTorch's fp32 matmuls (Debian's default is the
  # reference BLAS, ~13x slower on the tiny model). The serial build: the
  # pthread one breaks civetweb's thread creation (the /metrics server) in
  # the same process, and each daemon runs single-threaded math anyway.
  libopenblas0-serial
  # tests: unit framework, independent gRPC client, real Prometheus server
  catch2 python3 python3-grpcio prometheus
  # deployment checks: compose file validation (kubectl is preinstalled)
  docker-compose python3-yaml
)

# The tokenizer reference tests run the npm packages' JavaScript tokenizers.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run this script as root" >&2
  exit 1
fi

echo "install-deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${PACKAGES[@]}"
