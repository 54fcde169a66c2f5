package io.gpumemd.it.hardening;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.Status;
import java.util.EnumMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A KeepAlive stream driven through the raw {@link ClientCall}, so that the caller decides when
 * (and whether) it reads: no message is requested until {@link #readToEnd} or {@link
 * #startReading}, so the replies stay in the transport, as a client that never reads leaves
 * them. gRPC then cannot hand over the stream's status either (it comes after the unread
 * replies), which is why {@link #readToEnd} reads everything first.
 *
 * <p>Thread-safety: {@link #send}, {@link #readToEnd}, {@link #startReading} and {@link #cancel}
 * from one thread (a ClientCall is not thread-safe); the counters and {@link #ready} from any.
 */
final class RawKeepAlive extends ClientCall.Listener<SessionEvent> {
  private final ClientCall<KeepAliveRequest, SessionEvent> call;
  private final Object readiness = new Object();
  private final CompletableFuture<Status> closed = new CompletableFuture<>();
  private final Map<SessionEvent.EventCase, AtomicLong> events = new EnumMap<>(SessionEvent.EventCase.class);
  private final AtomicLong readBeforeAsked = new AtomicLong();
  private volatile boolean reading;

  RawKeepAlive(Channel channel) {
    for (SessionEvent.EventCase c : SessionEvent.EventCase.values()) {
      events.put(c, new AtomicLong());
    }
    call = channel.newCall(AllocatorGrpc.getKeepAliveMethod(), CallOptions.DEFAULT);
    call.start(this, new Metadata());
    // Deliberately no call.request(n): nothing is read until the caller asks.
  }

  void send(KeepAliveRequest message) {
    call.sendMessage(message);
  }

  /** True when the transport takes another message without buffering it in this process. */
  boolean ready() {
    return call.isReady();
  }

  /** Waits up to {@code millis} for the transport to take messages again. */
  boolean awaitReady(long millis) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    synchronized (readiness) {
      while (!call.isReady() && !closed.isDone()) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return false;
        }
        TimeUnit.NANOSECONDS.timedWait(readiness, left);
      }
    }
    return call.isReady();
  }

  /** From now on every event is read as it comes (a client that behaves). */
  void startReading() {
    reading = true;
    call.request(Integer.MAX_VALUE);
  }

  /**
   * Reads every reply the daemon has queued, and then the stream's status, waiting up to
   * {@code millis} for it.
   *
   * @return the status the stream ended with, or null when it was still open after {@code millis}
   */
  Status readToEnd(long millis) throws InterruptedException {
    if (!reading) {
      startReading();
    }
    try {
      return closed.get(millis, TimeUnit.MILLISECONDS);
    } catch (TimeoutException e) {
      return null;
    } catch (ExecutionException e) {
      throw new IllegalStateException(e);
    }
  }

  /** The status, if the stream has ended and gRPC could hand it over. */
  Status closedWith() {
    return closed.getNow(null);
  }

  void cancel(String why) {
    call.cancel(why, null);
  }

  long events(SessionEvent.EventCase kind) {
    return events.get(kind).get();
  }

  long eventsRead() {
    return events.values().stream().mapToLong(AtomicLong::get).sum();
  }

  /** Events delivered before the caller asked to read: must be 0, or the client read after all. */
  long readBeforeAsked() {
    return readBeforeAsked.get();
  }

  @Override
  public void onMessage(SessionEvent event) {
    if (!reading) {
      readBeforeAsked.incrementAndGet();
    }
    events.get(event.getEventCase()).incrementAndGet();
  }

  @Override
  public void onReady() {
    synchronized (readiness) {
      readiness.notifyAll();
    }
  }

  @Override
  public void onClose(Status status, Metadata trailers) {
    closed.complete(status);
    synchronized (readiness) {
      readiness.notifyAll();
    }
  }
}
