#!/usr/bin/env bash
# Measures gpumemd on this machine: builds the daemon and gpumemctl, starts the daemon as its
# own process on the host backend, runs 'gpumemctl loadgen' against it over the Unix socket as
# a separate process, prints the table and writes the JSON report, then stops the daemon.
#
#   ctl/loadgen.sh                                      # every scenario, 5 s each after 2 s warm-up
#   ctl/loadgen.sh --scenarios floor,pairs --seconds 10
#
# Environment: SKIP_BUILD=1 reuses the built jars; DAEMON_JAVA_OPTS / LOADGEN_JAVA_OPTS add JVM
# flags (e.g. -XX:StartFlightRecording=filename=daemon.jfr,settings=profile to profile);
# REPORT (default ctl/target/loadgen-report.json) is where the JSON report goes.
set -euo pipefail
cd "$(dirname "$0")/.."

SOCK=/tmp/lg.sock
SHM=/dev/shm/gpumemd-lg
LOG=${DAEMON_LOG:-/tmp/gpumemd-lg.log}
REPORT=${REPORT:-ctl/target/loadgen-report.json}

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  mvn -B -q -pl server,ctl -am package -DskipTests
fi

# Truncate here, not in the background job's redirection: that one runs asynchronously and the
# wait below could still read a previous run's "ready" line.
: >"$LOG"
# shellcheck disable=SC2086 # the *_JAVA_OPTS are word lists
java ${DAEMON_JAVA_OPTS:-} -jar server/target/gpumemd.jar --backend host --socket "$SOCK" \
  --listen 127.0.0.1:0 --metrics-port 0 --shm-dir "$SHM" --host-device-bytes 2GiB >>"$LOG" 2>&1 &
DAEMON=$!
stop_daemon() {
  kill -TERM "$DAEMON" 2>/dev/null || true
  wait "$DAEMON" 2>/dev/null || true
}
trap stop_daemon EXIT

for _ in $(seq 1 120); do
  grep -q "gpumemd ready" "$LOG" 2>/dev/null && break
  kill -0 "$DAEMON" 2>/dev/null || { echo "gpumemd did not start:" >&2; cat "$LOG" >&2; exit 1; }
  sleep 0.25
done
grep -q "gpumemd ready" "$LOG" || { echo "gpumemd not ready after 30 s:" >&2; cat "$LOG" >&2; exit 1; }

# shellcheck disable=SC2086
java ${LOADGEN_JAVA_OPTS:-} -jar ctl/target/gpumemctl.jar --target "unix://$SOCK" loadgen \
  --json-out "$REPORT" "$@"
echo "JSON report: $REPORT; daemon log: $LOG" >&2
