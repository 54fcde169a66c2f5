package io.gpumemd.server.pool;

/*
 * Run from the repository root (one command; about one minute on a 2-core VM):
 *
 *   mvn -B -q -pl server -am test-compile dependency:build-classpath \
 *       -Dmdep.includeScope=test -Dmdep.outputFile=target/test-classpath.txt \
 *     && java -cp "server/target/test-classes:server/target/classes:$(cat server/target/test-classpath.txt)" \
 *       org.openjdk.jmh.Main PoolBenchmark
 *
 * JMH options go after the class name, e.g. "PoolBenchmark -p cachedBlocks=1000 -wi 1 -i 3"
 * or "-prof gc". The annotation processor (jmh-generator-annprocess, a test dependency)
 * generates the harness during test-compile; nothing here runs during `mvn test`.
 */

import io.gpumemd.common.SizeClasses;
import io.gpumemd.common.Ticker;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.SegmentOwner;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.SplittableRandom;
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
 * Cost of the pool core: one {@link DevicePool#lease} that hits the cache plus the {@link
 * DevicePool#release} that returns the block, on an {@link InMemoryBackend} (no backend cost on
 * this path anyway: a hit and a return make no backend call).
 *
 * <p>The pool is prefilled so that its free index holds {@code cachedBlocks} free blocks of
 * mixed sizes: a little over twice that many blocks are leased (85% small, 512 B .. 1 MiB
 * log-uniform; 15% large, 1 .. 32 MiB) and every other one by address released, so that the
 * free blocks are separated by leased ones and cannot coalesce (the setup prints the count). The measured requests are sizes of the released blocks, in
 * random order: each is a best-fit hit (exact or split), and its release coalesces the block
 * back, so the index stays the same size throughout.
 *
 * <p>Figures (2026-11-22; 2-core AMD EPYC VM shared with other builds; JDK 17.0.15; fork 1,
 * 3 x 2 s warm-up, 5 x 2 s measured):
 *
 * <pre>
 *  cachedBlocks   lease + release (ns/op)   allocated (B/op, -prof gc)
 *  1,000          212 +- 12                 68
 *  100,000        667 +- 70                 ~87
 * </pre>
 *
 * The step from 1,000 to 100,000 free blocks is the size-ordered TreeSet (about 17 levels
 * instead of 10, and nodes no longer in cache) walked by best fit, split and coalesce.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Fork(value = 1, jvmArgsAppend = {"-Xms1g", "-Xmx1g"})
@Warmup(iterations = 3, time = 2)
@Measurement(iterations = 5, time = 2)
public class PoolBenchmark {
  private static final long MiB = 1L << 20;
  private static final int SIZES = 1 << 12;

  @Param({"1000", "100000"})
  public int cachedBlocks;

  private DevicePool pool;
  private final long[] sizes = new long[SIZES];
  private int next;
  private long missesAfterPrefill;

  @Setup(Level.Trial)
  public void prefill() {
    long huge = 1L << 50; // no budget or capacity pressure: this measures the index, not eviction
    InMemoryBackend backend = new InMemoryBackend(1, huge, false).recordZeroCalls(false);
    DeviceInfo device = backend.devices().get(0);
    pool = new DevicePool(device, backend, new PoolSettings(huge, huge, SizeClasses.DEFAULT_MAX_OVERSIZE),
        new RecordingHolders(), DevicePools.segmentIdBase(0), Ticker.system());
    SplittableRandom random = new SplittableRandom(42);
    // A little over twice as many blocks as wanted: every other one is released below, and
    // the last block of a small segment merges with the segment's free tail when released.
    List<Block> blocks = new ArrayList<>();
    for (int i = 0; i < 2 * cachedBlocks + cachedBlocks / 5; i++) {
      blocks.add(pool.lease(mixedSize(random), false, "bench", SegmentOwner.DAEMON).block());
    }
    // Every other block by address, so that no two released blocks are neighbours.
    blocks.sort(Comparator.comparingLong(Block::segmentId).thenComparingLong(Block::offset));
    List<Long> released = new ArrayList<>();
    for (int i = 1; i < blocks.size(); i += 2) {
      Block block = blocks.get(i);
      released.add(block.size());
      pool.release(block, null);
    }
    for (int i = 0; i < SIZES; i++) {
      sizes[i] = released.get(random.nextInt(released.size()));
    }
    PoolStats s = pool.stats();
    if (s.get(PoolMetric.CACHED_BLOCKS) < cachedBlocks) {
      throw new IllegalStateException("prefill left " + s.get(PoolMetric.CACHED_BLOCKS) + " free blocks (expected: >= " + cachedBlocks + ")");
    }
    System.out.printf("prefill: %d free blocks in the index, %d leased, %d segments%n",
        s.get(PoolMetric.CACHED_BLOCKS), s.get(PoolMetric.ACTIVE_LEASES), s.get(PoolMetric.SEGMENTS));
    pool.verifyInvariants();
    missesAfterPrefill = pool.stats().get(PoolMetric.MISSES);
  }

  /** 85% small (512 B .. 1 MiB), 15% large (1 .. 32 MiB), log-uniform within each. */
  static long mixedSize(SplittableRandom random) {
    boolean large = random.nextInt(100) < 15;
    double lo = Math.log(large ? MiB + 1 : 512);
    double hi = Math.log(large ? 32 * MiB : MiB);
    return (long) Math.exp(lo + random.nextDouble() * (hi - lo));
  }

  @Benchmark
  public Block leaseAndRelease() {
    long size = sizes[next++ & (SIZES - 1)];
    Block block = pool.lease(size, false, "bench", SegmentOwner.DAEMON).block();
    pool.release(block, null);
    return block;
  }

  @TearDown(Level.Trial)
  public void check() {
    pool.verifyInvariants();
    PoolStats s = pool.stats();
    if (s.get(PoolMetric.MISSES) != missesAfterPrefill) {
      throw new IllegalStateException("the benchmark missed the cache: " + s);
    }
    pool.close();
  }
}
