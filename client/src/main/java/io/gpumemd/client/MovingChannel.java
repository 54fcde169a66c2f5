package io.gpumemd.client;

import io.gpumemd.common.unix.UnixSockets;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptors;
import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;
import io.grpc.MethodDescriptor;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

/**
 * The client's channel to its daemon across take-overs: a channel to the target for the
 * client's life ({@link #primary}), and, while a successor ({@code gpumemd --take-over}) takes
 * the session over, one to the Unix socket the successor listens on until it serves on the
 * target's path (the daemon names it in a {@code SuccessorNotice}, at the successor's Hello).
 * That one connects while the old daemon still serves ({@link #successorAt}), so that at the
 * MovingNotice the session reattaches over a connection already made ({@link #moveToSuccessor})
 * instead of opening one inside the pause (a new connection's accept took 12 ms of it on two
 * busy cores). New calls go there only until the primary channel, reconnecting to the target
 * (the successor's by then), is ready again (its READY before that may still be its connection to
 * the daemon that moved, whose GOAWAY can come after the notice); the spare is then shut down gracefully, so that
 * the KeepAlive stream opened on it carries on until it ends. Without a spare, or one that did
 * not connect, the move is the primary channel's reconnect, as before.
 *
 * <p>Every call passes {@link MovingRetry} here, above both channels, so that a call the old
 * daemon refused as moving is tried again on whichever channel serves by then.
 *
 * <p>Thread-safe: {@link #successorAt} runs on a transport thread, {@link #moveToSuccessor} on
 * another, calls on any; the spare is handed over under a lock, the channel in use is volatile.
 */
final class MovingChannel extends ManagedChannel {
  private final ManagedChannel primary;
  /** Builds a channel to a Unix socket with the primary's settings; null for a TCP target. */
  private final Function<Path, ManagedChannel> spareTo;
  /** The directory of the target's Unix socket, where a successor's socket is looked for. */
  private final Path directory;
  /** {@link MovingRetry} over {@link #route}. */
  private final Channel calls;
  private final Object lock = new Object();
  /** Connected, or connecting, to the announced successor, and not used yet; guarded by lock. */
  private ManagedChannel spare;
  private boolean shutdown; // guarded by lock
  /** The spare in use since the move, until the primary channel is ready again. */
  private volatile ManagedChannel moved;
  /**
   * Whether the primary channel reconnected since the last move: until then its READY may still
   * be its connection to the daemon that moved, which refuses new streams.
   */
  private volatile boolean primaryBack = true;
  /** A move to the spare waits for the stream's attach to reconnect the primary ({@link #attached}). */
  private volatile boolean reconnectPending;

  /**
   * @param socket the target's Unix socket, or null for a TCP target (no spare then)
   * @param spareTo builds a channel to a Unix socket with the primary's settings
   */
  MovingChannel(ManagedChannel primary, Path socket, Function<Path, ManagedChannel> spareTo) {
    this.primary = primary;
    this.directory = socket == null ? null : socket.toAbsolutePath().getParent();
    this.spareTo = socket == null ? null : spareTo;
    Channel route = new Channel() {
      @Override
      public <Q, R> ClientCall<Q, R> newCall(MethodDescriptor<Q, R> method, CallOptions options) {
        return serving().newCall(method, options);
      }

      @Override
      public String authority() {
        return primary.authority();
      }
    };
    this.calls = ClientInterceptors.intercept(route, new MovingRetry());
  }

  /**
   * The channel new calls go to: the spare in use since a move while it is ready and the primary
   * is not (yet); else the primary, and a spare no longer needed is shut down gracefully.
   */
  private ManagedChannel serving() {
    ManagedChannel m = moved;
    if (m == null) {
      return primary;
    }
    if (m.getState(false) == ConnectivityState.READY && !primaryBack) {
      return m;
    }
    synchronized (lock) {
      if (moved == m) {
        moved = null;
        m.shutdown(); // graceful: the KeepAlive stream opened on it goes on until it ends
      }
    }
    return primary;
  }

  /**
   * A successor listens on {@code socketName}, beside the target's socket, until it serves
   * there: connect to it now (a TCP target, or a name that is not a plain file name, is ignored).
   * A spare connected to an earlier successor that never took over is dropped, and so is the
   * spare when the name is empty (the successor went away: its connection would retry a socket
   * that is gone).
   */
  void successorAt(String socketName) {
    boolean gone = socketName.isEmpty();
    if (spareTo == null || !(gone || UnixSockets.isSocketFileName(socketName))) {
      return;
    }
    ManagedChannel next = null;
    ManagedChannel old;
    synchronized (lock) {
      if (shutdown) {
        return;
      }
      if (!gone) {
        next = spareTo.apply(directory.resolve(socketName));
      }
      old = spare;
      spare = next;
    }
    if (old != null) {
      old.shutdownNow();
    }
    if (next != null) {
      next.getState(true);
    }
  }

  /**
   * The daemon said the session moved (MovingNotice), while the old stream's end is still being
   * handled: new calls go over the spare when it is connected, and the primary reconnects once
   * the stream attached there ({@link #attached}); without a spare, the primary drops its
   * connection to the daemon that moved and opens one to the target (its successor's now) at
   * once. Either way the reattach does not wait for the old daemon's GOAWAY (its notice comes
   * first, and a stream opened on the old connection is refused). Calls still running on the old
   * connection finish there. {@code enterIdle} is marked experimental in grpc-java (its issue
   * 4359).
   *
   * @return true when the spare serves
   */
  boolean moveToSuccessor() {
    ManagedChannel s;
    ManagedChannel before = null;
    boolean useSpare;
    synchronized (lock) {
      s = spare;
      spare = null;
      useSpare = s != null && !shutdown && s.getState(false) == ConnectivityState.READY;
      if (useSpare) {
        before = moved;
        moved = s;
        primaryBack = false;
      }
    }
    if (s != null && !useSpare) {
      s.shutdownNow(); // not connected: the primary's reconnect serves
    }
    if (before != null) {
      before.shutdown();
    }
    if (useSpare) {
      reconnectPending = true; // at the attach: see attached()
    } else {
      reconnectPrimary();
    }
    return useSpare;
  }

  /**
   * The session's stream attached. After a move to the spare, the primary channel now drops its
   * connection to the daemon that moved and opens one to the target (its successor's by now):
   * not before, since the client's one event loop would make that connection while the stream's
   * attach waits behind it. Else nothing.
   */
  void attached() {
    if (reconnectPending) {
      reconnectPending = false;
      reconnectPrimary();
    }
  }

  /** The primary channel drops its connection and opens one to the target. */
  private void reconnectPrimary() {
    primary.enterIdle();
    awaitPrimary(primary.getState(true));
  }

  /** Marks the primary back once it is READY again after {@link #reconnectPrimary}. */
  private void awaitPrimary(ConnectivityState seen) {
    if (seen == ConnectivityState.READY) {
      primaryBack = true;
    } else if (seen != ConnectivityState.SHUTDOWN) {
      primary.notifyWhenStateChanged(seen, () -> awaitPrimary(primary.getState(false)));
    }
  }

  @Override
  public <Q, R> ClientCall<Q, R> newCall(MethodDescriptor<Q, R> method, CallOptions options) {
    return calls.newCall(method, options);
  }

  @Override
  public String authority() {
    return primary.authority();
  }

  @Override
  public ConnectivityState getState(boolean requestConnection) {
    return primary.getState(requestConnection);
  }

  @Override
  public void notifyWhenStateChanged(ConnectivityState source, Runnable callback) {
    primary.notifyWhenStateChanged(source, callback);
  }

  @Override
  public void resetConnectBackoff() {
    primary.resetConnectBackoff();
  }

  @Override
  public void enterIdle() {
    primary.enterIdle();
  }

  /** Every channel this one has, the primary first; under the lock. */
  private List<ManagedChannel> all() {
    List<ManagedChannel> all = new ArrayList<>(3);
    all.add(primary);
    if (spare != null) {
      all.add(spare);
    }
    ManagedChannel m = moved;
    if (m != null) {
      all.add(m);
    }
    return all;
  }

  @Override
  public ManagedChannel shutdown() {
    synchronized (lock) {
      shutdown = true;
      all().forEach(ManagedChannel::shutdown);
    }
    return this;
  }

  @Override
  public ManagedChannel shutdownNow() {
    synchronized (lock) {
      shutdown = true;
      all().forEach(ManagedChannel::shutdownNow);
    }
    return this;
  }

  @Override
  public boolean isShutdown() {
    return primary.isShutdown();
  }

  @Override
  public boolean isTerminated() {
    synchronized (lock) {
      return all().stream().allMatch(ManagedChannel::isTerminated);
    }
  }

  @Override
  public boolean awaitTermination(long timeout, TimeUnit unit) throws InterruptedException {
    long deadline = System.nanoTime() + unit.toNanos(timeout);
    List<ManagedChannel> all;
    synchronized (lock) {
      all = all();
    }
    for (ManagedChannel c : all) {
      if (!c.awaitTermination(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS)) {
        return false;
      }
    }
    return true;
  }
}
