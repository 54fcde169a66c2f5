package io.gpumemd.client;

import io.gpumemd.common.Ticker;
import io.gpumemd.proto.v1.OpenSessionRequest;
import java.nio.file.Path;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;

/**
 * A connection to gpumemd with one session, kept alive in the background for as long as the
 * client is open. Lease memory with {@link #lease}; close the client to release everything the
 * session still holds and unmap every segment.
 *
 * <pre>{@code
 * try (GpuMemClient client = GpuMemClient.connect("unix:///tmp/gpumemd.sock");
 *      Lease lease = client.lease(0, 64 << 20)) {
 *   ByteBuffer memory = lease.buffer();   // host devices; devicePointer() on CUDA devices
 * }
 * }</pre>
 *
 * <p>The session is held by a KeepAlive stream: if this process dies, the daemon takes back
 * its leases after a short grace period. If the stream breaks, the client reattaches within
 * the grace period. Segment mappings are cached per segment id and closed when the daemon
 * asks ({@code UnmapSegment}) or when the client closes.
 *
 * <p>The stream is also the lease path: a lease the daemon serves is one round trip on it (a
 * {@code StreamLease} answered by a {@code LeaseReply}), and a release is a notice the caller
 * never waits for. Closed leases go to the client cache tier ({@link ClientCache}) within the
 * allowance the daemon grants, and serve later leases without a round trip; the daemon hears
 * of both in batched notices, sent at most a millisecond after the fact (at once when a lease
 * goes out anyway, or when the daemon asks for cached blocks back). {@link Builder#unaryCalls}
 * or {@code keepAlive(false)} use the unary calls instead, and no client cache.
 *
 * <p>If the daemon restarts (or ends the session), the client sees its session lost: when the
 * daemon ends the stream, or when the stream stays broken past the grace period. It then logs a
 * warning, and everything of that session is dropped: its leases are dead ({@link Lease#close()}
 * does nothing, {@link Lease#buffer()} throws "session lost"), its mappings and client cache are
 * dropped (a restarted daemon reuses segment ids), its pending notices are never sent. The next
 * lease opens a new session, retrying with backoff (50 ms doubling to 2 s, for up to 10 s a
 * call), so that a long-running worker goes on across a restart; {@link #sessionId()} is the
 * current session's. A lease asked for while the stream is broken but the session not yet seen
 * lost waits (up to the grace period plus a second) for the stream to be confirmed again or for
 * the loss, rather than failing at once.
 *
 * <p>This class is the facade; the work is done in package-private classes of their own:
 * {@code SessionKeeper} (opening, reopening with backoff, the KeepAlive stream and its events,
 * per {@code Session}), {@code LeasePaths} (local, stream and unary leases and releases),
 * {@code Notices} (what the daemon is told without waiting), {@code ClientCache} (the cache
 * tier), {@code SharingCalls}, {@code SleepCalls} (sleep and wake), {@code AskedSleeps} (an admin's)
 * and {@code ClientClosing} (the ordered close). A {@link Lease} reaches its session only through the narrow
 * {@code Lease.Owner}.
 *
 * <p>Thread-safe: any thread may lease and close leases concurrently.
 */
public final class GpuMemClient implements AutoCloseable {
  private final Channels.Connection connection;
  private final FdChannelClient fdChannel;
  private final ClientCounters counters = new ClientCounters();
  private final SessionKeeper sessions;
  private final LeasePaths leases;
  private final SharingCalls sharing;
  private final SleepCalls sleeps;
  private final AskedSleeps asked;
  private final PendingReleases pendingReleases = new PendingReleases();
  private final ClientClosing closing;

  /** Builds a client; {@link #connect()} opens it. */
  public static final class Builder {
    private final String target;
    private String clientName = "pid-" + ProcessHandle.current().pid();
    private int ttlSeconds;
    private boolean keepAlive = true;
    private Consumer<Long> onShutdownNotice = drainMs -> { };
    private Long clientCacheBytes;
    private boolean unaryCalls;
    private Path caCert;
    private Path clientCert;
    private Path clientKey;
    private String bearerToken;
    private Ticker ticker = Ticker.system();
    private Sleeper sleeper = Sleeper.system();
    private long closeWaitMillis = PENDING_RELEASES_CLOSE_MS;

    private Builder(String target) {
      this.target = target;
    }

    /** Name shown by the daemon in logs and listings; selects per-client quotas. */
    public Builder clientName(String name) {
      this.clientName = name;
      return this;
    }

    /** Session TTL without keep-alive, in seconds (0 = the daemon's default). */
    public Builder ttlSeconds(int seconds) {
      this.ttlSeconds = seconds;
      return this;
    }

    /**
     * Whether to hold a KeepAlive stream (default true). Without it the session lives by its
     * TTL, refreshed by each call, and segments the daemon wants to free wait for it to end.
     */
    public Builder keepAlive(boolean keepAlive) {
      this.keepAlive = keepAlive;
      return this;
    }

    /**
     * Asks for at most this client cache allowance (0 turns the client cache tier off). By
     * default the client takes what the daemon grants. Closed leases stay mapped in the client,
     * within the allowance, and serve later leases that fit without a round trip.
     */
    public Builder clientCacheBytes(long bytes) {
      if (bytes < 0) {
        throw new IllegalArgumentException("clientCacheBytes: " + bytes + " (expected: >= 0)");
      }
      this.clientCacheBytes = bytes;
      return this;
    }

    /**
     * Uses the unary Lease and Release calls (two round trips a pair) instead of the session's
     * stream (one round trip a lease, releases not waited for). For comparison and for
     * daemons that predate the stream; default false.
     */
    public Builder unaryCalls(boolean unary) {
      this.unaryCalls = unary;
      return this;
    }

    /**
     * Connects over TLS (a {@code host:port} target only), trusting daemon certificates signed
     * by {@code caCert} (PEM). The certificate must name the target's host (a SAN).
     */
    public Builder tls(Path caCert) {
      this.caCert = Objects.requireNonNull(caCert, "caCert");
      this.clientCert = null;
      this.clientKey = null;
      return this;
    }

    /**
     * Mutual TLS: as {@link #tls(Path)}, presenting {@code clientCert} (PEM) with its PKCS#8
     * {@code clientKey}. The daemon names this client's tenant after the certificate's CN.
     */
    public Builder tls(Path caCert, Path clientCert, Path clientKey) {
      this.caCert = Objects.requireNonNull(caCert, "caCert");
      this.clientCert = Objects.requireNonNull(clientCert, "clientCert");
      this.clientKey = Objects.requireNonNull(clientKey, "clientKey");
      return this;
    }

    /**
     * Sends {@code authorization: Bearer <token>} on every call, the KeepAlive stream included:
     * the session then belongs to the token's tenant. Over TCP beyond loopback, use it with
     * {@link #tls} so that the token does not cross the network in clear text.
     */
    public Builder bearerToken(String token) {
      this.bearerToken = Objects.requireNonNull(token, "token");
      return this;
    }

    /** Called (on a transport thread) when the daemon announces its shutdown. */
    public Builder onShutdownNotice(Consumer<Long> callback) {
      this.onShutdownNotice = callback;
      return this;
    }

    /** Tests: the session's time source, and how it waits between attempts to reopen. */
    Builder ticker(Ticker ticker, Sleeper sleeper) {
      this.ticker = Objects.requireNonNull(ticker, "ticker");
      this.sleeper = Objects.requireNonNull(sleeper, "sleeper");
      return this;
    }

    /** Tests: how long {@link GpuMemClient#close()} waits for GPU work (default {@value GpuMemClient#PENDING_RELEASES_CLOSE_MS} ms). */
    Builder closeWaitMillis(long millis) {
      if (millis < 0) {
        throw new IllegalArgumentException("closeWaitMillis: " + millis + " (expected: >= 0)");
      }
      this.closeWaitMillis = millis;
      return this;
    }

    /**
     * Connects and opens the session.
     *
     * @throws GpuMemException when the daemon cannot be reached or refuses the session
     */
    public GpuMemClient connect() {
      return new GpuMemClient(this);
    }
  }

  public static Builder builder(String target) {
    return new Builder(target);
  }

  /** Connects to {@code unix:///path/to.sock} or {@code host:port} with default options. */
  public static GpuMemClient connect(String target) {
    return builder(target).connect();
  }

  private GpuMemClient(Builder b) {
    this.connection = Channels.open(b.target, new Channels.Security(b.caCert, b.clientCert, b.clientKey, b.bearerToken));
    OpenSessionRequest.Builder open = OpenSessionRequest.newBuilder()
        .setClientName(b.clientName).setTtlSeconds(b.ttlSeconds);
    if (b.clientCacheBytes != null) {
      open.setClientCacheBytes(b.clientCacheBytes);
    }
    boolean streamCalls = b.keepAlive && !b.unaryCalls;
    this.fdChannel = new FdChannelClient(b.target, FdChannelClient.DEFAULT_TIMEOUT_MS);
    this.sessions = new SessionKeeper(connection.moving(), open.build(), b.keepAlive, streamCalls, b.ticker, b.sleeper,
        b.onShutdownNotice, counters, fdChannel);
    this.leases = new LeasePaths(sessions, connection.channel(), streamCalls, counters, pendingReleases);
    this.sharing = new SharingCalls(sessions, leases, connection.channel(), streamCalls, b.ticker, b.sleeper);
    this.sleeps = new SleepCalls(sessions, connection.channel());
    this.asked = new AskedSleeps(sessions, sleeps);
    sessions.onSleepAsked(asked);
    try {
      sessions.start(session -> new LeaseOwner(session, leases, sharing));
    } catch (GpuMemException e) {
      fdChannel.close();
      connection.close();
      throw e;
    }
    this.closing = new ClientClosing(sessions, pendingReleases, fdChannel, connection, b.closeWaitMillis);
  }

  /** The current session id (a bearer credential: do not log it where others can read it). */
  public String sessionId() {
    return sessions.current().id;
  }

  public int ttlSeconds() {
    return sessions.current().ttlSeconds;
  }

  /** The underlying connection, for other services on the same channel (health, Admin). */
  public Channels.Connection connection() {
    return connection;
  }

  /**
   * The client's connection to the daemon's fd channel, where segments passed by descriptor are
   * fetched (host segments under {@code --host-segments fd}, CUDA VMM segments).
   */
  public FdChannelClient fdChannel() {
    return fdChannel;
  }

  /** Segments mapped in this process right now. */
  public int mappedSegments() {
    return sessions.current().mappings.size();
  }

  /** Mappings opened since connect; a pool hit on a mapped segment does not add one. */
  public long mapsOpened() {
    return sessions.mapsOpened();
  }

  /**
   * Stream-ordered releases ({@link CudaLeases#closeAfter}) still waiting for their GPU work;
   * they are sent as it completes.
   */
  public int pendingReleases() {
    return pendingReleases.pending();
  }

  /** What the cache tier and the lease path did since connect (cache figures: this session's). */
  public ClientStats stats() {
    ClientCache cache = sessions.current().cache;
    long daemonLeases = counters.daemonLeases.get();
    long releases = counters.releases.get();
    if (cache == null) {
      return new ClientStats(0, 0, daemonLeases, releases, 0, 0, 0);
    }
    return new ClientStats(cache.localHits(), cache.localReturns(), daemonLeases, releases,
        cache.cachedBytes(), cache.cachedBlocks(), cache.allowance());
  }

  /** KeepAlive messages the current session sent again after a broken stream (for tests). */
  long messagesResent() {
    return sessions.current().stream.resent();
  }

  /** Stream leases the current session asked for again because their reply was lost (for tests). */
  long leaseRepliesLost() {
    return sessions.current().stream.repliesLost();
  }

  /** The current session's client cache tier, or null: for tests that bend what it believes. */
  ClientCache cache() {
    return sessions.current().cache;
  }

  /**
   * True while the current session is lost (the daemon expired it, or restarted) and no new one
   * is open yet; the next lease opens one.
   */
  public boolean sessionLost() {
    return sessions.current().isLost();
  }

  // ---------------------------------------------------------------------------- leasing

  /** Leases {@code sizeBytes} on a device; contents unspecified. */
  public Lease lease(int device, long sizeBytes) {
    return lease(device, sizeBytes, false, "");
  }

  /**
   * Leases a block. When the daemon restarted (or ended the session), this opens a new session
   * first; leases of the old one are dead.
   *
   * @param zero zero the block before it is handed out
   * @param tag label shown in listings and leak warnings
   * @throws GpuMemException with the status code and the daemon's message
   */
  public Lease lease(int device, long sizeBytes, boolean zero, String tag) {
    return leases.lease(device, sizeBytes, zero, tag);
  }

  /**
   * Leases without blocking the caller; the future fails with {@link GpuMemException}. (When the
   * session was lost, opening the new one happens on the calling thread.)
   */
  public CompletableFuture<Lease> leaseAsync(int device, long sizeBytes, boolean zero, String tag) {
    return leases.leaseAsync(device, sizeBytes, zero, tag);
  }

  // ---------------------------------------------------------------------------- sharing

  /** Attaches to a shared block by token; see {@link #attach(String, String)}. */
  public Lease attach(String token) {
    return attach(token, "");
  }

  /**
   * Takes a hold on the block a share token names: a {@link Lease} of this client on the same
   * memory ({@link Lease#attached()} true), read-only when the token is. Closing it releases
   * the hold (never into the client cache); the block returns to the pool when its last hold is
   * gone. The same client attaching twice holds twice.
   *
   * @param tag label shown in listings
   * @throws GpuMemException NOT_FOUND for an unknown, expired, revoked or used-up token (or
   *     another tenant's); RESOURCE_EXHAUSTED at the daemon's {@code --max-holds-per-session}
   */
  public Lease attach(String token, String tag) {
    Objects.requireNonNull(token, "token");
    return sharing.attach(token, tag);
  }

  /** Publishes a lease, writable for those who look it up; see {@link #publish(Lease, String, boolean)}. */
  public Published publish(Lease lease, String name) {
    return publish(lease, name, false);
  }

  /**
   * Publishes a lease (or hold) of this client under a name unique within its tenant. The name
   * holds the block until it is unpublished ({@link Published#close()}, {@link #unpublish},
   * {@code gpumemctl objects rm}), even after the lease is closed or this process exits; the
   * lease itself is then released to the daemon on close, never cached.
   *
   * @param name 1 to 256 printable characters (no control, format or separator characters), no leading
   *     or trailing white space (e.g. {@code "llama-3-8b/layer-0"})
   * @param readOnly lookups get read-only holds
   * @throws GpuMemException ALREADY_EXISTS for a name the tenant has published; INVALID_ARGUMENT
   *     for a bad name; RESOURCE_EXHAUSTED past the daemon's {@code --max-published-bytes} or
   *     {@code --max-shares-per-tenant}
   */
  public Published publish(Lease lease, String name, boolean readOnly) {
    Objects.requireNonNull(name, "name");
    return lease.owner().publish(lease, name, readOnly);
  }

  /** Looks up a published object; see {@link #lookup(String, String)}. */
  public Lease lookup(String name) {
    return lookup(name, "");
  }

  /**
   * Takes a hold on the object published under {@code name} by this client's tenant: as
   * {@link #attach(String, String)} does for a token.
   *
   * @throws GpuMemException NOT_FOUND when no such object is published
   */
  public Lease lookup(String name, String tag) {
    Objects.requireNonNull(name, "name");
    return sharing.lookup(name, tag);
  }

  /**
   * Unpublishes a name of this client's tenant (whoever published it); holds taken by lookup
   * stay.
   *
   * @return true when the name was the block's last hold and it went back to the pool
   * @throws GpuMemException NOT_FOUND when no such object is published
   */
  public boolean unpublish(String name) {
    Objects.requireNonNull(name, "name");
    return sharing.unpublish(name);
  }

  // ---------------------------------------------------------------------------- sleep and wake

  /**
   * Puts the session's leases to sleep: their device memory is freed for others while they keep
   * their ids, tags, shares' tokens and, in this process, their addresses ({@link Lease#isAsleep}).
   * With {@code tags}, every lease in a segment that holds a lease of the session with one of
   * them (a client maps segments whole); else every lease. Cached blocks of the client cache are
   * given back first. Returns once the memory counts as free at the daemon. While asleep, a
   * lease is refused FAILED_PRECONDITION by the daemon; closing a sleeping lease releases it.
   *
   * <p><b>Pause your own work on the leases first:</b> touching a sleeping lease's memory
   * faults (host: SIGSEGV, which ends the JVM; CUDA: the kernel faults), until {@link #wake()}.
   *
   * @param level 1: the daemon keeps the contents in its host memory; 2: they are dropped (the
   *     wake gives zeros)
   * @throws GpuMemException nothing changed: FAILED_PRECONDITION for an attached lease, for a
   *     shared or published one that other sessions still hold after the daemon's {@code
   *     --unmap-wait-ms} (they are named), or for legacy CUDA IPC handles (the daemon needs {@code
   *     --cuda-handles vmm}); RESOURCE_EXHAUSTED past the daemon's {@code --offload-max-bytes}
   */
  public SleepResult sleep(int level, String... tags) {
    return sleeps.sleep(level, List.of(tags), 0);
  }

  /**
   * Wakes every sleeping lease of the session: each is mapped again at its old address, with
   * its old bytes (level 1) or zeros (level 2); a lease may be in another segment afterwards
   * ({@link Lease#segmentId()}).
   *
   * @throws GpuMemException RESOURCE_EXHAUSTED when the daemon cannot get the memory now (the
   *     session stays asleep; try again)
   */
  public WakeResult wake() {
    return sleeps.wake(0);
  }

  /** Lets an admin sleep and wake this session ({@code gpumemctl sleep}): see {@link SleepHandler}; null withdraws. */
  public void onSleepAsked(SleepHandler handler) {
    asked.register(handler);
  }

  /** Segments of the current session that sleep (0 when it is awake). */
  public int sleepingSegments() {
    return sessions.current().mappings.asleep();
  }

  // ---------------------------------------------------------------------------- closing

  /**
   * How long {@link #close()} waits for the GPU work that may still use the session's memory:
   * stream-ordered releases whose events have not completed, then the work queued in the
   * contexts of the devices mapped.
   */
  static final long PENDING_RELEASES_CLOSE_MS = 5000;

  /**
   * Closes the session (the daemon releases whatever it still holds), unmaps every segment and
   * closes the connection. Nothing of the session goes back to the daemon while this process's
   * GPU work may still use it, since the daemon leases a returned block to the next process at
   * once:
   *
   * <ol>
   *   <li>stream-ordered releases ({@link CudaLeases#closeAfter}) still waiting for their GPU
   *       work are waited for and sent as they complete; the events of those still pending at
   *       the bound are destroyed (destroying one does not wait for its work, hence:)
   *   <li>the primary context of every CUDA device the session maps is synchronized, so that
   *       the work queued on any of its blocks (closed after an event, or never closed) has
   *       completed; then CloseSession, then the segments are unmapped.
   * </ol>
   *
   * Both together wait up to {@value #PENDING_RELEASES_CLOSE_MS} ms. When the work is still
   * running then, the session is kept (its blocks leased) rather than handed back early: this
   * call returns, the client refuses calls, and a daemon thread ({@code gpumemd-client-linger})
   * keeps the KeepAlive stream and the mappings until the synchronize returns, then closes as
   * above. When the synchronize fails (a sticky context error: whether the work ran, or still
   * may, is unknown), the session is kept for the life of the process. Either way the process's
   * exit ends it: its GPU work ends with it, and the daemon takes the session back after its
   * grace period. (Without a KeepAlive stream the session's TTL ends it instead.) Both cases are
   * logged as a warning naming the devices.
   *
   * <p>Idempotent, also under concurrent calls: one caller closes, the others wait until it has
   * finished, so that every call returns with the client closed.
   */
  @Override
  public void close() {
    asked.close();
    closing.close();
  }

  /** The synchronize is given this long at least, even when the releases took the whole bound. */
  static final long MIN_SYNC_WAIT_MS = 100;
}
