#!/usr/bin/env bash
# Runs one test binary under valgrind memcheck and fails on any error that
# third_party.supp does not name (an invalid read or write, a use after
# free, uninitialised data reaching a syscall or a branch in our code).
#   run_under_valgrind.sh BINARY [TEST ARGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec valgrind --error-exitcode=99 --leak-check=no --num-callers=40 \
  --suppressions="$here/third_party.supp" "$@"
