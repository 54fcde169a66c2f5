package io.gpumemd.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * Calls a unary method again when the daemon answered that it is handing over to its successor
 * ({@code gpumemd --take-over}): UNAVAILABLE with the trailer {@code gpumemd-moving: 1} means
 * the call was not served, and the successor behind the same address will serve it. Retries
 * wait {@value #MIN_BACKOFF_MS} ms doubling to {@value #MAX_BACKOFF_MS} ms, for at most {@value
 * #BOUND_MS} ms from the first attempt (and never past the call's deadline), except that the
 * first goes at once when the answer says the successor serves already ({@code gpumemd-moved:
 * 1}: the call waited for the hand-over's end at the old daemon); then the last
 * answer goes to the caller, as without this interceptor. Any other status, a draining daemon's
 * UNAVAILABLE included, goes to the caller at once. Streams are not retried here (the KeepAlive
 * stream reattaches itself, {@link SessionKeeper}).
 *
 * <p>Installed on every channel {@link Channels} opens, outermost, so each attempt passes the
 * other interceptors (the bearer token) again. Thread-safe: a call's state is guarded by its
 * own monitor; a retry starts on a delayed executor thread (at once: on the thread of the
 * answer).
 */
final class MovingRetry implements ClientInterceptor {
  /** The trailer a daemon that is moving sets on the calls it did not serve. */
  static final Metadata.Key<String> MOVING = Metadata.Key.of("gpumemd-moving", Metadata.ASCII_STRING_MARSHALLER);
  /**
   * Set beside {@link #MOVING} once the successor serves (a daemon answering the calls it held
   * through its hand-over, or refusing one after it): the next attempt goes at once.
   */
  static final Metadata.Key<String> MOVED = Metadata.Key.of("gpumemd-moved", Metadata.ASCII_STRING_MARSHALLER);
  // A hand-over refuses calls for about a tenth of a second: retry often, and the successor
  // serves the call soon after it starts.
  static final long MIN_BACKOFF_MS = 10;
  static final long MAX_BACKOFF_MS = 100;
  static final long BOUND_MS = 30_000;

  /** Whether a call that ended with {@code status} and {@code trailers} was refused because the daemon is moving. */
  static boolean isMoving(Status status, Metadata trailers) {
    return status.getCode() == Status.Code.UNAVAILABLE && trailers != null && "1".equals(trailers.get(MOVING));
  }

  /**
   * The wait before retry {@code n} of a call refused with {@code trailers}: none for the first
   * once the successor serves ({@link #MOVED}), else {@link #backoffMillis}. Only the first: a
   * channel still on the old daemon's connection would be refused again at once, and spin.
   */
  static long waitMillis(Metadata trailers, int n) {
    return n == 1 && trailers != null && "1".equals(trailers.get(MOVED)) ? 0 : backoffMillis(n);
  }

  /** The wait before retry {@code n} (1 for the first). */
  static long backoffMillis(int n) {
    long wait = MIN_BACKOFF_MS;
    for (int i = 1; i < n && wait < MAX_BACKOFF_MS; i++) {
      wait *= 2;
    }
    return Math.min(wait, MAX_BACKOFF_MS);
  }

  /**
   * Whether to retry after {@code retries} retries, {@code elapsedMillis} after the first
   * attempt began, a call that ended with {@code status} and {@code trailers}.
   */
  static boolean retries(Status status, Metadata trailers, int retries, long elapsedMillis) {
    return isMoving(status, trailers) && elapsedMillis + backoffMillis(retries + 1) <= BOUND_MS;
  }

  @Override
  public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
    if (method.getType() != MethodDescriptor.MethodType.UNARY) {
      return next.newCall(method, options);
    }
    return new RetryingCall<>(method, options, next);
  }

  /** One unary call: what the caller sent is kept, to send it again on a new attempt. */
  private static final class RetryingCall<Q, R> extends ClientCall<Q, R> {
    private final MethodDescriptor<Q, R> method;
    private final CallOptions options;
    private final Channel next;
    private final long startNanos = System.nanoTime();
    // Guarded by this.
    private Listener<R> listener;
    private Metadata headers;
    private ClientCall<Q, R> attempt;
    private Q message;
    private boolean halfClosed;
    private int requested;
    private int retries;
    private boolean cancelled;
    /** An attempt was refused and the next is not started yet: a cancel closes the call itself. */
    private boolean waiting;

    RetryingCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      this.method = method;
      this.options = options;
      this.next = next;
    }

    @Override
    public void start(Listener<R> listener, Metadata headers) {
      ClientCall<Q, R> call;
      synchronized (this) {
        this.listener = listener;
        this.headers = copy(headers); // the next interceptors add to theirs
        call = attempt = next.newCall(method, options);
      }
      call.start(new AttemptListener(call), headers);
    }

    @Override
    public void request(int n) {
      ClientCall<Q, R> call;
      synchronized (this) {
        requested += n;
        call = attempt;
      }
      call.request(n);
    }

    @Override
    public void sendMessage(Q m) {
      ClientCall<Q, R> call;
      synchronized (this) {
        message = m;
        call = attempt;
      }
      call.sendMessage(m);
    }

    @Override
    public void halfClose() {
      ClientCall<Q, R> call;
      synchronized (this) {
        halfClosed = true;
        call = attempt;
      }
      call.halfClose();
    }

    @Override
    public void cancel(String why, Throwable cause) {
      ClientCall<Q, R> call;
      boolean between;
      synchronized (this) {
        if (cancelled) {
          return;
        }
        cancelled = true;
        call = attempt;
        between = waiting;
      }
      if (between) {
        // No attempt runs to report the cancel: the caller is told here, once.
        Status status = Status.CANCELLED.withDescription(why);
        listener.onClose(cause == null ? status : status.withCause(cause), new Metadata());
      } else if (call != null) {
        call.cancel(why, cause);
      }
    }

    @Override
    public synchronized boolean isReady() {
      return attempt != null && attempt.isReady();
    }

    @Override
    public void setMessageCompression(boolean enabled) {
      ClientCall<Q, R> call;
      synchronized (this) {
        call = attempt;
      }
      call.setMessageCompression(enabled);
    }

    /** Starts the next attempt with what the caller sent so far (a delayed executor thread, or the last attempt's). */
    private void retry() {
      ClientCall<Q, R> call;
      Metadata h;
      Q m;
      boolean close;
      int n;
      synchronized (this) {
        waiting = false;
        if (cancelled) {
          return; // cancel told the caller
        }
        call = attempt = next.newCall(method, options);
        h = copy(headers);
        m = message;
        close = halfClosed;
        n = requested;
      }
      call.start(new AttemptListener(call), h);
      if (n > 0) {
        call.request(n);
      }
      if (m != null) {
        call.sendMessage(m);
      }
      if (close) {
        call.halfClose();
      }
    }

    private static Metadata copy(Metadata headers) {
      Metadata copy = new Metadata();
      copy.merge(headers);
      return copy;
    }

    /** The listener of one attempt: passes everything on, except a moving refusal that is retried. */
    private final class AttemptListener extends ClientCall.Listener<R> {
      private final ClientCall<Q, R> call;

      AttemptListener(ClientCall<Q, R> call) {
        this.call = call;
      }

      private Listener<R> caller() {
        synchronized (RetryingCall.this) {
          return listener;
        }
      }

      @Override
      public void onHeaders(Metadata h) {
        caller().onHeaders(h);
      }

      @Override
      public void onMessage(R m) {
        caller().onMessage(m);
      }

      @Override
      public void onReady() {
        caller().onReady();
      }

      @Override
      public void onClose(Status status, Metadata trailers) {
        long wait = -1;
        synchronized (RetryingCall.this) {
          long elapsed = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - startNanos);
          if (!cancelled && attempt == call && retries(status, trailers, retries, elapsed)) {
            wait = waitMillis(trailers, ++retries);
            waiting = true;
          }
        }
        if (wait == 0) {
          retry(); // the successor serves: here, with no thread hop either
          return;
        }
        if (wait > 0) {
          CompletableFuture.runAsync(RetryingCall.this::retry,
              CompletableFuture.delayedExecutor(wait, TimeUnit.MILLISECONDS));
          return;
        }
        caller().onClose(status, trailers);
      }
    }
  }
}
