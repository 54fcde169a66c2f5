package io.gpumemd.server;

import io.gpumemd.proto.takeover.v1.Hello;
import io.gpumemd.proto.takeover.v1.PoolState;
import io.gpumemd.proto.takeover.v1.SegmentState;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.server.backend.MemoryBackend;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.config.ServerConfig;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.takeover.TakeOver;
import io.gpumemd.server.pool.TakeOverRefusedException;
import java.io.IOException;
import java.util.List;

/**
 * Between the daemon and the take-over protocol: what a successor says of itself ({@link
 * #hello}), whether this daemon's state fits it ({@link #refusal}), the state out of the pools
 * and the registry ({@link #export}) and back into new ones ({@link #restorePool}, {@link
 * #restoreSessions}). Stateless.
 */
final class TakeOverState {
  private TakeOverState() {}

  /** How a backend hands segments to clients, which a successor must match. */
  static String handles(MemoryBackend backend) {
    return backend.name() + (backend.passesDescriptors() ? "/descriptors" : "/handles");
  }

  /**
   * Asks the running daemon for its state (this daemon's backend can hold one: checked before).
   *
   * @return the state, or null to start fresh
   */
  static TakeOver request(ServerConfig config, MemoryBackend backend) throws IOException {
    Hello.Builder hello = Hello.newBuilder().setVersion(GpumemdServer.VERSION).setBackend(backend.name())
        .setPid((int) ProcessHandle.current().pid()).setHandles(handles(backend));
    for (io.gpumemd.server.backend.DeviceInfo device : backend.devices()) {
      hello.addLimitBytes(config.pool().deviceLimit(device.capacityBytes()));
      hello.addDeviceUuids(device.uuid());
    }
    return TakeOver.request(config.takeOver().socket(), hello.build());
  }

  /** Null when a successor that says {@code hello} can hold this daemon's state; else why not. */
  static String refusal(Hello hello, MemoryBackend backend, DevicePools pools, SessionRegistry registry) {
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
    return pools.takeOverRefusal(hello.getLimitBytesList());
  }

  /**
   * Why a successor whose devices are {@code successorUuids} (by ordinal) cannot take over these
   * devices, or null when its device n is this daemon's device n, UUID for UUID. Memory of one
   * GPU is never adopted as another's: a successor that sees the same GPUs in another order is
   * refused too (sessions, leases and segment ids name devices by ordinal, and clients mapped
   * them by the UUID they were told at OpenSession).
   */
  static String deviceMismatch(List<io.gpumemd.server.backend.DeviceInfo> own, List<String> successorUuids) {
    if (successorUuids.size() != own.size()) {
      return "the successor names " + successorUuids.size() + " device UUID(s) for " + own.size() + " device(s) "
          + "(expected: one per device, as every gpumemd of this version sends)";
    }
    for (io.gpumemd.server.backend.DeviceInfo d : own) {
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

  /** The state of every pool and of the registry; the gate is closed and housekeeping paused. */
  static State export(DevicePools pools, SessionRegistry registry, List<SegmentFd> descriptors)
      throws TakeOverRefusedException {
    if (registry.draining()) {
      throw new TakeOverRefusedException("this daemon is shutting down");
    }
    State.Builder state = State.newBuilder().addAllPools(pools.exportStates(d -> {
      descriptors.add(d);
      return descriptors.size() - 1;
    }));
    try {
      state.setSessions(registry.exportState());
    } catch (IllegalStateException e) {
      throw new TakeOverRefusedException(e.getMessage(), e);
    }
    return state.build();
  }

  /**
   * Rebuilds the predecessor's pools in this daemon's new ones; they take every descriptor the
   * state names (whether they succeed or not), which the take-over then no longer closes.
   */
  static void restorePools(TakeOver takeOver, DevicePools pools) {
    List<PoolState> states = takeOver.state().getPoolsList();
    int[] fds = takeOver.fds().stream().mapToInt(Integer::intValue).toArray();
    takeOver.consumed(states.stream().flatMap(p -> p.getSegmentsList().stream())
        .mapToInt(SegmentState::getDescriptorIndex).toArray());
    try {
      pools.restore(states, fds);
    } catch (TakeOverRefusedException e) {
      throw new IllegalStateException(e.getMessage(), e);
    }
  }

  static void restoreSessions(TakeOver takeOver, SessionRegistry registry) {
    registry.restore(takeOver.state().getSessions());
  }
}
