package io.gpumemd.server.takeover;

import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.pool.SegmentAhead;
import io.gpumemd.server.pool.SegmentFdSink;
import java.io.IOException;
import java.util.ArrayList;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The segment descriptors of one hand-over, on the running daemon's side: the index of every
 * segment whose descriptor the successor was sent (ahead of the state, or with a state sent
 * earlier), by its memory, so that a later state names it by that index and sends no second
 * copy; and the copies to send with the next frame ({@link #pending}), in index order, which this
 * object owns until {@link #sent}. Indexes run on over the whole connection, as the successor
 * counts the descriptors it receives.
 *
 * <p>Not thread-safe: the hand-over thread uses it.
 */
final class OutgoingDescriptors implements SegmentFdSink, AutoCloseable {
  private static final Logger log = LoggerFactory.getLogger(HandOver.class);

  /** Each segment sent so far (ahead, or with an earlier frame), by its memory (identity). */
  private final Map<SegmentMemory, Integer> sent = new IdentityHashMap<>();
  /** Copies to send with the next frame: segments' in index order, then unindexed ones (pidfds). */
  private final List<SegmentFd> pending = new ArrayList<>();
  private int next;

  /** Starts after the segments sent ahead, named by their order there; none when none was. */
  OutgoingDescriptors(List<SegmentAhead> ahead) {
    for (SegmentAhead a : ahead) {
      sent.put(a.memory(), next++);
    }
  }

  @Override
  public int add(SegmentMemory memory, SegmentFd descriptor) {
    pending.add(descriptor);
    sent.put(memory, next);
    return next++;
  }

  @Override
  public int sentAhead(SegmentMemory memory) {
    return sent.getOrDefault(memory, -1);
  }

  /**
   * Adds a descriptor that no segment names (a process's pidfd): after the segments' in the
   * frame, which the successor tells apart by their count.
   */
  void addUnindexed(SegmentFd descriptor) {
    pending.add(descriptor);
  }

  /** The numbers to send with the next frame, in order. */
  List<Integer> pending() {
    return pending.stream().map(SegmentFd::number).toList();
  }

  /** The pending copies went (or the frame will not): closes them. */
  void sent() {
    for (SegmentFd d : pending) {
      try {
        d.close();
      } catch (IOException e) {
        log.warn("Cannot close a sent segment descriptor: {}", e.toString());
      }
    }
    pending.clear();
  }

  @Override
  public void close() {
    sent();
  }
}
