#!/usr/bin/env bash
# Prepares rootful Podman on a Debian 12 machine to run deploy/compose with
# Debian's docker-compose 1.29, without any container registry (issue 24):
#
#   sudo bash deploy/compose/podman-setup.sh            # configure, base image
#   sudo bash deploy/compose/podman-setup.sh --socket   # ... and start the API
#   export DOCKER_HOST=unix:///run/podman/podman.sock   # then docker-compose
#
# 1. /etc/containers/containers.conf: runtime "runc" (crun fails on hybrid
#    cgroup hosts) and default ulimits this host can grant (nofile at the
#    hard limit `ulimit -Hn`, nproc 32768; Podman's defaults are refused
#    without CAP_SYS_RESOURCE). Written only when missing or different from
#    what this script writes; a file not written by this script is left
#    alone with a warning.
# 2. The base image: `debootstrap --variant=minbase bookworm` from the apt
#    mirror this machine uses (/etc/apt/sources.list*), imported with
#    `podman import` and tagged as what the Dockerfiles start FROM
#    (debian:bookworm-slim, and tandem-base:bookworm). Skipped when
#    debian:bookworm-slim already exists (about a minute otherwise).
# 3. With --socket: Podman's Docker-compatible API on
#    unix:///run/podman/podman.sock (`podman system service --time=0`),
#    started in the background unless it answers already; its pid is
#    written to /run/podman/tandem-service.pid (stop it with
#    `kill $(cat /run/podman/tandem-service.pid)`).
#
# Needs root and the Debian packages podman, runc, debootstrap (installed by
# deploy/local/install-deps.sh). Prints one line per step; exits non-zero
# with the reason when a step fails.
set -euo pipefail

socket=0
for a in "$@"; do
  case "$a" in
    --socket) socket=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "podman-setup: unknown argument '$a'" >&2; exit 2 ;;
  esac
done
if [[ "$(id -u)" -ne 0 ]]; then
  echo "podman-setup: needs root (rootful Podman)" >&2
  exit 1
fi
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || {
    echo "podman-setup: $tool is missing: run deploy/local/install-deps.sh" >&2
    exit 1
  }
done

# 1. containers.conf
conf=/etc/containers/containers.conf
marker="# Written by Tandem's deploy/compose/podman-setup.sh"
hard=$(ulimit -Hn)
want="$marker
[containers]
default_ulimits = [\"nofile=$hard:$hard\", \"nproc=32768:32768\"]

[engine]
runtime = \"runc\""
if [[ -f "$conf" ]] && ! head -1 "$conf" | grep -qF "$marker"; then
  echo "podman-setup: $conf exists and was not written here; left alone" \
    "(it needs runtime = \"runc\" and default_ulimits nofile=$hard:$hard)" >&2
elif [[ "$(cat "$conf" 2>/dev/null)" != "$want" ]]; then
  mkdir -p /etc/containers
  printf '%s\n' "$want" >"$conf"
  echo "podman-setup: wrote $conf (runc, nofile=$hard:$hard, nproc=32768)"
else
  echo "podman-setup: $conf up to date"
fi

# 2. The base image.
base=debian:bookworm-slim
if podman image exists "$base"; then
  echo "podman-setup: base image $base present"
else
  # The first deb.debian.org-style URI of the machine's apt sources (deb822
  # or one-line format); the public mirror when there is none.
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^URIs:/ { print $2 } /^deb / { for (i = 2; i <= NF; i++)
           if ($i ~ /^(http|https|file):/) { print $i; break } }' |
    grep -v -- '-security' | grep '/debian/\?$' | head -1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  root=$(mktemp -d /var/tmp/tandem-debootstrap-XXXXXX)
  trap 'rm -rf "$root"' EXIT
  started=$(date +%s)
  echo "podman-setup: debootstrap --variant=minbase bookworm from $mirror"
  if ! debootstrap --variant=minbase bookworm "$root" "$mirror" \
      >"$root.log" 2>&1; then
    tail -20 "$root.log" >&2
    echo "podman-setup: debootstrap failed (log $root.log)" >&2
    exit 1
  fi
  rm -f "$root.log"
  # The image's apt sources: the same mirror, plus security updates when the
  # machine has them, so RUN apt-get install sees what the host sees.
  {
    echo "deb $mirror bookworm main"
    echo "deb $mirror bookworm-updates main"
  } >"$root/etc/apt/sources.list"
  security=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -v '^[[:space:]]*#' | grep -o 'http[^ ]*debian-security/\?' |
    head -1 || true)
  if [[ -n "$security" ]]; then
    echo "deb $security bookworm-security main" >>"$root/etc/apt/sources.list"
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --quiet \
    --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
  podman tag "$base" tandem-base:bookworm
  echo "podman-setup: imported $base in $(( $(date +%s) - started )) s" \
    "($(podman image inspect --format '{{.Size}}' "$base") bytes)"
fi

# 3. The API socket.
if [[ $socket -eq 1 ]]; then
  sock=/run/podman/podman.sock
  if curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then
    echo "podman-setup: API socket $sock answers"
  else
    mkdir -p /run/podman
    rm -f "$sock"
    setsid podman system service --time=0 "unix://$sock" \
      >/run/podman/tandem-service.log 2>&1 </dev/null &
    echo $! >/run/podman/tandem-service.pid
    for _ in $(seq 1 50); do
      curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1 && break
      sleep 0.2
    done
    if ! curl -sf --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; then
      echo "podman-setup: API socket $sock did not answer" \
        "(log /run/podman/tandem-service.log)" >&2
      exit 1
    fi
    echo "podman-setup: API socket $sock started" \
      "(pid $(cat /run/podman/tandem-service.pid))"
  fi
fi
