package io.gpumemd.server.fd;

import io.gpumemd.common.unix.ErrnoCalls;
import io.gpumemd.proto.v1.FdGrant;
import io.gpumemd.proto.v1.FdRefusal;
import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.error.ConflictException;
import io.gpumemd.server.error.ExhaustedException;
import io.gpumemd.server.error.NotFoundException;
import io.gpumemd.server.books.SegmentHolding;
import io.gpumemd.server.error.StatusMapper;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.io.UncheckedIOException;

/**
 * Who gets a segment's descriptor: the fd channel's rules, apart from its transport. A peer gets
 * one only for a session of its own tenant (the kernel's word on the connection, through the
 * daemon's {@link io.gpumemd.server.auth.IdentityPolicy}) that holds a lease or hold in the
 * segment, and only read-only when the request asks so or all the session holds there are
 * read-only holds. Everything else is refused with the status and message the gRPC services
 * would give ({@link StatusMapper}, the one place from exceptions to statuses).
 *
 * <p>Stateless; thread-safe as the {@link SessionRegistry} is.
 */
public final class FdGrants {

  private final SessionRegistry registry;
  private final DescriptorPins pins;

  public FdGrants(SessionRegistry registry, DescriptorPins pins) {
    this.registry = registry;
    this.pins = pins;
  }

  /** Who was sent which segment's descriptor. */
  DescriptorPins pins() {
    return pins;
  }

  /** A reply, and the descriptor to send with it (null for a refusal); the sender closes it. */
  record Answer(FdReply reply, SegmentFd descriptor) {}

  /** The answer to one request of {@code peer}. Never throws. */
  Answer answer(Caller peer, FdRequest request) {
    return answer(peer, request, false);
  }

  /**
   * The answer to one request of {@code peer}, or with {@code pushed} the push of a segment the
   * request names (the same rules, the reply marked pushed). Never throws.
   */
  Answer answer(Caller peer, FdRequest request, boolean pushed) {
    try {
      SegmentHolding holding = registry.holding(peer, request.getSessionId(), request.getSegmentId());
      if (!(holding.memory() instanceof FdPassedSegment segment)) {
        throw new ConflictException("segment " + request.getSegmentId() + " is not passed by descriptor: map it by "
            + "the MemoryHandle of its lease (host_shm_path or cuda_ipc_handle)");
      }
      boolean readOnly = request.getReadOnly() || !holding.writable();
      // Before a descriptor exists: from here on the process may map the segment for good, and
      // a segment with a holder is not freed, so the descriptor opened next is of a counted one.
      pins.granted(peer, request.getSessionId(), request.getSegmentId());
      SegmentFd descriptor = open(segment, readOnly);
      if (descriptor == null) {
        throw new NotFoundException("segment " + request.getSegmentId() + " was freed");
      }
      FdReply reply = FdReply.newBuilder().setRequestId(request.getRequestId()).setPushed(pushed)
          .setGranted(FdGrant.newBuilder().setSegmentId(request.getSegmentId())
              .setSegmentBytes(segment.bytes()).setReadOnly(readOnly))
          .build();
      return new Answer(reply, descriptor);
    } catch (RuntimeException e) {
      StatusRuntimeException status = StatusMapper.toStatus("fd channel", e);
      return new Answer(refusal(request.getRequestId(), status.getStatus()), null);
    }
  }

  /**
   * Whether {@code peer} may bind its connection to {@code sessionId}: null when it may, else
   * the refusal. Only a peer of the session's own tenant may (an admin peer of another tenant
   * may fetch, but is not pushed another tenant's segments); any other answers as an unknown
   * session does, so that ids cannot be probed.
   */
  FdReply refusedBind(Caller peer, FdRequest request) {
    try {
      Session session = registry.session(peer, request.getSessionId());
      if (!session.tenant().equals(peer.tenant())) {
        throw new NotFoundException("session " + request.getSessionId() + " not found (never opened, closed, or "
            + "expired)");
      }
      return null;
    } catch (RuntimeException e) {
      return refusal(request.getRequestId(), StatusMapper.toStatus("fd channel", e).getStatus());
    }
  }

  private static SegmentFd open(FdPassedSegment segment, boolean readOnly) {
    try {
      return segment.open(readOnly);
    } catch (io.gpumemd.server.backend.DescriptorExhaustedException e) {
      // A CUDA VMM export: the backend found out which resource ran out and says so.
      throw new ExhaustedException(e.getMessage());
    } catch (IOException e) {
      // A host segment's open(2) through /proc/self/fd: EMFILE (the process's limit) or ENFILE.
      if (e instanceof ErrnoCalls.ErrnoException errno && errno.outOfDescriptors()
          || String.valueOf(e.getMessage()).contains("Too many open files")) {
        // The daemon's own limit, not a failure to log with a trace on every request.
        throw new ExhaustedException("gpumemd has no file descriptor left for another reply (its RLIMIT_NOFILE, "
            + "which must exceed its live segments and connections); retry later");
      }
      throw new UncheckedIOException("cannot open a descriptor of " + segment, e);
    }
  }

  /** A refusal with a status's code and description. */
  static FdReply refusal(long requestId, Status status) {
    return FdReply.newBuilder().setRequestId(requestId)
        .setRefused(FdRefusal.newBuilder().setCode(status.getCode().value())
            .setMessage(status.getDescription() == null ? status.getCode().name() : status.getDescription()))
        .build();
  }
}
