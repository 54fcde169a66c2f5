#!/usr/bin/env bash
# On a GPU machine (no JDK, no Maven, no network), from the repository root with .gpu/ (built
# here by .ci/gpu/bundle.sh) and python/gpumemd/v1 (python3 python/gen_stubs.py) carried along:
# every CUDA suite and the GPU benchmarks in one go, each part under its own time limit, so
# that one lent machine answers all of them in a single call.
#
#   bash .gpu/on-gpu.sh [java|python|bench ...]     # default: all three, in that order
#
# What comes back goes to $OUT (or /tmp/gpu-out), seven files: machine.txt (nvidia-smi and the
# Python packages), java.log and junit/, python.log and pytest.xml, bench.log, and logs.tar.gz
# (every daemon log the tests and benchmarks left in /tmp). Time limits (seconds) are
# GPUMEMD_GPU_JAVA_S, GPUMEMD_GPU_PYTHON_S, GPUMEMD_GPU_BENCH_S. The Python tests and the
# benchmarks start the daemon as `java -jar gpumemd.jar`: a launcher jar is written here whose
# manifest names the bundle's jars, and the bundle's java is put first on PATH.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3=${PYTHON:-python3}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(java python bench)
status=0

nvidia-smi > "$out/machine.txt" 2>&1 || echo "no nvidia-smi" > "$out/machine.txt"
"$python3" - >> "$out/machine.txt" 2>&1 <<'EOF'
import importlib
for name in ("grpc", "google.protobuf", "pytest", "numpy", "torch", "cupy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # a missing one is reported, the tests that need it skip
        print(name, "missing:", e)
EOF

# The bundle is unpacked by run-suite.sh; without the Java part, unpack it with an empty run.
bundle=/tmp/gpumemd-bundle
if [[ " ${parts[*]} " == *" java "* ]]; then
  echo "== java: every *Cuda* test class"
  ( time timeout -k 10 "${GPUMEMD_GPU_JAVA_S:-240}" bash .gpu/run-suite.sh ) > "$out/java.log" 2>&1 || status=1
  tail -n 15 "$out/java.log"
else
  rm -rf "$bundle" && mkdir -p "$bundle" && tar xJf .gpu/bundle.tar.xz -C "$bundle" || exit 9
fi
export PATH=$bundle/jre/bin:$PATH

launcher=$bundle/lib/gpumemd.jar
"$python3" - "$bundle/lib" "$launcher" <<'EOF'
import os, sys, zipfile
lib, launcher = sys.argv[1], sys.argv[2]
jars = sorted(j for j in os.listdir(lib) if j.endswith(".jar") and j != os.path.basename(launcher))
def header(name, value):  # manifest lines are at most 72 bytes; a continuation starts with a space
    line, rows = "%s: %s" % (name, value), []
    rows.append(line[:70])
    line = line[70:]
    while line:
        rows.append(" " + line[:69])
        line = line[69:]
    return "\r\n".join(rows) + "\r\n"
manifest = ("Manifest-Version: 1.0\r\n" + header("Main-Class", "io.gpumemd.server.Main")
            + header("Multi-Release", "true") + header("Class-Path", " ".join(jars)) + "\r\n")
with zipfile.ZipFile(launcher, "w") as z:
    z.writestr("META-INF/MANIFEST.MF", manifest)
EOF
export GPUMEMD_JAR=$launcher JAVA=java

if [[ " ${parts[*]} " == *" python "* ]]; then
  echo "== python: the GPU test files"
  ( cd python && time timeout -k 10 "${GPUMEMD_GPU_PYTHON_S:-220}" "$python3" -m pytest -p no:cacheprovider -q -rs \
      --junitxml="$out/pytest.xml" tests/test_cuda.py tests/test_cuda_client.py tests/test_alloc_gpu.py \
      tests/test_cupy_stream.py tests/test_close_gpu_work.py tests/test_cuda_peer_access.py \
      tests/test_cuda_uuid_v2.py tests/test_vmm_addresses.py tests/test_pinning.py tests/test_sleep.py ) \
    > "$out/python.log" 2>&1 || status=1
  tail -n 25 "$out/python.log"
fi

if [[ " ${parts[*]} " == *" bench "* ]]; then
  echo "== bench: CudaBenchmarkMain, alloc_bench.py"
  dir=$(mktemp -d)
  java -jar "$launcher" --backend cuda --client-cache-bytes 2GiB --socket "$dir/gpumemd.sock" \
    --shm-dir "$dir/shm" --metrics-port 0 > "$dir/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 1 300); do grep -q "gpumemd ready" "$dir/daemon.log" && break; sleep 0.1; done
  budget=${GPUMEMD_GPU_BENCH_S:-150}
  echo "== CudaBenchmarkMain" > "$out/bench.log"
  ( time timeout -k 5 $((budget / 2)) java -cp "$bundle/lib/*" io.gpumemd.it.cuda.CudaBenchmarkMain \
      "unix://$dir/gpumemd.sock" ) >> "$out/bench.log" 2>&1 || status=1
  kill -TERM "$daemon"; wait "$daemon"
  echo "== alloc_bench.py" >> "$out/bench.log"
  ( time PYTHONPATH=python timeout -k 5 $((budget / 2)) "$python3" python/bench/alloc_bench.py --jar "$launcher" \
      --iterations 5000 --rounds 20 ) >> "$out/bench.log" 2>&1 || status=1
  tail -n 40 "$out/bench.log"
fi

# every daemon log left behind (pytest's temporary directories, the benchmark's daemon)
find /tmp -name '*.log' -newer "$out/machine.txt" -not -path "$out/*" 2>/dev/null \
  | tar czf "$out/logs.tar.gz" -T - 2>/dev/null
exit $status
