package io.gpumemd.client;

import io.gpumemd.server.testing.TestDaemon;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Warmup;

/**
 * JMH: a lease + close served from the client's own cache (no round trip), per size, against a
 * host-backend daemon in the same JVM (only the first lease of a size reaches it; the notices
 * a local hit leaves cancel out). Run:
 *
 * <pre>
 * mvn -B -q -pl client -am test-compile dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt
 * java -cp "client/target/test-classes:client/target/classes:$(cat client/target/test-classpath.txt)" org.openjdk.jmh.Main LocalHitBenchmark
 * </pre>
 */
@State(Scope.Benchmark)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Fork(1)
@Warmup(iterations = 3, time = 2)
@Measurement(iterations = 5, time = 2)
public class LocalHitBenchmark {
  @Param({"4096", "2097152", "67108864"})
  public long size;

  private TestDaemon daemon;
  private GpuMemClient client;

  @Setup(Level.Trial)
  public void start() {
    daemon = TestDaemon.start("--client-cache-bytes", "128MiB");
    client = GpuMemClient.connect(daemon.unixTarget());
    client.lease(0, size).close(); // the one daemon-served lease; every later one is local
  }

  @TearDown(Level.Trial)
  public void stop() {
    client.close();
    daemon.close();
  }

  @Benchmark
  public Lease leaseAndClose() {
    Lease lease = client.lease(0, size);
    lease.close();
    return lease;
  }
}
