package io.gpumemd.server.takeover;

import io.gpumemd.proto.takeover.v1.CallerState;
import io.gpumemd.proto.takeover.v1.LeaseState;
import io.gpumemd.proto.takeover.v1.PublishedObjectState;
import io.gpumemd.proto.takeover.v1.ReportedClientCounters;
import io.gpumemd.proto.takeover.v1.SegmentOwnerState;
import io.gpumemd.proto.takeover.v1.SessionChurnState;
import io.gpumemd.proto.takeover.v1.SessionState;
import io.gpumemd.proto.takeover.v1.SessionsState;
import io.gpumemd.proto.takeover.v1.ShareTokenState;
import io.gpumemd.proto.takeover.v1.SharedBlockState;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.session.SessionsSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.ClientCounters;
import io.gpumemd.server.session.SessionsSnapshot.LeaseSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.ObjectSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.SessionSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.SharedBlockSnapshot;
import io.gpumemd.server.session.SessionsSnapshot.TokenSnapshot;
import java.util.ArrayList;
import java.util.List;

/**
 * The session layer's {@link SessionsSnapshot} to and from the take-over's wire message {@link
 * SessionsState}, field for field (as {@code grpc/ProtoMapping} does for the public API): the
 * session layer never sees the wire types. Stateless.
 */
public final class SessionsStates {
  private SessionsStates() {}

  public static SessionsState toProto(SessionsSnapshot s) {
    SessionsState.Builder out = SessionsState.newBuilder().setLeaseSequence(s.leaseSequence());
    s.sessions().forEach(x -> out.addSessions(toProto(x)));
    s.leases().forEach(x -> out.addLeases(toProto(x)));
    s.tokens().forEach(x -> out.addTokens(toProto(x)));
    for (ObjectSnapshot o : s.objects()) {
      out.addObjects(PublishedObjectState.newBuilder().setTenant(o.tenant()).setName(o.name())
          .setSharedBlock(o.sharedBlock()).setReadOnly(o.readOnly()).setPublishedAgeNanos(o.publishedAgeNanos())
          .setPublishedBy(o.publishedBy()).setLookups(o.lookups()));
    }
    for (SharedBlockSnapshot b : s.sharedBlocks()) {
      out.addSharedBlocks(SharedBlockState.newBuilder().setDevice(b.device()).setSegmentId(b.segmentId())
          .setBlockOffset(b.blockOffset()).setBlockSize(b.blockSize()).setRequestedBytes(b.requestedBytes())
          .setLeasedByTenant(b.leasedByTenant()).setLeasedBySessionId(b.leasedBySessionId())
          .addAllNames(b.names()).setTokenCount(b.tokenCount()).addAllRecordIds(b.recordIds()));
    }
    SessionsSnapshot.Churn c = s.churn();
    out.setChurn(SessionChurnState.newBuilder().setWindowAgeNanos(c.windowAgeNanos()).setOpened(c.opened())
        .setEnded(c.ended()).setEndedHolding(c.endedHolding()).setReleasedLeases(c.releasedLeases())
        .setReleasedBytes(c.releasedBytes()).setRefusedTotal(c.refusedTotal())
        .setRefusedPerTenant(c.refusedPerTenant()).setRefusedRate(c.refusedRate())
        .setHoldingToldSingly(c.holdingToldSingly()));
    return out.build();
  }

  private static SessionState toProto(SessionSnapshot s) {
    Caller c = s.owner();
    SessionState.Builder b = SessionState.newBuilder().setId(s.id())
        .setOwner(CallerState.newBuilder().setTenant(c.tenant()).setPrincipal(c.principal()).setAdmin(c.admin())
            .setUid(c.uid()).setGid(c.gid()).setPid(c.pid()).setOrigin(c.origin()))
        .setSegmentOwner(SegmentOwnerState.newBuilder().setKey(s.segmentOwnerKey()).setUid(s.segmentOwnerUid())
            .setGid(s.segmentOwnerGid()))
        .setClientName(s.clientName()).setTtlSeconds(s.ttlSeconds())
        .setOpenedAgeNanos(s.openedAgeNanos()).setLastSeenAgeNanos(s.lastSeenAgeNanos())
        .setHadStream(s.hadStream()).setStreamAttached(s.streamAttached())
        .setDetachedAgeNanos(s.detachedAgeNanos())
        .setGrantedCacheBytes(s.grantedCacheBytes()).setCacheAllowance(s.cacheAllowance())
        .setCacheReturnOverdue(s.cacheReturnOverdue()).setAppliedMessages(s.appliedMessages());
    for (ClientCounters rc : s.reportedCounters()) {
      b.addReportedCounters(ReportedClientCounters.newBuilder().setDevice(rc.device()).setHits(rc.hits())
          .setReturns(rc.returns()));
    }
    return b.build();
  }

  private static LeaseState toProto(LeaseSnapshot l) {
    return LeaseState.newBuilder().setId(l.id()).setSessionId(l.sessionId()).setDevice(l.device())
        .setSegmentId(l.segmentId()).setBlockOffset(l.blockOffset()).setBlockSize(l.blockSize())
        .setRequestedBytes(l.requestedBytes()).setTag(l.tag()).setGrantedAgeNanos(l.grantedAgeNanos())
        .setSequence(l.sequence()).setPoolHit(l.poolHit()).setAttached(l.attached()).setReadOnly(l.readOnly())
        .setClientCached(l.clientCached()).setLeakReported(l.leakReported()).setSharedBlock(l.sharedBlock()).build();
  }

  private static ShareTokenState toProto(TokenSnapshot t) {
    return ShareTokenState.newBuilder().setToken(t.token()).setId(t.id()).setTenant(t.tenant())
        .setSharedBlock(t.sharedBlock()).setReadOnly(t.readOnly()).setMaxAttaches(t.maxAttaches())
        .setAttaches(t.attaches()).setCreatedAgeNanos(t.createdAgeNanos()).setExpiresInNanos(t.expiresInNanos())
        .setSessionId(t.sessionId()).setLeaseId(t.leaseId()).setClientName(t.clientName()).setDead(t.dead())
        .build();
  }

  public static SessionsSnapshot fromProto(SessionsState s) {
    List<SessionSnapshot> sessions = new ArrayList<>(s.getSessionsCount());
    s.getSessionsList().forEach(x -> sessions.add(fromProto(x)));
    List<LeaseSnapshot> leases = new ArrayList<>(s.getLeasesCount());
    for (LeaseState l : s.getLeasesList()) {
      leases.add(new LeaseSnapshot(l.getId(), l.getSessionId(), l.getDevice(), l.getSegmentId(), l.getBlockOffset(),
          l.getBlockSize(), l.getRequestedBytes(), l.getTag(), l.getGrantedAgeNanos(), l.getSequence(),
          l.getPoolHit(), l.getAttached(), l.getReadOnly(), l.getClientCached(), l.getLeakReported(),
          l.getSharedBlock()));
    }
    List<SharedBlockSnapshot> blocks = new ArrayList<>(s.getSharedBlocksCount());
    for (SharedBlockState b : s.getSharedBlocksList()) {
      blocks.add(new SharedBlockSnapshot(b.getDevice(), b.getSegmentId(), b.getBlockOffset(), b.getBlockSize(),
          b.getRequestedBytes(), b.getLeasedByTenant(), b.getLeasedBySessionId(), b.getRecordIdsList(),
          b.getNamesList(), b.getTokenCount()));
    }
    List<TokenSnapshot> tokens = new ArrayList<>(s.getTokensCount());
    for (ShareTokenState t : s.getTokensList()) {
      tokens.add(new TokenSnapshot(t.getToken(), t.getId(), t.getTenant(), t.getSharedBlock(), t.getReadOnly(),
          t.getMaxAttaches(), t.getAttaches(), t.getCreatedAgeNanos(), t.getExpiresInNanos(), t.getSessionId(),
          t.getLeaseId(), t.getClientName(), t.getDead()));
    }
    List<ObjectSnapshot> objects = new ArrayList<>(s.getObjectsCount());
    for (PublishedObjectState o : s.getObjectsList()) {
      objects.add(new ObjectSnapshot(o.getTenant(), o.getName(), o.getSharedBlock(), o.getReadOnly(),
          o.getPublishedAgeNanos(), o.getPublishedBy(), o.getLookups()));
    }
    SessionChurnState c = s.getChurn();
    return new SessionsSnapshot(s.getLeaseSequence(), sessions, leases, blocks, tokens, objects,
        new SessionsSnapshot.Churn(c.getWindowAgeNanos(), c.getOpened(), c.getEnded(), c.getEndedHolding(),
            c.getReleasedLeases(), c.getReleasedBytes(), c.getRefusedTotal(), c.getRefusedPerTenant(),
            c.getRefusedRate(), c.getHoldingToldSingly()));
  }

  private static SessionSnapshot fromProto(SessionState s) {
    CallerState o = s.getOwner();
    Caller caller = new Caller(o.getTenant(), o.getPrincipal(), o.getAdmin(), o.getUid(), o.getGid(), o.getPid(),
        o.getOrigin());
    List<ClientCounters> counters = new ArrayList<>(s.getReportedCountersCount());
    for (ReportedClientCounters rc : s.getReportedCountersList()) {
      counters.add(new ClientCounters(rc.getDevice(), rc.getHits(), rc.getReturns()));
    }
    SegmentOwnerState so = s.getSegmentOwner();
    return new SessionSnapshot(s.getId(), caller, so.getKey(), so.getUid(), so.getGid(), s.getClientName(),
        s.getTtlSeconds(), s.getOpenedAgeNanos(), s.getLastSeenAgeNanos(), s.getHadStream(), s.getStreamAttached(),
        s.getDetachedAgeNanos(), s.getGrantedCacheBytes(), s.getCacheAllowance(), s.getCacheReturnOverdue(),
        counters, s.getAppliedMessages());
  }
}
