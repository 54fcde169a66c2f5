package io.gpumemd.client;

import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.StreamRelease;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * What one session tells the daemon without waiting for an answer, batched: the client cache's
 * moves (a lease kept, or handed out again), releases, and the cache's counters.
 *
 * <p>A close costs a map update, not a message: notices go with the next outgoing lease, or
 * with a flush at most a millisecond later; many pending notices are sent at once. Cache
 * notices are kept as each lease's net move since the last send (a close into the cache and a
 * reuse cancel out), so a worker that leases and closes locally sends nothing at all; releases
 * go in order. A release supersedes a pending cache notice of the same lease: the daemon
 * releases a lease in either state.
 *
 * <p>Thread-safety: the pending notices are guarded by this object's own lock, taken last (after
 * the stream's lock and the client cache's). They are drained and sent in one step under the
 * stream's lock ({@link SessionStream#send}), so that two senders never reorder them. Once
 * discarded (the session is lost), nothing more is recorded or sent.
 *
 * <p>A message handed to gRPC as the connection dies is lost without an error: {@link
 * SessionStream} sends again, on the next stream, exactly the messages the daemon did not apply.
 */
final class Notices implements ClientCache.Listener {
  /** Notices per message, far below gRPC's 4 MiB message limit. */
  static final int NOTICES_PER_MESSAGE = 4096;
  /** Pending notices at which the caller sends them itself instead of waiting for the flush. */
  static final int FLUSH_AT = 1024;

  private final SessionStream stream;
  /** Null when the session has no client cache: no cache notices, no counters. */
  private final ClientCache cache;
  private final ScheduledExecutorService flusher;
  private final Object lock = new Object();
  private final LinkedHashMap<String, Boolean> cacheNotices = new LinkedHashMap<>();
  private final ArrayList<String> releases = new ArrayList<>();
  private boolean discarded;
  /** Pending notices reached {@link #FLUSH_AT}; written under the lock, read without it. */
  private volatile boolean full;
  private final AtomicBoolean flushScheduled = new AtomicBoolean();
  /** {@link ClientCache#countersVersion()} as last sent; written under the stream's lock. */
  private volatile long countersVersionSent;

  Notices(SessionStream stream, ClientCache cache, ScheduledExecutorService flusher) {
    this.stream = stream;
    this.cache = cache;
    this.flusher = flusher;
  }

  /**
   * Records that the client cache kept a lease or handed it out again (called under the
   * cache's lock); a pending opposite move of the same lease cancels out. The caller then
   * calls {@link #afterRecord()}, outside the cache's lock.
   */
  @Override
  public void moved(String leaseId, boolean reused) {
    synchronized (lock) {
      if (discarded) {
        return;
      }
      if (cacheNotices.remove(leaseId) == null) {
        cacheNotices.put(leaseId, reused);
      }
      noteFull();
    }
  }

  /** Queues the release of a lease the cache removed to make room (called under the cache's lock). */
  @Override
  public void evicted(String leaseId) {
    release(leaseId);
  }

  /**
   * Queues a release notice (none once the session is lost: the daemon that granted the lease
   * is gone); the caller then calls {@link #afterRecord()}.
   */
  void release(String leaseId) {
    synchronized (lock) {
      if (discarded) {
        return;
      }
      cacheNotices.remove(leaseId);
      releases.add(leaseId);
      noteFull();
    }
  }

  /** Drops every pending notice and records nothing more: the session is lost. */
  void discard() {
    synchronized (lock) {
      discarded = true;
      cacheNotices.clear();
      releases.clear();
      full = false;
    }
  }

  /** After a notice was recorded: sends now when many are pending, else within a millisecond. */
  void afterRecord() {
    if (full) {
      flush();
    } else if (flushScheduled.compareAndSet(false, true)) {
      try {
        flusher.schedule(this::flush, 1, TimeUnit.MILLISECONDS);
      } catch (RejectedExecutionException e) {
        flushScheduled.set(false); // closing: CloseSession takes everything back
      }
    }
  }

  /** Sends what is pending (notices, and the cache's counters if they changed), if anything. */
  void flush() {
    flushScheduled.set(false);
    boolean any;
    synchronized (lock) {
      any = pending() > 0;
    }
    // Outside the lock: the cache's lock is taken before it elsewhere.
    if (any || countersChanged()) {
      send(KeepAliveRequest.newBuilder());
    }
  }

  /**
   * Sends the pending notices and then {@code message} (which may carry a lease) on the stream,
   * with the cache counters if they changed; notices beyond one message's share go in messages
   * of their own, first.
   *
   * @return false when no stream is attached (the notices stay pending for the next one)
   */
  boolean send(KeepAliveRequest.Builder message) {
    return stream.send(() -> compose(message));
  }

  /**
   * Sends what is pending (releases, cache notices, counters) and ends the stream, waiting up
   * to {@code waitMillis} for the daemon to end its side: it has then applied all of it.
   */
  void finishStream(long waitMillis) {
    stream.finish(() -> compose(KeepAliveRequest.newBuilder()), waitMillis);
  }

  /** The messages that carry the pending notices, then {@code message}; called under the stream's lock. */
  private List<KeepAliveRequest> compose(KeepAliveRequest.Builder message) {
    List<KeepAliveRequest.Builder> messages = new ArrayList<>(1);
    messages.add(KeepAliveRequest.newBuilder());
    synchronized (lock) {
      int n = 0;
      for (Map.Entry<String, Boolean> notice : cacheNotices.entrySet()) {
        messageFor(messages, n++).addCacheNotices(
            CacheNotice.newBuilder().setLeaseId(notice.getKey()).setReused(notice.getValue()));
      }
      for (String leaseId : releases) {
        messageFor(messages, n++).addReleases(StreamRelease.newBuilder().setLeaseId(leaseId));
      }
      cacheNotices.clear();
      releases.clear();
      noteFull();
    }
    KeepAliveRequest.Builder last = messages.get(messages.size() - 1).mergeFrom(message.build());
    // Cumulative counters, only after they changed (the daemon takes the difference).
    if (countersChanged()) {
      long version = cache.countersVersion();
      cache.counters().forEach((device, c) ->
          last.addClientCounters(ClientCacheCounters.newBuilder().setDevice(device).setHits(c[0]).setReturns(c[1])));
      countersVersionSent = version;
    }
    List<KeepAliveRequest> built = new ArrayList<>(messages.size());
    messages.forEach(m -> built.add(m.build()));
    return built;
  }

  private boolean countersChanged() {
    return cache != null && cache.countersVersion() != countersVersionSent;
  }

  /** Sets {@link #full}; a volatile write only when it changes, which is rare (the hot path writes none). */
  private void noteFull() {
    boolean now = pending() >= FLUSH_AT;
    if (now != full) {
      full = now;
    }
  }

  private int pending() {
    assert Thread.holdsLock(lock);
    return cacheNotices.size() + releases.size();
  }

  /** The message the {@code n}-th notice goes in: a new one every {@link #NOTICES_PER_MESSAGE}. */
  private static KeepAliveRequest.Builder messageFor(List<KeepAliveRequest.Builder> messages, int n) {
    if (n > 0 && n % NOTICES_PER_MESSAGE == 0) {
      messages.add(KeepAliveRequest.newBuilder());
    }
    return messages.get(messages.size() - 1);
  }
}
