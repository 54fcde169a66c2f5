#!/usr/bin/env bash
# Runs the Python client's tests (Maven runs this in the integration-test phase of module
# python/, after the daemon's jar is built). Where the interpreter lacks the packages it skips
# with the reason; GPUMEMD_PYTHON_TESTS=required (set by .ci/run) turns that into a failure.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${GPUMEMD_PYTHON:-/usr/bin/python3}"
missing=()
if ! "$PYTHON" -c 'import sys' 2>/dev/null; then
  missing+=("$PYTHON")
else
  for module in grpc google.protobuf pytest numpy; do
    "$PYTHON" -c "import $module" 2>/dev/null || missing+=("python module $module")
  done
fi
command -v protoc >/dev/null || missing+=(protoc)
command -v grpc_python_plugin >/dev/null || "$PYTHON" -c 'import grpc_tools' 2>/dev/null || missing+=(grpc_python_plugin)
if [ ${#missing[@]} -gt 0 ]; then
  message="Python client tests need: ${missing[*]} (Debian: apt-get install python3-grpcio python3-protobuf python3-pytest python3-numpy protobuf-compiler protobuf-compiler-grpc)"
  if [ "${GPUMEMD_PYTHON_TESTS:-}" = required ]; then
    echo "[python] FAILED: $message" >&2
    exit 1
  fi
  echo "[python] SKIPPED: $message"
  exit 0
fi
"$PYTHON" gen_stubs.py
mkdir -p target
exec "$PYTHON" -m pytest -p no:cacheprovider -q -rs --junitxml=target/pytest-results.xml tests
