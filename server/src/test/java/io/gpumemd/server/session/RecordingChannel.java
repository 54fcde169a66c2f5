package io.gpumemd.server.session;

import java.util.ArrayList;
import java.util.List;

/** A KeepAlive channel that records what the registry sent it; for the session, books and sharing tests. */
public final class RecordingChannel implements SessionChannel {
  public final List<Long> unmapRequests = new ArrayList<>();
  long shutdownDrainMillis = -1;
  boolean closed;

  @Override
  public synchronized void requestUnmap(int device, long segmentId) {
    unmapRequests.add(segmentId);
  }

  final List<long[]> returnRequests = new ArrayList<>();
  final List<Long> allowances = new ArrayList<>();

  @Override
  public synchronized void returnCache(int device, long bytes) {
    returnRequests.add(new long[] {device, bytes});
  }

  @Override
  public synchronized void cacheAllowance(long bytes) {
    allowances.add(bytes);
  }

  /** Admin sleep requests: {request id, 1 for a wake, level}. */
  public final List<long[]> sleepAsks = new ArrayList<>();

  @Override
  public synchronized void sleepAsked(long requestId, boolean wake, int level, List<String> tags) {
    sleepAsks.add(new long[] {requestId, wake ? 1 : 0, level});
  }

  @Override
  public synchronized void shutdownNotice(long drainMillis) {
    shutdownDrainMillis = drainMillis;
  }

  @Override
  public synchronized void close() {
    closed = true;
  }
}
