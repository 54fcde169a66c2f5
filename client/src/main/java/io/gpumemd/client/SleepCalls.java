package io.gpumemd.client;

import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.SegmentWake;
import io.gpumemd.proto.v1.SleepRequest;
import io.gpumemd.proto.v1.SleepResponse;
import io.gpumemd.proto.v1.StreamError;
import io.gpumemd.proto.v1.WakeRequest;
import io.gpumemd.proto.v1.WakeResponse;
import io.grpc.Channel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;

/**
 * Sleep and wake of the client's session (issue 35; the design is in the daemon's {@code
 * io.gpumemd.server.offload} package): the Sleep and Wake calls, and what this process does
 * around them with its client cache and its mappings ({@link MappingCache}).
 *
 * <p>Sleep, in order: the client cache is emptied and held empty (its leases released, so that
 * nothing of the session is client-cached) and the pending notices are sent; the segments to
 * sleep are vacated ({@link MappingCache#vacateForSleep}: address ranges kept, memory let go)
 * and named in the call, as the unmap confirmation. A refusal changed nothing at the daemon:
 * each segment is filled again from itself, and the refusal is thrown. Wake: for each segment
 * the daemon names, the new segment is mapped into the old range ({@link MappingCache#wake}),
 * so every lease is at its old address; the client cache keeps leases again once nothing sleeps.
 *
 * <p>The release notices sent before the Sleep call travel on the KeepAlive stream, which the
 * unary call may overtake: a lease closed just before may still be live at the daemon and sleep
 * with the others. The client therefore also closes (and names) every mapping no lease of its
 * own uses, so that such a lease's segment is among those it vacated; the release, when it
 * arrives, releases the sleeping lease.
 *
 * <p>Thread-safe: one sleep or wake at a time (this object's lock). The caller pauses its work
 * on the leases first; a lease used meanwhile faults.
 */
final class SleepCalls {
  private final SessionKeeper sessions;
  private final AllocatorGrpc.AllocatorBlockingStub blocking;
  private final Object lock = new Object();

  SleepCalls(SessionKeeper sessions, Channel channel) {
    this.sessions = sessions;
    this.blocking = AllocatorGrpc.newBlockingStub(channel);
  }

  /**
   * GpuMemClient#sleep.
   *
   * @param adminRequestId not 0: the admin's request this sleep answers ({@link AskedSleeps})
   */
  SleepResult sleep(int level, List<String> tags, long adminRequestId) {
    if (level != 1 && level != 2) {
      throw new IllegalArgumentException("level: " + level + " (expected: 1 or 2)");
    }
    Set<String> wanted = Set.copyOf(tags);
    synchronized (lock) {
      Session s = sessions.live();
      if (s.cache != null) {
        s.giveBack(s.cache.suspend()); // released by notice, and the notices flushed
      }
      s.notices.flush();
      MappingCache.Vacated vacated;
      try {
        vacated = s.mappings.vacateForSleep(wanted);
      } catch (RuntimeException | LinkageError e) {
        resumeCacheIfAwake(s);
        throw e;
      }
      SleepResponse reply;
      try {
        reply = blocking.sleep(SleepRequest.newBuilder().setSessionId(s.id).setLevel(level).addAllTags(tags)
            .addAllVacatedSegmentIds(vacated.ids()).setAdminRequestId(adminRequestId).build());
      } catch (StatusRuntimeException e) {
        GpuMemException refusal = sessions.failed(s, e);
        s.mappings.sleepRefused(vacated, level, refusal);
        resumeCacheIfAwake(s);
        throw refusal;
      }
      s.mappings.slept(vacated, reply.getSegmentIdsList(), level);
      resumeCacheIfAwake(s); // nothing slept (no lease to sleep): the session is as it was
      return new SleepResult(reply.getLeaseIdsList(), reply.getSegmentIdsList(), reply.getHostBytes(),
          reply.getFreedBytes());
    }
  }

  /**
   * GpuMemClient#wake. A segment that cannot be mapped again is reported after the others were
   * woken: its leases are awake at the daemon but not mapped here (they stay {@link
   * Lease#isAsleep()}; closing them releases them).
   */
  WakeResult wake(long adminRequestId) {
    synchronized (lock) {
      Session s = sessions.live();
      WakeResponse reply;
      try {
        reply = blocking.wake(WakeRequest.newBuilder().setSessionId(s.id).setAdminRequestId(adminRequestId).build());
      } catch (StatusRuntimeException e) {
        throw sessions.failed(s, e);
      }
      List<String> woken = new ArrayList<>();
      GpuMemException failed = null;
      for (SegmentWake w : reply.getSegmentsList()) {
        try {
          if (s.mappings.wake(w.getOldSegmentId(), w.getHandle())) {
            woken.addAll(w.getLeaseIdsList());
          }
        } catch (RuntimeException | LinkageError e) {
          GpuMemException error = new GpuMemException(Status.Code.INTERNAL, "segment "
              + Long.toUnsignedString(w.getOldSegmentId()) + " woke as segment "
              + Long.toUnsignedString(w.getHandle().getSegmentId()) + " but could not be mapped again at its "
              + "address (its leases stay unusable here; close them): " + e, e);
          if (failed == null) {
            failed = error;
          } else {
            failed.addSuppressed(error);
          }
        }
      }
      resumeCacheIfAwake(s);
      if (failed != null) {
        throw failed;
      }
      return new WakeResult(woken, reply.getSegmentsCount());
    }
  }

  /** Refuses the admin's request {@code adminRequestId} of session {@code s}, telling the daemon why. */
  void refuse(Session s, long adminRequestId, boolean wake, Status.Code code, String why) {
    StreamError refused = StreamError.newBuilder().setCode(code.value()).setMessage(why).build();
    try {
      if (wake) {
        blocking.wake(WakeRequest.newBuilder().setSessionId(s.id).setAdminRequestId(adminRequestId)
            .setRefused(refused).build());
      } else {
        blocking.sleep(SleepRequest.newBuilder().setSessionId(s.id).setAdminRequestId(adminRequestId)
            .setRefused(refused).build());
      }
    } catch (StatusRuntimeException e) {
      throw GpuMemException.from(e);
    }
  }

  /** The client cache keeps closed leases again once no segment of the session sleeps. */
  private static void resumeCacheIfAwake(Session s) {
    if (s.cache != null && s.mappings.asleep() == 0) {
      s.cache.resume();
    }
  }
}
