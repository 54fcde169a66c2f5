package io.gpumemd.server.offload;

import io.gpumemd.common.Sizes;
import io.gpumemd.server.backend.HostBuffer;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.error.ExhaustedException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
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
 * <p>Spare buffers: the host memory of contents dropped after a wake is kept for the next
 * park of the same length (sleep and wake alternate, with the same leases), because making
 * host memory is most of a park's cost: faulting in and zeroing every page on the host backend,
 * pinning it on CUDA. Spares count against the bound with what is parked, so the store never
 * holds more host memory than {@code --offload-max-bytes}: a claim that needs their room frees
 * them first, and {@link #trimSpares} frees those left unused for {@link #SPARE_IDLE_NANOS}.
 *
 * <p>Thread-safety: the bound is one atomic count, claimed by compare-and-set so that concurrent
 * claims never hold more than the bound between them; spares are guarded by this store's
 * monitor; copies run outside any lock, each on the calling thread.
 */
public final class HostStore {
  private final MemoryBackend backend;
  private final long maxBytes;
  private final AtomicLong claimedBytes = new AtomicLong();
  private final AtomicLong parks = new AtomicLong();
  private final AtomicLong restores = new AtomicLong();
  private final AtomicLong parkNanos = new AtomicLong();
  private final AtomicLong restoreNanos = new AtomicLong();
  /** Unused host buffers by length, oldest first; guarded by this. Their bytes are in {@link #claimedBytes}. */
  private final Map<Long, ArrayDeque<Spare>> spares = new HashMap<>();
  private long spareBytes;

  /** How long a spare buffer is kept without being reused. */
  static final long SPARE_IDLE_NANOS = TimeUnit.SECONDS.toNanos(30);

  private record Spare(HostBuffer buffer, long sinceNanos) {}

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
      if (held + bytes > maxBytes && freeSpares(held + bytes - maxBytes) > 0) {
        continue;
      }
      if (held + bytes > maxBytes) {
        throw new ExhaustedException("keeping " + Sizes.format(bytes) + " of " + what + " in host memory would exceed"
            + " --offload-max-bytes (" + Sizes.format(maxBytes) + ", " + Sizes.format(held) + " already held)");
      }
      if (claimedBytes.compareAndSet(held, held + bytes)) {
        return new Claim(bytes);
      }
    }
  }

  /**
   * A spare buffer of exactly {@code length} bytes, or null; its bytes move from the spares to
   * the caller's claim (which already counted them: the caller gives the claim's share back).
   */
  synchronized HostBuffer takeSpare(long length) {
    ArrayDeque<Spare> ofLength = spares.get(length);
    Spare spare = ofLength == null ? null : ofLength.pollLast();
    if (spare == null) {
      return null;
    }
    if (ofLength.isEmpty()) {
      spares.remove(length);
    }
    spareBytes -= length;
    return spare.buffer();
  }

  /** Keeps a buffer whose contents were dropped for the next park of its length; its bytes stay claimed. */
  synchronized void keepSpare(HostBuffer buffer, long length) {
    spares.computeIfAbsent(length, l -> new ArrayDeque<>()).addLast(new Spare(buffer, System.nanoTime()));
    spareBytes += length;
  }

  /** Frees spares, oldest first, until {@code bytes} are freed or none is left; returns the bytes freed. */
  private long freeSpares(long bytes) {
    return freeSparesWhere(bytes, s -> true);
  }

  /** Frees the spare buffers unused for {@link #SPARE_IDLE_NANOS}; housekeeping calls it. Returns the bytes freed. */
  public long trimSpares() {
    return trimSpares(SPARE_IDLE_NANOS);
  }

  /** Frees the spare buffers unused for {@code idleNanos}; returns the bytes freed. */
  long trimSpares(long idleNanos) {
    long now = System.nanoTime();
    return freeSparesWhere(Long.MAX_VALUE, s -> now - s.sinceNanos() >= idleNanos);
  }

  private long freeSparesWhere(long bytes, java.util.function.Predicate<Spare> idle) {
    List<HostBuffer> freed = new ArrayList<>();
    long total = 0;
    synchronized (this) {
      for (var it = spares.values().iterator(); it.hasNext() && total < bytes; ) {
        ArrayDeque<Spare> ofLength = it.next();
        while (!ofLength.isEmpty() && total < bytes && idle.test(ofLength.peekFirst())) {
          Spare spare = ofLength.pollFirst();
          freed.add(spare.buffer());
          total += spare.buffer().bytes();
        }
        if (ofLength.isEmpty()) {
          it.remove();
        }
      }
      spareBytes -= total;
    }
    freed.forEach(HostBuffer::free); // munmap or cuMemFreeHost: outside the monitor
    claimedBytes.addAndGet(-total);
    return total;
  }

  /** Bytes of spare buffers kept for the next park (in {@link #heldBytes}). */
  public synchronized long spareBytes() {
    return spareBytes;
  }

  /** Bytes of contents parked, and claims not yet used or closed (spare buffers not included). */
  public synchronized long heldBytes() {
    return claimedBytes.get() - spareBytes;
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
      if (!parked.reusedSpare()) {
        unused -= length; // a spare's bytes were counted already: the claim's share goes back at close
      }
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
