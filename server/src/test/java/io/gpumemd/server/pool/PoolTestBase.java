package io.gpumemd.server.pool;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;

/**
 * Shared set-up of the pool unit tests: a {@link CheckedPool} on a 64 MiB {@link InMemoryBackend}
 * (budget and retention cap 64 MiB, oversize 20 MiB) unless a test installs its own with {@link
 * #use}, and after every test {@link CheckedPool#verify()} followed by a close that must leave
 * the backend empty.
 */
abstract class PoolTestBase {
  static final long KiB = CheckedPool.KiB;
  static final long MiB = CheckedPool.MiB;

  CheckedPool checked;
  DevicePool pool;
  InMemoryBackend backend;

  @BeforeEach
  void createDefaultPool() {
    use(CheckedPool.of(64 * MiB));
  }

  @AfterEach
  void verifyAndClose() {
    try {
      checked.verify();
    } finally {
      checked.close();
    }
  }

  /** Replaces the pool under test (the previous one is verified and closed first). */
  CheckedPool use(CheckedPool replacement) {
    if (checked != null) {
      checked.verify();
      checked.close();
    }
    checked = replacement;
    pool = replacement.pool;
    backend = replacement.backend;
    return replacement;
  }

  /** A pool with its own budget, retention cap and oversize rule on a device of {@code capacity}. */
  CheckedPool use(long capacity, long limit, long retentionCap, long maxOversize) {
    return use(new CheckedPool(new InMemoryBackend(1, capacity, true),
        new PoolSettings(limit, retentionCap, maxOversize)));
  }

  Block lease(long size) {
    return checked.lease(size);
  }

  Block lease(long size, boolean zero, String holder) {
    return checked.lease(size, zero, holder);
  }

  /** Whether the lease that handed out {@code block} was a pool hit. */
  boolean hit(Block block) {
    return checked.wasHit(block);
  }

  void release(Block block) {
    checked.release(block);
  }

  PoolStats stats() {
    return checked.stats();
  }
}
