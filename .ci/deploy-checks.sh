#!/usr/bin/env bash
# Checks of the deployment files that need tools beyond Maven, for CI (called from the main CI
# script) and by hand:
#
#   mvn -B package -DskipTests        # or verify: the checks use server/target/gpumemd.jar
#   bash .ci/deploy-checks.sh
#
# 1. docker-compose.yml: `docker-compose config` (Compose itself, Debian's docker-compose 1.29;
#    needs no engine) and dclint (the Compose-spec schema, errors only).
# 2. deploy/Dockerfile: dockerfile-utils lint (the Dockerfile linter of the VS Code Docker
#    extension; hadolint is neither in Debian nor on npm).
# 3. deploy/k8s/*.yaml (.ci/validate-k8s.mjs): validated against the Kubernetes API schemas
#    (kubernetes-models, offline; catches wrong types and missing required fields, not unknown
#    field names); every pod against the Pod Security Standards level its Namespace enforces
#    (.ci/pod-security.mjs: the baseline and restricted rules of the Pod Security Admission
#    controller, each first shown to fire on a pod made to break it), and no stricter level
#    passing; no hostPID or shareProcessNamespace anywhere; httpGet probes on the daemon's
#    metrics port (startup and liveness /healthz, readiness /readyz). Well under a second.
# 4. /metrics of a live daemon (host backend) through `promtool check metrics`, its /healthz and
#    /readyz answering 200, then SIGTERM and exit status 0. Before the scrape, .ci/counter_overflow.py (python3-grpcio) reports
#    client cache counters of 2^63-1 from two sessions (issue 22), so promtool checks the text
#    a hostile tenant leaves behind.
# 5. deploy/grafana/*.json: JSON syntax (python3 -m json.tool, or Node where python3 is missing).
#    GrafanaDashboardTest checks the dashboard's structure and its metrics against a live daemon.
#
# What no check here can do: build the image or start the containers (no container engine in
# CI). The Java tests in it/src/test/java/io/gpumemd/it/deploy/ check what the files say.
#
# Installs what it needs (apt: docker-compose, curl, python3-grpcio, python3-protobuf, protoc and
# grpc_python_plugin for the Python stubs, and promtool unpacked from the prometheus package
# without installing its service; npm: pinned linters in a cache directory). Idempotent:
# a second run installs nothing. Runs as root on CI; elsewhere it uses sudo for apt.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
tools=${GPUMEMD_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumemd-ci}
mkdir -p "$tools"

log() { printf '== %s\n' "$*"; }

# Registries can hiccup; a CI run should not fail on one: three tries, 5 s then 10 s apart.
retry() {
  local attempt=1
  until "$@"; do
    if [ "$attempt" -ge 3 ]; then
      echo "failed 3 times: $*" >&2
      return 1
    fi
    echo "retrying in $((attempt * 5)) s: $*" >&2
    sleep $((attempt * 5))
    attempt=$((attempt + 1))
  done
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=false
apt_install() {
  if ! $apt_updated; then
    retry as_root apt-get update -qq
    apt_updated=true
  fi
  retry as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# --- tools -------------------------------------------------------------------------------

install_tools() {
  local missing=()
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v curl >/dev/null || missing+=(curl)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  "${GPUMEMD_PYTHON:-/usr/bin/python3}" -c 'import grpc, google.protobuf' 2>/dev/null || missing+=(python3-grpcio python3-protobuf)
  command -v protoc >/dev/null || missing+=(protobuf-compiler)
  command -v grpc_python_plugin >/dev/null || missing+=(protobuf-compiler-grpc)
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt: installing ${missing[*]}"
    apt_install "${missing[@]}"
  fi

  # promtool is a static binary inside Debian's prometheus package; unpacking the package
  # instead of installing it avoids its ~100 MB of web assets and its systemd service.
  promtool=$(command -v promtool || true)
  if [ -z "$promtool" ]; then
    promtool="$tools/prometheus/usr/bin/promtool"
    if [ ! -x "$promtool" ]; then
      log "apt: fetching promtool (package prometheus)"
      if ! $apt_updated; then
        retry as_root apt-get update -qq
        apt_updated=true
      fi
      rm -rf "$tools/prometheus" "$tools"/prometheus_*.deb
      (cd "$tools" && retry apt-get download -qq prometheus 2>/dev/null)
      dpkg-deb -x "$tools"/prometheus_*.deb "$tools/prometheus"
      rm -f "$tools"/prometheus_*.deb
    fi
  fi

  # npm packages, pinned; reinstalled only when this list changes
  local manifest='{
  "private": true,
  "description": "tools for gpumemd .ci/deploy-checks.sh",
  "dependencies": {
    "dclint": "3.1.0",
    "dockerfile-utils": "0.16.3",
    "js-yaml": "4.1.0",
    "kubernetes-models": "5.1.0"
  }
}'
  if [ ! -f "$tools/package.json" ] || [ "$(cat "$tools/package.json")" != "$manifest" ] \
      || [ ! -d "$tools/node_modules/kubernetes-models" ]; then
    log "npm: installing dclint, dockerfile-utils, js-yaml, kubernetes-models"
    printf '%s\n' "$manifest" > "$tools/package.json"
    (cd "$tools" && retry npm install --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  cp "$repo/.ci/validate-k8s.mjs" "$repo/.ci/pod-security.mjs" "$tools/"
}

# --- checks ------------------------------------------------------------------------------

check_compose() {
  # (1.29 validates every service whatever the profile: both variants are covered)
  docker-compose -f docker-compose.yml config -q
  echo "docker-compose $(docker-compose version --short): docker-compose.yml is valid"
  # dclint needs Node >= 20.19; on an older Node, docker-compose above is the only validation
  if node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)'; then
    "$tools/node_modules/.bin/dclint" --quiet docker-compose.yml
  else
    echo "dclint not run: needs Node >= 20.19, found $(node --version)"
  fi
}

check_dockerfile() {
  "$tools/node_modules/.bin/dockerfile-utils" lint deploy/Dockerfile
}

check_manifests() {
  node "$tools/validate-k8s.mjs" deploy/k8s/*.yaml
}

check_metrics() {
  local jar=server/target/gpumemd.jar
  if [ ! -f "$jar" ]; then
    echo "$jar is missing: run 'mvn -B package -DskipTests' first"
    return 1
  fi
  local port="" status=0
  tmp=$(mktemp -d)
  pid=""
  # this check runs in its own bash (see main): the trap cleans up when it exits
  trap 'if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi; rm -rf "$tmp"' EXIT
  # A port nobody listens on, then retry if the daemon still cannot bind it (raced).
  for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      continue
    fi
    : >"$tmp/daemon.log" # exists before the background job opens it: the grep below may run first
    java -Xmx128m -jar "$jar" --backend host --socket none --listen 127.0.0.1:0 \
      --metrics-host 127.0.0.1 --metrics-port "$port" --shm-dir "$tmp/shm" \
      --host-devices 2 --host-device-bytes 64MiB --drain-timeout-ms 2000 >"$tmp/daemon.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 150); do
      grep -q "gpumemd ready" "$tmp/daemon.log" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if grep -q "gpumemd ready" "$tmp/daemon.log"; then
      break
    fi
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
    echo "daemon did not start on metrics port $port (attempt $attempt):"
    tail -n 5 "$tmp/daemon.log"
  done
  if [ -z "$pid" ]; then
    return 1
  fi
  local target
  target=$(grep -o 'Listening on tcp://[0-9.]*:[0-9]*' "$tmp/daemon.log" | head -n 1 | sed 's|.*tcp://||')
  "${GPUMEMD_PYTHON:-/usr/bin/python3}" .ci/counter_overflow.py "$target"
  curl -fsS "http://127.0.0.1:$port/metrics" >"$tmp/metrics.txt"
  echo "scraped $(grep -c '^gpumemd_' "$tmp/metrics.txt") samples of $(grep -c '^# TYPE' "$tmp/metrics.txt") metrics"
  # the probes the manifests use (httpGet), on the same listener
  local probe
  for probe in healthz readyz; do
    if ! curl -fsS "http://127.0.0.1:$port/$probe" >"$tmp/$probe.txt"; then
      echo "/$probe did not answer 200"
      return 1
    fi
    echo "/$probe: $(cat "$tmp/$probe.txt")"
  done
  local promtool_status=0
  "$promtool" check metrics <"$tmp/metrics.txt" || promtool_status=$?
  kill -TERM "$pid"
  wait "$pid" || status=$?
  pid=""
  if [ "$promtool_status" -ne 0 ]; then
    echo "promtool check metrics failed ($promtool_status)"
    return 1
  fi
  echo "promtool check metrics: no problems"
  if [ "$status" -ne 0 ]; then
    echo "daemon exited $status after SIGTERM (expected 0); its log:"
    cat "$tmp/daemon.log"
    return 1
  fi
  echo "daemon exited 0 after SIGTERM"
}

check_dashboards() {
  local f
  for f in deploy/grafana/*.json; do
    if command -v python3 >/dev/null; then
      python3 -m json.tool "$f" >/dev/null
    else
      node -e 'JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"))' "$f"
    fi
    echo "$f: valid JSON"
  done
}

# --- main ----------------------------------------------------------------------------------

install_tools
# Each check runs in a bash of its own: errexit is off for anything run as an `if` condition,
# subshells included, but a new process starts with the options it is given.
export repo tools promtool
export -f log check_compose check_dockerfile check_manifests check_metrics check_dashboards
failed=()
passed=0
for check in check_compose check_dockerfile check_manifests check_metrics check_dashboards; do
  log "${check#check_}"
  if bash -euo pipefail -c "$check"; then
    passed=$((passed + 1))
  else
    echo "FAILED: ${check#check_}"
    failed+=("${check#check_}")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  log "deploy checks failed: ${failed[*]} ($passed passed)"
  exit 1
fi
log "deploy checks passed: $passed of $passed"
