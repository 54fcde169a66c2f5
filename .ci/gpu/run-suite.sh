#!/usr/bin/env bash
# On the GPU machine (no JDK, no network): unpacks .gpu/bundle.tar.xz (built by
# .ci/gpu/bundle.sh) and runs tests with its Java runtime and the JUnit console launcher.
#
#   bash .gpu/run-suite.sh                       # every test class whose name contains Cuda,
#                                                # in the test classes of every module
#   bash .gpu/run-suite.sh a.b.SomeTest a.b.OtherTest#someMethod
#
# Run it from the repository root (tests that read repository files look for it there).
# JUnit XML reports go to $OUT/junit (or /tmp/junit). Afterwards .gpu/env.sh defines $J (the
# bundled java) and $CP (the classpath) for further commands in the same call, e.g.
#   bash .gpu/run-suite.sh; . .gpu/env.sh; $J -cp "$CP" io.gpumemd.server.Main --backend cuda ...
# Exit status: the console launcher's (0 when every selected test passed or was skipped, 1 when
# one failed, 2 when none was found), 9 when the bundle cannot be unpacked.
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=/tmp/gpumemd-bundle
rm -rf "$B"
mkdir -p "$B"
tar xJf "$here/bundle.tar.xz" -C "$B" || exit 9
J=$B/jre/bin/java
CP="$B/lib/*"
printf 'J=%s\nCP=%s\n' "$J" "$CP" > "$here/env.sh"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  || echo "no nvidia-smi: the CUDA tests will report themselves skipped"

selectors=()
if [ $# -gt 0 ]; then
  for c in "$@"; do
    case $c in
      *'#'*) selectors+=(--select-method "$c") ;;
      *) selectors+=(--select-class "$c") ;;
    esac
  done
else
  # every module's test classes (*-test-classes.jar), scanned for classes named *Cuda*
  test_jars=$(ls "$B"/lib/*-test-classes.jar | paste -sd:)
  selectors=(--scan-classpath "$test_jars" --include-classname '^(.*\.)?[^.]*Cuda[^.]*$')
fi

# -ea as under Surefire: the pool checks its invariants with assert
"$J" -ea -Dgpumemd.test.xmx=1g -cp "$CP" org.junit.platform.console.ConsoleLauncher execute \
  --disable-banner --details=tree --fail-if-no-tests --reports-dir="${OUT:-/tmp}/junit" "${selectors[@]}"
