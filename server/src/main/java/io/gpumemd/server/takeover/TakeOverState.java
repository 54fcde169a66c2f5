package io.gpumemd.server.takeover;

import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.SegmentsAhead;
import io.gpumemd.proto.takeover.v1.SessionsState;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.DeviceInfo;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.fd.DescriptorPins;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.pool.IncomingSegments;
import io.gpumemd.server.pool.PoolSnapshot;
import io.gpumemd.server.pool.SegmentAhead;
import io.gpumemd.server.pool.SegmentFdSink;
import io.gpumemd.server.pool.SnapshotRefusedException;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionsSnapshot;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.IntConsumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Between the daemon and the take-over protocol: what the successor says of itself ({@link
 * #request}), whether the running daemon's state fits it ({@link #refusal}), the state out of
 * the pools and the registry (their snapshots, {@link Books}: {@link #write}; put on the wire by
 * {@link PoolStates} and {@link SessionsStates}, or as the changes since an earlier writing by
 * {@link StateChanges}) and back into the successor's new ones ({@link #restorePools}, {@link
 * #restoreSessions}). Stateless.
 */
public final class TakeOverState {
  private static final Logger log = LoggerFactory.getLogger(TakeOverState.class);

  /**
   * Set to "false", a successor asks as one of an earlier version does, without taking segments
   * ahead of the state ({@code Hello.takes_segments_ahead}): what tests use that stop a successor
   * between its Hello and the state, where segments ahead would put an exchange.
   */
  public static final String SEGMENTS_AHEAD_PROPERTY = "gpumemd.takeOver.segmentsAhead";

  /**
   * Set to "false", a successor asks without the books sent ahead ({@code Hello.takes_state_ahead}):
   * the whole state comes inside the pause, as from a running daemon of an earlier version.
   */
  public static final String STATE_AHEAD_PROPERTY = "gpumemd.takeOver.stateAhead";

  private TakeOverState() {}

  /**
   * A daemon as the running daemon that {@link HandOver} hands over to a successor: the refusal
   * rules and the export below, over its backend, pools and registry.
   *
   * @param handedOver stops the daemon for good once a successor took its state (the pid)
   * @param rehearsal what {@link #rehearse} runs
   */
  public record RunningDaemon(MemoryBackend backend, DevicePools pools, SessionRegistry registry, DescriptorPins pins,
      IntConsumer handedOver, Runnable rehearsal) implements HandOver.Daemon {
    @Override
    public String refusal(Hello hello) {
      return TakeOverState.refusal(hello, backend, pools, registry);
    }

    @Override
    public List<SegmentAhead> segmentsAhead() {
      return pools.segmentsAhead();
    }

    @Override
    public Books write(OutgoingDescriptors descriptors) throws TakeOverRefusedException {
      return TakeOverState.write(pools, registry, descriptors);
    }

    @Override
    public List<Long> hiddenProcesses(OutgoingDescriptors descriptors) throws TakeOverRefusedException {
      return TakeOverState.hiddenProcesses(pins, descriptors);
    }

    @Override
    public void handedOver(int successorPid) {
      handedOver.accept(successorPid);
    }

    @Override
    public void rehearse() {
      rehearsal.run();
    }

    @Override
    public void successorAt(String socketName) {
      int told = registry.successorAt(socketName);
      log.debug("Told {} session(s) that the successor listens on {} until it serves", told, socketName);
    }

    @Override
    public void successorGone() {
      int told = registry.successorAt("");
      log.debug("Told {} session(s) that the successor went away", told);
    }
  }

  /** How a backend hands segments to clients, which a successor must match. */
  static String handles(MemoryBackend backend) {
    return backend.name() + (backend.passesDescriptors() ? "/descriptors" : "/handles");
  }

  /**
   * Asks the running daemon for its state (this daemon's backend can hold one: checked before).
   *
   * @param servingAt where this daemon's gRPC server listens until it serves on the running
   *     daemon's socket (the running daemon tells its clients), or null for no Unix socket
   * @return the state, or null to start fresh
   */
  public static TakeOver request(ServerConfig config, MemoryBackend backend, String version, Path servingAt)
      throws IOException {
    Hello.Builder hello = Hello.newBuilder().setVersion(version).setBackend(backend.name())
        .setPid((int) ProcessHandle.current().pid()).setHandles(handles(backend));
    if (servingAt != null) {
      hello.setServingAt(servingAt.getFileName().toString());
    }
    for (DeviceInfo device : backend.devices()) {
      hello.addLimitBytes(config.pool().deviceLimit(device.capacityBytes()));
      hello.addDeviceUuids(device.uuid());
    }
    boolean segmentsAhead = !"false".equals(System.getProperty(SEGMENTS_AHEAD_PROPERTY));
    hello.setTakesSegmentsAhead(segmentsAhead)
        .setTakesStateAhead(segmentsAhead && !"false".equals(System.getProperty(STATE_AHEAD_PROPERTY)));
    return TakeOver.request(config.takeOver().socket(), hello.build(), backend);
  }

  /** Null when a successor that says {@code hello} can hold this daemon's state; else why not. */
  public static String refusal(Hello hello, MemoryBackend backend, DevicePools pools, SessionRegistry registry) {
    if (!hello.getBackend().equals(backend.name())) {
      return "the successor runs the " + hello.getBackend() + " backend and this daemon the " + backend.name()
          + " backend (start it with --backend " + backend.name() + ")";
    }
    String own = backend.takeOverRefusal();
    if (own != null) {
      return own;
    }
    if (!hello.getHandles().equals(handles(backend))) {
      return "the successor hands segments out as " + hello.getHandles() + " and this daemon as " + handles(backend)
          + " (give it the same --host-segments / --cuda-handles)";
    }
    if (hello.getLimitBytesCount() != pools.size()) {
      return "the successor serves " + hello.getLimitBytesCount() + " device(s) and this daemon " + pools.size();
    }
    if (backend.devicesMatchByUuid()) {
      String mismatch = deviceMismatch(backend.devices(), hello.getDeviceUuidsList());
      if (mismatch != null) {
        return mismatch;
      }
    }
    if (registry.draining()) {
      return "this daemon is shutting down";
    }
    String sleeping = sleepingRefusal(registry);
    if (sleeping == null) {
      sleeping = parkedRefusal(registry);
    }
    return sleeping != null ? sleeping : pools.restoreRefusal(hello.getLimitBytesList());
  }

  /**
   * Why the state cannot be handed over while sessions sleep, or null: their contents are in
   * this process's host memory (pinned, on CUDA), which cannot pass to another process, and a
   * successor that re-read gigabytes would stretch the pause the take-over is there to keep short.
   */
  static String sleepingRefusal(SessionRegistry registry) {
    List<String> sleeping = new ArrayList<>();
    for (Session session : registry.sessions(Caller.DAEMON)) {
      if (session.sleepFigures()[0] > 0) {
        sleeping.add(session.toString());
      }
    }
    return sleeping.isEmpty() ? null : sleeping.size() + " session(s) sleep (" + String.join(", ", sleeping)
        + "): wake them (Allocator.Wake, or gpumemctl sleep/wake) before a take-over";
  }

  /**
   * Why the state cannot be handed over while published objects are parked, or null: their
   * contents are in this process's host memory, as a sleeping session's are.
   */
  static String parkedRefusal(SessionRegistry registry) {
    List<String> parked = registry.sharing().parkedObjects();
    return parked.isEmpty() ? null : parked.size() + " published object(s) parked (" + String.join(", ", parked)
        + "): look them up (which restores them) or remove them (gpumemctl objects rm) before a take-over";
  }

  /**
   * Why a successor whose devices are {@code successorUuids} (by ordinal) cannot take over these
   * devices, or null when its device n is this daemon's device n, UUID for UUID. Memory of one
   * GPU is never adopted as another's: a successor that sees the same GPUs in another order is
   * refused too (sessions, leases and segment ids name devices by ordinal, and clients mapped
   * them by the UUID they were told at OpenSession).
   */
  static String deviceMismatch(List<DeviceInfo> own, List<String> successorUuids) {
    if (successorUuids.size() != own.size()) {
      return "the successor names " + successorUuids.size() + " device UUID(s) for " + own.size() + " device(s) "
          + "(expected: one per device, as every gpumemd of this version sends)";
    }
    for (DeviceInfo d : own) {
      String theirs = successorUuids.get(d.ordinal());
      if (!d.uuid().equalsIgnoreCase(theirs)) {
        int at = -1;
        for (int i = 0; i < successorUuids.size(); i++) {
          if (d.uuid().equalsIgnoreCase(successorUuids.get(i))) {
            at = i;
          }
        }
        return "device " + d.ordinal() + " is " + d.uuid() + " here and " + theirs + " in the successor ("
            + (at < 0 ? "which does not see " + d.uuid() + " at all" : "which sees " + d.uuid() + " as its device " + at)
            + "): a successor must see the same GPUs in the same order (start it with this daemon's "
            + "CUDA_VISIBLE_DEVICES), else one GPU's memory would be served as another's";
      }
    }
    return null;
  }

  /** The frame that names {@code ahead}, in order: what the successor adopts them by. */
  static SegmentsAhead aheadFrame(List<SegmentAhead> ahead) {
    SegmentsAhead.Builder frame = SegmentsAhead.newBuilder();
    for (SegmentAhead a : ahead) {
      frame.addSegments(SegmentsAhead.Entry.newBuilder().setDevice(a.device()).setId(a.id()).setBytes(a.bytes()));
    }
    return frame.build();
  }

  /**
   * The books as one writing put them down: every pool's snapshot and the session layer's, its
   * ages counted back from {@code writtenAtNanos} (the running daemon's clock; 0 once read off the
   * wire, where only the ages travel).
   */
  public record Books(List<PoolSnapshot> pools, SessionsSnapshot sessions, long writtenAtNanos) {}

  /**
   * The books of every pool and of the registry, written with the gate closed and housekeeping
   * paused. A segment whose descriptor was sent before ({@code descriptors}) is named by that
   * index; the others' descriptors are added to it.
   */
  static Books write(DevicePools pools, SessionRegistry registry, SegmentFdSink descriptors)
      throws TakeOverRefusedException {
    if (registry.draining()) {
      throw new TakeOverRefusedException("this daemon is shutting down");
    }
    String sleeping = sleepingRefusal(registry);
    if (sleeping == null) {
      sleeping = parkedRefusal(registry);
    }
    if (sleeping != null) {
      throw new TakeOverRefusedException(sleeping);
    }
    List<PoolSnapshot> written;
    try {
      written = pools.snapshots(descriptors);
    } catch (SnapshotRefusedException e) {
      throw new TakeOverRefusedException(e.getMessage(), e);
    }
    try {
      long now = registry.nanos();
      return new Books(written, registry.snapshot(now), now);
    } catch (IllegalStateException e) {
      throw new TakeOverRefusedException(e.getMessage(), e);
    }
  }

  /**
   * Copies the pidfds of the processes in PID namespaces this daemon cannot see into {@code
   * descriptors} (after the segments': they go with the last state only), and returns their pidfs
   * inodes in the same order.
   */
  static List<Long> hiddenProcesses(DescriptorPins pins, OutgoingDescriptors descriptors)
      throws TakeOverRefusedException {
    if (pins == null) {
      return List.of();
    }
    List<Long> inodes = new ArrayList<>();
    try {
      for (Map.Entry<Long, Integer> pidfd : pins.pidfdsToHandOver().entrySet()) {
        descriptors.addUnindexed(SegmentFd.ofNative(pidfd.getValue(), false));
        inodes.add(pidfd.getKey());
      }
    } catch (IOException e) {
      throw new TakeOverRefusedException("the pidfds of the processes in PID namespaces this daemon cannot see "
          + "could not be copied (" + e.getMessage() + ")", e);
    }
    return inodes;
  }

  /** The whole of {@code books} on the wire. */
  static State.Builder toProto(Books books) {
    State.Builder state = State.newBuilder();
    books.pools().forEach(p -> state.addPools(PoolStates.toProto(p)));
    return state.setSessions(SessionsStates.toProto(books.sessions()));
  }

  /** The books of a whole state read off the wire (not one with changes only). */
  static Books fromProto(State state) {
    return new Books(state.getPoolsList().stream().map(PoolStates::fromProto).toList(),
        SessionsStates.fromProto(state.getSessions()), 0);
  }

  /**
   * Rebuilds the running daemon's pools in the successor's new ones; they take every segment the
   * state names (whether they succeed or not), and the take-over gives up the others at its close.
   */
  public static void restorePools(TakeOver takeOver, DevicePools pools) {
    restorePools(takeOver.books(), takeOver.segments(), pools);
  }

  private static void restorePools(Books books, IncomingSegments segments, DevicePools pools) {
    try {
      pools.restore(books.pools(), segments);
    } catch (SnapshotRefusedException e) {
      throw new IllegalStateException(e.getMessage(), e);
    }
  }

  /**
   * Rebuilds a state in new pools and registry, saying nothing: a {@link Rehearsal}'s, whose books
   * are scratch. The pools take the segments the state names, whatever happens; the caller closes
   * {@code segments}, giving up the others.
   */
  static void restore(Books books, IncomingSegments segments, DevicePools pools, SessionRegistry registry) {
    restorePools(books, segments, pools);
    registry.restore(books.sessions());
  }

  /**
   * Rebuilds the running daemon's sessions in the successor's fresh registry, over pools already
   * restored ({@link #restorePools}).
   *
   * @return what says what came back (one INFO line, and one WARN when restored usage is over
   *     this daemon's quotas: it stays, new leases are refused), for the caller to run once it
   *     serves: a log line written inside the pause delays every waiting client
   * @throws IllegalStateException when the state does not fit (see {@link SessionRegistry#restore})
   */
  public static Runnable restoreSessions(TakeOver takeOver, SessionRegistry registry) {
    SessionsSnapshot.Restored r = registry.restore(takeOver.books().sessions());
    return () -> logRestored(r);
  }

  /** As {@link #restoreSessions(TakeOver, SessionRegistry)}, saying what came back at once. */
  public static void restoreSessions(SessionsState state, SessionRegistry registry) {
    logRestored(registry.restore(SessionsStates.fromProto(state)));
  }

  private static void logRestored(SessionsSnapshot.Restored r) {
    if (r.overQuota() > 0) {
      log.warn("Take-over: restored usage is over this daemon's quotas for {} sessions or tenants ({}{}); their "
          + "leases stay, and new leases are refused until they fall below (flags --quota-max-*, --tenant-max-*)",
          r.overQuota(), String.join("; ", r.overQuotaNamed()),
          r.overQuota() > r.overQuotaNamed().size() ? "; and " + (r.overQuota() - r.overQuotaNamed().size()) + " more"
              : "");
    }
    log.atInfo().addKeyValue("sessions", r.sessions()).addKeyValue("leases", r.leases())
        .log("Take-over: restored {} sessions, {} leases and holds, {} shared blocks, {} share tokens, {} published "
            + "names; lease sequence continues after {}{}", r.sessions(), r.leases(), r.sharedBlocks(), r.tokens(),
            r.objects(), r.lastSequence(), r.cappedTtls() + r.cappedAllowances() == 0 ? ""
                : "; capped to this daemon's configuration: " + r.cappedTtls() + " TTLs (--max-ttl), "
                    + r.cappedAllowances() + " client cache allowances (--client-cache-bytes)");
  }
}
