#!/usr/bin/env bash
# Builds a self-contained test bundle for a GPU machine that has no JDK, no Maven and no
# network: a jlink'd Java 17 runtime plus the test classpath of every module of the build,
# packed into .gpu/bundle.tar.xz beside run-suite.sh (.gpu/ is ignored by git).
#
#   bash .ci/gpu/bundle.sh                  # from anywhere in the repository
#   then on the GPU machine, with .gpu/ carried there:
#   bash .gpu/run-suite.sh                  # every test class whose name contains Cuda
#   bash .gpu/run-suite.sh io.gpumemd.server.pool.DevicePoolTest [Class#method ...]
#
# What goes in lib/ (one directory, one classpath "lib/*"):
#   - for each module in the root pom's <modules>: its main jar, and its test classes (with
#     test resources) as <artifactId>-test-classes.jar;
#   - every dependency of every module in test scope, one version per groupId:artifactId (the
#     highest when modules disagree), the modules themselves excepted (they come from above);
#   - JUnit as the console-standalone launcher only (it holds the platform and Jupiter; the
#     separate JUnit jars would be a second copy of the same classes);
#   - one SLF4J binding: Logback (slf4j-simple, gpumemctl's binding, is left out).
# Slimming to stay well under the 64 MiB carry limit: JCuda's PTX-compiler, NVRTC and runtime
# natives (gpumemd uses the driver API only), netty's natives for other platforms, and the JMH
# annotation processor (compile time only) are left out.
#
# Builds with `mvn package -DskipTests` over the whole reactor (never install: ~/.m2 is shared).
# The console launcher is fetched into ~/.m2 on first use, the only step that may need the
# network. Set GPUMEMD_MVN_OFFLINE=1 to pass -o to every Maven call.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
out=$root/.gpu
stage=$out/stage
limit_bytes=$((64 * 1024 * 1024))
mvn_opts=(-B -q)
if [ "${GPUMEMD_MVN_OFFLINE:-0}" = 1 ]; then mvn_opts+=(-o); fi
dependency_plugin=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

log() { printf '== %s\n' "$*"; }

# The first <tag> of a pom outside its <parent> block (a module inherits what it does not set).
pom_value() {
  awk -v tag="$2" '
    /<parent>/ { inparent = 1 } /<\/parent>/ { inparent = 0; next } inparent { next }
    index($0, "<" tag ">") { sub(".*<" tag ">", ""); sub("</" tag ">.*", ""); print; exit }
  ' "$1"
}

modules=$(sed -n 's:.*<module>\(.*\)</module>.*:\1:p' pom.xml)
group=$(pom_value pom.xml groupId)
version=$(pom_value pom.xml version)
[ -n "$modules" ] && [ -n "$group" ] && [ -n "$version" ] || { echo "cannot read modules, groupId, version from pom.xml" >&2; exit 1; }

# a JDK 17 with jmods (for jlink and jar), and the tools used below
jdk=${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v javac)")")")}
[ -d "$jdk/jmods" ] || jdk=/usr/lib/jvm/java-17-openjdk-amd64
[ -x "$jdk/bin/jlink" ] && [ -d "$jdk/jmods" ] || { echo "no JDK with jmods at $jdk (set JAVA_HOME)" >&2; exit 1; }
for tool in mvn zip xz tar; do
  command -v "$tool" >/dev/null || { echo "$tool is needed" >&2; exit 1; }
done

rm -rf "$stage"
mkdir -p "$stage/lib" "$stage/m2"

log "mvn package -DskipTests and test-scope dependencies of: $(echo $modules)"
mvn "${mvn_opts[@]}" -DskipTests package "$dependency_plugin:copy-dependencies" \
  -DincludeScope=test -DexcludeGroupIds="$group" -Dmdep.useRepositoryLayout=true \
  -DoutputDirectory="$stage/m2" >/dev/null

for m in $modules; do
  artifact=$(pom_value "$m/pom.xml" artifactId)
  packaging=$(pom_value "$m/pom.xml" packaging)
  if [ "${packaging:-jar}" != jar ]; then
    echo "$m: packaging $packaging, no jar"
    continue
  fi
  main=$m/target/$artifact-$version.jar
  [ -f "$main" ] || { echo "$m: $main is missing after the build" >&2; exit 1; }
  cp "$main" "$stage/lib/"
  if [ -d "$m/target/test-classes" ] && [ -n "$(ls -A "$m/target/test-classes")" ]; then
    "$jdk/bin/jar" cf "$stage/lib/$artifact-test-classes.jar" -C "$m/target/test-classes" .
  fi
done

# One version per artifact: the repository layout is group/path/artifactId/version/files; keep
# the highest version directory of each artifact (all its classifiers), flattened into lib/.
find "$stage/m2" -name '*.jar' -printf '%h\n' | sed 's:/[^/]*$::' | sort -u | while read -r artifact_dir; do
  versions=$(find "$artifact_dir" -mindepth 2 -maxdepth 2 -name '*.jar' -printf '%h\n' | sed 's:.*/::' | sort -u)
  chosen=$(printf '%s\n' $versions | sort -V | tail -n 1)
  if [ "$(printf '%s\n' $versions | wc -l)" -gt 1 ]; then
    echo "${artifact_dir#"$stage/m2/"}: versions $(echo $versions), bundling $chosen"
  fi
  cp "$artifact_dir/$chosen"/*.jar "$stage/lib/"
done

# JUnit: the console-standalone of the platform version the modules use, instead of the
# separate platform, Jupiter, opentest4j and apiguardian jars.
commons=$(ls "$stage"/lib/junit-platform-commons-*.jar)
junit_platform=$(basename "$commons" .jar | sed 's/^junit-platform-commons-//')
rm -f "$stage"/lib/junit-platform-*.jar "$stage"/lib/junit-jupiter-*.jar \
  "$stage"/lib/opentest4j-*.jar "$stage"/lib/apiguardian-api-*.jar
console=org.junit.platform:junit-platform-console-standalone:$junit_platform
log "$console"
mvn "${mvn_opts[@]}" "$dependency_plugin:copy" -Dartifact="$console" -DoutputDirectory="$stage/lib" >/dev/null

log "slimming"
for j in "$stage"/lib/jcuda-natives-*.jar; do
  [ -f "$j" ] && { zip -q -d "$j" 'lib/libJNvPTXCompiler*' 'lib/libJNvrtc*' 'lib/libnvrtc*' 'lib/libJCudaRuntime*' || true; }
done
for j in "$stage"/lib/grpc-netty-shaded-*.jar "$stage"/lib/netty-*.jar; do
  [ -f "$j" ] && { zip -q -d "$j" 'META-INF/native/*aarch_64*' 'META-INF/native/*osx*' 'META-INF/native/*windows*' 'META-INF/native/*riscv64*' 'META-INF/native/*ppcle*' 'META-INF/native/*s390x*' >/dev/null 2>&1 || true; }
done
rm -f "$stage"/lib/jmh-generator-annprocess-*.jar
# Two SLF4J bindings would leave the choice to the order of "lib/*", which the JVM does not fix:
# the daemon and its test fixtures (LogCapture) log through Logback; slf4j-simple is only the
# binding of the gpumemctl jar.
if ls "$stage"/lib/logback-classic-*.jar >/dev/null 2>&1; then
  rm -f "$stage"/lib/slf4j-simple-*.jar
fi
# the protobuf descriptor set (for grpcurl -protoset on the GPU machine)
find . -path ./.gpu -prune -o -name '*.protoset' -path '*/target/classes/*' -print | xargs -r -I{} cp {} "$stage/lib/"

log "jlink from $jdk"
"$jdk/bin/jlink" --module-path "$jdk/jmods" \
  --add-modules java.base,java.logging,jdk.security.auth,java.management,java.naming,java.net.http,java.xml,java.sql,jdk.unsupported,jdk.httpserver,jdk.management,jdk.crypto.ec,jdk.jcmd,jdk.attach,jdk.jfr,java.instrument,jdk.zipfs \
  --strip-debug --no-header-files --no-man-pages --compress=2 --output "$stage/jre"

log "packing"
rm -f "$out/bundle.tar.xz"
XZ_OPT=-6 tar cJf "$out/bundle.tar.xz" -C "$stage" jre lib
cp .ci/gpu/run-suite.sh .ci/gpu/on-gpu.sh "$out/"
jars=$(ls "$stage"/lib/*.jar | wc -l)
rm -rf "$stage"
size=$(stat -c %s "$out/bundle.tar.xz")
echo "bundle: .gpu/bundle.tar.xz, $((size / 1024 / 1024)) MiB ($size bytes), $jars jars"
if [ "$size" -ge "$limit_bytes" ]; then
  echo "bundle is over the 64 MiB carry limit" >&2
  exit 1
fi
echo 'carry [".gpu"]; run: bash .gpu/run-suite.sh [TestClass|TestClass#method ...]'
