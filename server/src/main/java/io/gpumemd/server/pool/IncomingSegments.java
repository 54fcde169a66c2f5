package io.gpumemd.server.pool;

import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.server.backend.BackendException;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentMemory;
import java.util.List;

/**
 * The segments a take-over hands to the pools it restores, by the index their snapshots name
 * ({@link PoolSnapshot.SegmentSnapshot#descriptorIndex}): first those adopted ahead of the state,
 * while the running daemon still served, then the descriptors that came with the state. Owns
 * every one not yet taken: {@link #take} hands one to a pool, {@link #discard} and {@link #close}
 * give it up (a descriptor is closed, a segment adopted ahead relinquished: this process's
 * references dropped, never the memory freed).
 *
 * <p>Not thread-safe: the restoring thread uses it.
 */
public final class IncomingSegments implements AutoCloseable {
  private final MemoryBackend backend;
  /** Adopted ahead, by index; null once taken or given up. */
  private final SegmentMemory[] ahead;
  /** Received with the state, by index less {@code ahead.length}; -1 once taken or given up. */
  private final int[] fds;

  /**
   * @param backend the backend that adopted {@code ahead}, and adopts the descriptors
   * @param ahead segments adopted ahead of the state ({@link MemoryBackend#adopt}), owned from now on
   * @param fds descriptors received with the state, owned from now on
   */
  public IncomingSegments(MemoryBackend backend, List<SegmentMemory> ahead, int[] fds) {
    this.backend = backend;
    this.ahead = ahead.toArray(new SegmentMemory[0]);
    this.fds = fds.clone();
  }

  /** Descriptors received with a state, none sent ahead. */
  public static IncomingSegments of(MemoryBackend backend, int[] fds) {
    return new IncomingSegments(backend, List.of(), fds);
  }

  /** How many segments the snapshots may name: indexes 0 to this, exclusive. */
  public int size() {
    return ahead.length + fds.length;
  }

  /** How many came ahead of the state (the first indexes). */
  public int aheadCount() {
    return ahead.length;
  }

  /** Whether {@code index} names a segment here not yet taken nor given up. */
  boolean available(int index) {
    if (index < 0 || index >= size()) {
      return false;
    }
    return index < ahead.length ? ahead[index] != null : fds[index - ahead.length] >= 0;
  }

  /**
   * The segment at {@code index}, to be device {@code device}'s and of {@code bytes}: one adopted
   * ahead, checked to be that, or a descriptor adopted now ({@link MemoryBackend#adopt}, which
   * checks it). Taken whatever happens: on a refusal it is given up.
   *
   * @throws BackendException when it is not that segment, or cannot be adopted
   */
  SegmentMemory take(int index, int device, long bytes) {
    if (!available(index)) {
      throw new BackendException("descriptor " + index + " is named twice, or is not among the " + size() + " sent");
    }
    if (index < ahead.length) {
      SegmentMemory memory = ahead[index];
      ahead[index] = null;
      if (memory.device() != device || memory.bytes() != bytes) {
        relinquish(memory);
        throw new BackendException("the segment sent ahead as descriptor " + index + " is device " + memory.device()
            + "'s, " + memory.bytes() + " bytes (expected: device " + device + "'s, " + bytes + " bytes, as the state "
            + "says)");
      }
      return memory;
    }
    int fd = fds[index - ahead.length];
    fds[index - ahead.length] = -1;
    return backend.adopt(device, fd, bytes);
  }

  /** Gives up the segment at {@code index}, if not taken yet. */
  void discard(int index) {
    if (index < 0 || index >= size()) {
      return;
    }
    if (index < ahead.length) {
      SegmentMemory memory = ahead[index];
      ahead[index] = null;
      if (memory != null) {
        relinquish(memory);
      }
      return;
    }
    Descriptors.closeQuietly(fds[index - ahead.length]); // below 0: taken or given up already
    fds[index - ahead.length] = -1;
  }

  /**
   * Gives up the segments sent ahead that none of {@code snapshots} names (freed while the
   * running daemon served on), before the restore adopts the descriptors that came with the
   * state: a backend that counts what it holds then counts only what the restore will keep.
   */
  public void keepOnlyNamed(List<PoolSnapshot> snapshots) {
    boolean[] named = new boolean[ahead.length];
    for (PoolSnapshot pool : snapshots) {
      for (PoolSnapshot.SegmentSnapshot s : pool.segments()) {
        if (s.descriptorIndex() >= 0 && s.descriptorIndex() < ahead.length) {
          named[s.descriptorIndex()] = true;
        }
      }
    }
    for (int i = 0; i < ahead.length; i++) {
      if (!named[i]) {
        discard(i);
      }
    }
  }

  /** Gives up every segment not taken: those the state did not name, or that a refusal left. */
  @Override
  public void close() {
    for (int i = 0; i < size(); i++) {
      discard(i);
    }
  }

  /**
   * Drops this process's references to segments adopted ahead that no {@code IncomingSegments}
   * owns yet (never frees them: they are the running daemon's), and empties the list.
   */
  public static void relinquishAll(MemoryBackend backend, List<SegmentMemory> adopted) {
    adopted.forEach(memory -> PoolRestorer.relinquishQuietly(backend, memory));
    adopted.clear();
  }

  private void relinquish(SegmentMemory memory) {
    PoolRestorer.relinquishQuietly(backend, memory);
  }
}
