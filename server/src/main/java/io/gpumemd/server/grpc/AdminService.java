package io.gpumemd.server.grpc;

import static io.gpumemd.server.grpc.UnaryCalls.answer;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.GetStatsRequest;
import io.gpumemd.proto.v1.GetStatsResponse;
import io.gpumemd.proto.v1.ListDevicesRequest;
import io.gpumemd.proto.v1.ListDevicesResponse;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.ListLeasesResponse;
import io.gpumemd.proto.v1.ListSessionsRequest;
import io.gpumemd.proto.v1.ListSessionsResponse;
import io.gpumemd.proto.v1.ListObjectsRequest;
import io.gpumemd.proto.v1.ListObjectsResponse;
import io.gpumemd.proto.v1.ParkObjectRequest;
import io.gpumemd.proto.v1.ParkObjectResponse;
import io.gpumemd.proto.v1.RemoveObjectRequest;
import io.gpumemd.proto.v1.ListSharesRequest;
import io.gpumemd.proto.v1.ListSharesResponse;
import io.gpumemd.proto.v1.RemoveShareRequest;
import io.gpumemd.proto.v1.RevokeShareResponse;
import io.gpumemd.server.sharing.ShareToken;
import io.gpumemd.server.sharing.ObjectParking;
import io.gpumemd.server.sharing.SharedObjects;
import io.gpumemd.server.sharing.ShareCursor;
import io.gpumemd.proto.v1.UnpublishResponse;
import io.gpumemd.server.sharing.PublishedObject;
import io.gpumemd.proto.v1.SetRetentionCapRequest;
import io.gpumemd.proto.v1.SetRetentionCapResponse;
import io.gpumemd.proto.v1.TrimRequest;
import io.gpumemd.proto.v1.TrimResponse;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.Callers;
import io.gpumemd.server.error.InvalidRequestException;
import io.gpumemd.server.error.PermissionDeniedException;
import io.gpumemd.server.error.StatusMapper;
import io.gpumemd.server.pool.DevicePool;
import io.gpumemd.server.pool.DevicePools;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.books.Page;
import io.gpumemd.server.session.Session;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.session.SessionSleep;
import io.gpumemd.server.session.SleepAsks;
import io.gpumemd.proto.v1.SleepResponse;
import io.gpumemd.proto.v1.SleepSessionRequest;
import io.gpumemd.proto.v1.WakeResponse;
import io.gpumemd.proto.v1.WakeSessionRequest;
import java.util.function.Function;
import java.util.function.Supplier;
import io.gpumemd.server.books.Validation;
import io.grpc.Status;
import io.grpc.stub.StreamObserver;
import java.util.List;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The {@code Admin} service: inspection and cache control for operators. A thin translation
 * over the pools and the session registry; errors go through {@link StatusMapper}.
 *
 * <p>Access: ListDevices and GetStats are open to every caller (device facts and pool-wide
 * figures, nothing that names a session). ListSessions and ListLeases show an admin everything
 * and anyone else their own tenant only, a page at a time ({@link PageTokens}). Trim and SetRetentionCap change the daemon for
 * everyone: admins only (PERMISSION_DENIED otherwise), and each is logged at INFO with who
 * asked. ListObjects and ListShares, RemoveObject and RemoveShare reach the caller's own
 * tenant, and any tenant for an admin ({@link io.gpumemd.server.sharing.SharedObjects} decides
 * and logs); a share token is listed by its public id, never by the token. SleepSession and
 * WakeSession reach the caller's own tenant's sessions, and any for an admin, and ask the
 * session's client ({@link SleepAsks} decides and logs).
 */
public final class AdminService extends AdminGrpc.AdminImplBase {
  private static final Logger log = LoggerFactory.getLogger(AdminService.class);

  private final DevicePools pools;
  private final SessionRegistry registry;
  /** Listing and removing share tokens and published names. */
  private final SharedObjects sharing;
  private final Executor blockingExecutor;
  /** How long a client asked to sleep or wake by an admin has to answer ({@code --unmap-wait-ms}). */
  private final long askWaitMillis;

  /** With the default unmap wait (2 s) as the bound on a client's answer to an admin's sleep. */
  public AdminService(DevicePools pools, SessionRegistry registry, Executor blockingExecutor) {
    this(pools, registry, blockingExecutor, 2000);
  }

  /**
   * @param blockingExecutor runs Trim, which may wait (up to the unmap wait) for clients to
   *     give back their cached blocks, off the transport thread
   * @param askWaitMillis how long a client asked to sleep or wake (SleepSession, WakeSession)
   *     has to answer ({@code --unmap-wait-ms})
   */
  public AdminService(DevicePools pools, SessionRegistry registry, Executor blockingExecutor, long askWaitMillis) {
    this.pools = pools;
    this.registry = registry;
    this.sharing = registry.sharing();
    this.blockingExecutor = blockingExecutor;
    this.askWaitMillis = askWaitMillis;
  }

  private List<DevicePool> selected(boolean hasDevice, int device) {
    return hasDevice ? List.of(pools.get(device)) : pools.all();
  }

  @Override
  public void listDevices(ListDevicesRequest request, StreamObserver<ListDevicesResponse> response) {
    answer("ListDevices", response, () -> {
      ListDevicesResponse.Builder out = ListDevicesResponse.newBuilder();
      for (DevicePool pool : pools.all()) {
        out.addDevices(ProtoMapping.deviceInfo(pool));
      }
      return out.build();
    });
  }

  @Override
  public void getStats(GetStatsRequest request, StreamObserver<GetStatsResponse> response) {
    answer("GetStats", response, () -> {
      GetStatsResponse.Builder out = GetStatsResponse.newBuilder();
      for (DevicePool pool : selected(request.hasDevice(), request.getDevice())) {
        out.addDevices(ProtoMapping.deviceStats(pool.stats()));
      }
      return out.build();
    });
  }

  @Override
  public void listLeases(ListLeasesRequest request, StreamObserver<ListLeasesResponse> response) {
    answer("ListLeases", response, () -> {
      int size = request.getPageSize() != 0 ? PageTokens.pageSize("page_size", request.getPageSize())
          : PageTokens.pageSize("limit", request.getLimit());
      Page<LeaseRecord> page = registry.leasePage(Callers.current(), request.hasDevice() ? request.getDevice() : null,
          request.getSessionId(), PageTokens.leaseCursor(request.getPageToken()), size);
      ListLeasesResponse.Builder out = ListLeasesResponse.newBuilder().setTotal(page.total());
      for (LeaseRecord lease : page.items()) {
        out.addLeases(ProtoMapping.leaseInfo(lease, registry.ageMillis(lease.grantedNanos())));
      }
      if (page.more()) {
        out.setNextPageToken(PageTokens.leaseToken(page.items().get(page.items().size() - 1)));
      }
      return out.build();
    });
  }

  @Override
  public void listSessions(ListSessionsRequest request, StreamObserver<ListSessionsResponse> response) {
    answer("ListSessions", response, () -> {
      int size = PageTokens.pageSize("page_size", request.getPageSize());
      Object[] cursor = PageTokens.sessionCursor(request.getPageToken());
      Page<Session> page = cursor == null ? registry.sessionPage(Callers.current(), 0, null, size)
          : registry.sessionPage(Callers.current(), (Long) cursor[0], (String) cursor[1], size);
      ListSessionsResponse.Builder out = ListSessionsResponse.newBuilder().setTotal(page.total());
      for (Session session : page.items()) {
        out.addSessions(ProtoMapping.sessionInfo(session, registry.ageMillis(session.openedNanos()),
            pools.mappedSegments(session.id())));
      }
      if (page.more()) {
        out.setNextPageToken(PageTokens.sessionToken(page.items().get(page.items().size() - 1)));
      }
      return out.build();
    });
  }

  @Override
  public void trim(TrimRequest request, StreamObserver<TrimResponse> response) {
    long keep;
    List<DevicePool> targets;
    Caller caller = Callers.current();
    try {
      requireAdmin(caller, "Trim");
      keep = Validation.byteCount("keep_bytes", request.getKeepBytes());
      targets = selected(request.hasDevice(), request.getDevice());
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus("Trim", e));
      return;
    }
    try {
      blockingExecutor.execute(() -> answer("Trim", response, () -> {
        long freed = 0;
        for (DevicePool pool : targets) {
          freed += pool.trim(keep);
        }
        log.atInfo().addKeyValue("admin", caller.principal())
            .log("Trim to {} bytes on {} by {}: freed {} bytes", keep, describe(request.hasDevice(), request.getDevice()),
            caller, freed);
        return TrimResponse.newBuilder().setFreedBytes(freed).build();
      }));
    } catch (RejectedExecutionException e) {
      response.onError(Status.UNAVAILABLE.withDescription("gpumemd is shutting down").asRuntimeException());
    }
  }

  @Override
  public void setRetentionCap(SetRetentionCapRequest request, StreamObserver<SetRetentionCapResponse> response) {
    Caller caller = Callers.current();
    answer("SetRetentionCap", response, () -> {
      requireAdmin(caller, "SetRetentionCap");
      long cap = Validation.byteCount("cap_bytes", request.getCapBytes());
      long evicted = pools.setRetentionCap(selected(request.hasDevice(), request.getDevice()), cap);
      log.atInfo().addKeyValue("admin", caller.principal())
          .log("Retention cap set to {} bytes on {} by {}: evicted {} bytes", cap,
          describe(request.hasDevice(), request.getDevice()), caller, evicted);
      return SetRetentionCapResponse.newBuilder().setEvictedBytes(evicted).build();
    });
  }

  @Override
  public void listObjects(ListObjectsRequest request, StreamObserver<ListObjectsResponse> response) {
    answer("ListObjects", response, () -> {
      int size = PageTokens.pageSize("page_size", request.getPageSize());
      String[] cursor = PageTokens.objectCursor(request.getPageToken());
      Page<PublishedObject> page = cursor == null ? sharing.objects(Callers.current(), null, null, size)
          : sharing.objects(Callers.current(), cursor[0], cursor[1], size);
      ListObjectsResponse.Builder out = ListObjectsResponse.newBuilder().setTotal(page.total());
      for (PublishedObject object : page.items()) {
        out.addObjects(ProtoMapping.objectInfo(object, registry.ageMillis(object.publishedNanos())));
      }
      if (page.more()) {
        out.setNextPageToken(PageTokens.objectToken(page.items().get(page.items().size() - 1)));
      }
      return out.build();
    });
  }

  @Override
  public void removeObject(RemoveObjectRequest request, StreamObserver<UnpublishResponse> response) {
    answer("RemoveObject", response, () -> UnpublishResponse.newBuilder()
        .setBlockReturned(sharing.remove(Callers.current(), request.getTenant(), request.getName()))
        .build());
  }

  /** Runs on the blocking executor: it copies the object's bytes to host memory. */
  @Override
  public void parkObject(ParkObjectRequest request, StreamObserver<ParkObjectResponse> response) {
    Caller caller = Callers.current();
    try {
      blockingExecutor.execute(() -> answer("ParkObject", response, () -> {
        ObjectParking.Parked parked = sharing.park(caller, request.getTenant(), request.getName());
        return ParkObjectResponse.newBuilder().setHostBytes(parked.hostBytes()).setFreedBytes(parked.freedBytes())
            .build();
      }));
    } catch (RejectedExecutionException e) {
      response.onError(Status.UNAVAILABLE.withDescription("gpumemd is shutting down").asRuntimeException());
    }
  }

  /**
   * Asks the session's client to sleep; the reply comes when its Sleep did (or was refused), or
   * after the wait. Nothing blocks meanwhile: the ask's answer completes the call.
   */
  @Override
  public void sleepSession(SleepSessionRequest request, StreamObserver<SleepResponse> response) {
    asked("SleepSession", response, () -> registry.sleep().asks().ask(Callers.current(),
        request.getSessionId(), request.getLevel(), request.getTagsList(), false, askWaitMillis),
        done -> AllocatorService.sleepResponse((SessionSleep.Slept) done));
  }

  /** As {@link #sleepSession}, for a wake. */
  @Override
  @SuppressWarnings("unchecked")
  public void wakeSession(WakeSessionRequest request, StreamObserver<WakeResponse> response) {
    asked("WakeSession", response, () -> registry.sleep().asks().ask(Callers.current(),
        request.getSessionId(), 0, List.of(), true, askWaitMillis),
        done -> AllocatorService.wakeResponse((List<SessionSleep.Woken>) done));
  }

  private static <T> void asked(String rpc, StreamObserver<T> response, Supplier<SleepAsks.Ask> ask,
      Function<Object, T> reply) {
    SleepAsks.Ask asked;
    try {
      asked = ask.get();
    } catch (RuntimeException e) {
      response.onError(StatusMapper.toStatus(rpc, e));
      return;
    }
    asked.answer().whenComplete((done, error) -> {
      if (error != null) {
        response.onError(StatusMapper.toStatus(rpc, error));
      } else {
        response.onNext(reply.apply(done));
        response.onCompleted();
      }
    });
  }

  @Override
  public void listShares(ListSharesRequest request, StreamObserver<ListSharesResponse> response) {
    answer("ListShares", response, () -> {
      int size = PageTokens.pageSize("page_size", request.getPageSize());
      ShareCursor after = PageTokens.shareCursor(request.getPageToken());
      Page<ShareToken> page = sharing.shares(Callers.current(), request.getTenant(), after, size);
      ListSharesResponse.Builder out = ListSharesResponse.newBuilder().setTotal(page.total());
      for (ShareToken token : page.items()) {
        // The "age" of the expiry, a moment still to come, is the time left with its sign flipped.
        out.addShares(ProtoMapping.shareInfo(token, registry.ageMillis(token.createdNanos()),
            -registry.ageMillis(token.expiresNanos())));
      }
      if (page.more()) {
        out.setNextPageToken(PageTokens.shareToken(page.items().get(page.items().size() - 1)));
      }
      return out.build();
    });
  }

  @Override
  public void removeShare(RemoveShareRequest request, StreamObserver<RevokeShareResponse> response) {
    answer("RemoveShare", response, () -> RevokeShareResponse.newBuilder()
        .setBlockReturned(sharing.removeShare(Callers.current(), request.getTenant(), request.getShareId()))
        .build());
  }

  /** Refuses a mutation to a caller without admin rights, saying what would grant them. */
  private static void requireAdmin(Caller caller, String rpc) {
    if (!caller.admin()) {
      throw new PermissionDeniedException(rpc + " changes the daemon for every tenant and needs an admin "
          + "identity (root, the daemon's uid, a member of --admin-group, or an admin token); "
          + caller.principal() + " is not one");
    }
  }

  private static String describe(boolean hasDevice, int device) {
    return hasDevice ? "device " + device : "all devices";
  }
}
