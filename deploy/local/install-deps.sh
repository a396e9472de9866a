#!/usr/bin/env bash
# Installs every Debian 12 package that Tandem's build, tests and demo need,
# then the project's Python virtual environment (.venv, or $TANDEM_VENV) with
# the pinned packages of deploy/local/requirements.txt: PyPI's torch wheel
# (the LibTorch the build links) and the test references. Run as root on a
# fresh machine. Idempotent: when everything is already present it only
# checks and returns.
set -euo pipefail
cd "$(dirname "$0")/../.."

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  # libraries (LibTorch comes from PyPI's torch wheel, below; its gloo
  # headers do not ship in the wheel, see docs/platform.md)
  libgloo-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc grpc-proto
  libabsl-dev libboost-dev libyaml-cpp-dev prometheus-cpp-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libpcre2-dev libutf8proc-dev
  # TLS: PEM checks and tandemctl certs init (gRPC links it too)
  libssl-dev
  # tests: unit framework, independent gRPC client, real Prometheus server
  catch2 python3 python3-venv python3-grpcio prometheus
  # an independent AES-GCM/HKDF to open the sealed raw stream
  # (tests/integration/test_data_plane_auth.py)
  python3-cryptography
  # memory errors of the trainer's shutdown (tests/valgrind)
  valgrind
  # the chaos soak's network faults (tests/integration/test_chaos.py --net)
  iproute2 nftables
  # deployment checks: compose file validation (kubectl is preinstalled)
  docker-compose python3-yaml
  # the compose stack in real containers (tests/deploy/test_compose_stack.py,
  # deploy/compose/podman-setup.sh): rootful Podman with runc, service-name
  # DNS on its CNI networks (dnsname), the debootstrap base image, curl for
  # the Docker API socket
  podman runc golang-github-containernetworking-plugin-dnsname debootstrap curl
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
elif [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run this script as root" >&2
  exit 1
else
  echo "install-deps: installing ${#missing[@]} packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${PACKAGES[@]}"
fi

# The virtual environment, remade only when requirements.txt changed.
venv=${TANDEM_VENV:-$PWD/.venv}
requirements=deploy/local/requirements.txt
stamp="$venv/.tandem-requirements"
# nvcc from the wheels links with -L<toolkit>/lib64, and CMake's FindCUDA
# looks for an unversioned libcudart.so: the wheels ship lib/ and
# libcudart.so.13 only (cmake/TandemPython.cmake).
link_wheel_toolkit() {
  local toolkit
  toolkit=$("$venv/bin/python" -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null) \
    || return 0
  [ -d "$toolkit/lib" ] || return 0
  [ -e "$toolkit/lib64" ] || ln -s lib "$toolkit/lib64"
  [ -e "$toolkit/lib/libcudart.so" ] || ln -s libcudart.so.13 "$toolkit/lib/libcudart.so"
}
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$requirements" "$stamp"; then
  link_wheel_toolkit
  echo "install-deps: Python environment $venv up to date"
  exit 0
fi
echo "install-deps: installing $requirements into $venv" \
  "(torch with its CUDA libraries: about 5 GB, a few minutes)"
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --progress-bar off -r "$requirements"
link_wheel_toolkit
cp "$requirements" "$stamp"
echo "install-deps: Python environment $venv ready"
