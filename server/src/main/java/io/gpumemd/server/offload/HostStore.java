package io.gpumemd.server.offload;

import io.gpumemd.common.Sizes;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.error.ExhaustedException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The daemon's host store: contents of device memory kept in host memory while that device
 * memory serves others (a sleeping session's leases at level 1, a parked published object). It
 * owns the bound on all of it ({@code --offload-max-bytes}) and the figures operators see (bytes
 * held, parks, restores and their time); the backend owns the memory itself ({@link
 * MemoryBackend#allocateHost}: pinned on CUDA, plain on the host backend) and the copies.
 *
 * <p>Parking is two steps so that a sleep of many leases is all or nothing: {@link #claim}
 * reserves the bytes of every range first (or refuses, changing nothing), then {@link
 * Claim#park} copies each range out. What a claim does not use goes back when it is closed.
 *
 * <p>Thread-safe: the bound is one atomic count, claimed by compare-and-set so that concurrent
 * claims never hold more than the bound between them; copies run outside any lock, each on the
 * calling thread.
 */
public final class HostStore {
  private final MemoryBackend backend;
  private final long maxBytes;
  private final AtomicLong claimedBytes = new AtomicLong();
  private final AtomicLong parks = new AtomicLong();
  private final AtomicLong restores = new AtomicLong();
  private final AtomicLong parkNanos = new AtomicLong();
  private final AtomicLong restoreNanos = new AtomicLong();

  public HostStore(MemoryBackend backend, long maxBytes) {
    if (maxBytes < 0) {
      throw new IllegalArgumentException("maxBytes " + maxBytes);
    }
    this.backend = backend;
    this.maxBytes = maxBytes;
  }

  /**
   * The default bound: a quarter of the machine's memory. A GPU node has about twice its
   * devices' memory in RAM (a DGX H100: 2 TiB for 640 GB of HBM), so a quarter keeps about half
   * of all device memory parked, and leaves the rest to what the engines themselves keep in host
   * memory (page cache of the weights, pinned staging buffers, CPU-offloaded KV caches). Pinned
   * memory cannot be swapped out: an unbounded store could starve the node.
   */
  public static long defaultMaxBytes() {
    return machineMemoryBytes() / 4;
  }

  /** {@code MemTotal} of {@code /proc/meminfo}, or what the JVM can tell without it. */
  static long machineMemoryBytes() {
    try {
      for (String line : Files.readAllLines(Path.of("/proc/meminfo"))) {
        if (line.startsWith("MemTotal:")) {
          return Long.parseLong(line.replaceAll("[^0-9]", "")) * 1024;
        }
      }
    } catch (IOException | NumberFormatException e) {
      // fall through: not Linux, or a /proc the daemon cannot read
    }
    return Runtime.getRuntime().maxMemory();
  }

  /**
   * Reserves {@code bytes} of the bound for {@code what} (named in the refusal).
   *
   * @throws ExhaustedException when the store would then hold more than its bound; nothing is
   *     reserved
   */
  public Claim claim(long bytes, String what) {
    if (bytes < 0) {
      throw new IllegalArgumentException("bytes " + bytes);
    }
    while (true) {
      long held = claimedBytes.get();
      if (held + bytes > maxBytes) {
        throw new ExhaustedException("keeping " + Sizes.format(bytes) + " of " + what + " in host memory would exceed"
            + " --offload-max-bytes (" + Sizes.format(maxBytes) + ", " + Sizes.format(held) + " already held)");
      }
      if (claimedBytes.compareAndSet(held, held + bytes)) {
        return new Claim(bytes);
      }
    }
  }

  /** Bytes claimed: parked contents plus claims not yet used or closed. */
  public long heldBytes() {
    return claimedBytes.get();
  }

  public long maxBytes() {
    return maxBytes;
  }

  public long parks() {
    return parks.get();
  }

  public long restores() {
    return restores.get();
  }

  public long parkNanos() {
    return parkNanos.get();
  }

  public long restoreNanos() {
    return restoreNanos.get();
  }

  MemoryBackend backend() {
    return backend;
  }

  void parked(long nanos) {
    parks.incrementAndGet();
    parkNanos.addAndGet(nanos);
  }

  void restored(long nanos) {
    restores.incrementAndGet();
    restoreNanos.addAndGet(nanos);
  }

  void release(long bytes) {
    claimedBytes.addAndGet(-bytes);
  }

  /**
   * Bytes reserved in the store and not yet parked. Thread-safety: one owner at a time (the
   * sleep or park that claimed it).
   */
  public final class Claim implements AutoCloseable {
    private long unused;

    private Claim(long bytes) {
      this.unused = bytes;
    }

    /**
     * Copies {@code [offset, offset + length)} of a segment into host memory, from the claim's
     * bytes. The caller keeps the range still meanwhile.
     *
     * @throws IllegalStateException when the claim has fewer bytes left
     */
    public ParkedRange park(io.gpumemd.server.backend.SegmentMemory segment, long offset, long length) {
      if (length > unused) {
        throw new IllegalStateException("parking " + length + " bytes from a claim with " + unused + " left");
      }
      ParkedRange parked = ParkedRange.copyOut(HostStore.this, segment, offset, length);
      unused -= length;
      return parked;
    }

    public long unusedBytes() {
      return unused;
    }

    /** Gives back what was not parked. */
    @Override
    public void close() {
      release(unused);
      unused = 0;
    }
  }
}
