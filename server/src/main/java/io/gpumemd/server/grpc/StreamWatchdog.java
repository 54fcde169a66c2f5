package io.gpumemd.server.grpc;

import io.gpumemd.common.Ticker;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

/**
 * Finds the KeepAlive streams whose client has stopped reading its replies, and closes them.
 *
 * <p>A stream is <em>blocked</em> while the transport holds more of its unsent replies than
 * gRPC's on-ready threshold (32 KiB): its {@link StreamSessionChannel} notices after a write,
 * and the stream's {@code onReady} ends it. A blocked stream reads no further requests (see
 * {@link SessionStream}), so a client that does not read slows only itself; one that stays
 * blocked past {@code --stream-stall-timeout-ms} is closed with RESOURCE_EXHAUSTED, and its
 * session then ends after the usual grace period unless the client reconnects. The daemon's
 * housekeeping calls {@link #closeStalled} periodically.
 *
 * <p>Thread-safety: the blocked streams are a concurrent set; each channel keeps its own
 * blocked-since time under its own monitor.
 */
public final class StreamWatchdog {
  /** The daemon's default for {@code --stream-stall-timeout-ms}. */
  public static final long DEFAULT_STALL_MILLIS = 30_000;

  private final long stallMillis;
  private final Ticker ticker;
  private final Set<StreamSessionChannel> blocked = ConcurrentHashMap.newKeySet();

  public StreamWatchdog(long stallMillis, Ticker ticker) {
    if (stallMillis <= 0) {
      throw new IllegalArgumentException("stream-stall-timeout-ms: " + stallMillis + " (expected: > 0)");
    }
    this.stallMillis = stallMillis;
    this.ticker = ticker;
  }

  long stallMillis() {
    return stallMillis;
  }

  /** A channel's stream just became blocked; returns the time it did. */
  long blocked(StreamSessionChannel channel) {
    blocked.add(channel);
    return ticker.nanos();
  }

  /** A channel's stream takes replies again, or is closed. */
  void unblocked(StreamSessionChannel channel) {
    blocked.remove(channel);
  }

  /** Streams blocked now. */
  public int blockedStreams() {
    return blocked.size();
  }

  /**
   * Closes every stream blocked for at least the stall timeout.
   *
   * @return how many it closed
   */
  public int closeStalled() {
    long now = ticker.nanos();
    long limit = TimeUnit.MILLISECONDS.toNanos(stallMillis);
    int closed = 0;
    for (StreamSessionChannel channel : blocked) {
      if (channel.closeIfStalled(now, limit)) {
        blocked.remove(channel);
        closed++;
      }
    }
    return closed;
  }
}
