#!/usr/bin/env bash
# The stand-in driver's own tests (Maven runs this in the test phase of module cuda-standin/,
# after build.sh): pytest through ctypes against the library just built in $1. Skipped, with
# the reason, where /usr/bin/python3 lacks pytest, unless GPUMEMD_PYTHON_TESTS=required (as
# .ci/run sets).
set -euo pipefail
cd "$(dirname "$0")"
lib="${1:?usage: run_tests.sh LIBDIR}"
if [ "${GPUMEMD_SKIP_TESTS:-false}" = true ]; then
  exit 0
fi
PYTHON="${GPUMEMD_PYTHON:-/usr/bin/python3}"
if ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
  message="the stand-in driver's tests need $PYTHON with pytest (Debian: apt-get install python3-pytest)"
  if [ "${GPUMEMD_PYTHON_TESTS:-}" = required ]; then
    echo "[cuda-standin] FAILED: $message" >&2
    exit 1
  fi
  echo "[cuda-standin] SKIPPED: $message"
  exit 0
fi
mkdir -p target
LD_LIBRARY_PATH="$lib" CUDA_STANDIN_DEVICES=2 exec "$PYTHON" -m pytest -p no:cacheprovider -q -rs \
  --junitxml=target/pytest-results.xml tests
