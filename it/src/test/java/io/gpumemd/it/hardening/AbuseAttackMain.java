package io.gpumemd.it.hardening;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.AttachRequest;
import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ReleaseRequest;
import io.gpumemd.proto.v1.RevokeShareRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.SessionInfo;
import io.gpumemd.proto.v1.ShareRequest;
import io.grpc.StatusRuntimeException;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;

/**
 * The abuse of {@link AbuseSoakTest} other than the reply floods ({@link KeepAliveFloodMain}),
 * each run as uid 65534 for {@code seconds} with the raw generated stubs. Usage: {@code
 * AbuseAttackMain mode target seconds}, modes:
 *
 * <ul>
 *   <li>{@code sessions}, {@code idle-tcp}, {@code slowloris}: the attacks of issue 15 ({@link
 *       LocalAttacks}); the target is the Unix socket, the TCP address, the metrics port.</li>
 *   <li>{@code holds}: shares one 4 KiB lease and attaches to it again and again, from one new
 *       session after another (each kept alive by its stream), up to whatever bound refuses;
 *       revokes its token at the end.</li>
 *   <li>{@code tokens}: leases 4 KiB blocks and shares each with the longest life the daemon
 *       grants, releasing the lease (the token alone holds the block), up to {@value
 *       #MAX_TOKENS} tokens; exits without revoking them.</li>
 *   <li>{@code allowance}: opens a session with a client cache allowance of 4 KiB, leases eight
 *       1 MiB blocks and tells the daemon, again and again, that it cached them all and reused
 *       them all; watches its own session's client-cached bytes in ListSessions.</li>
 * </ul>
 *
 * <p>Prints {@code RESULT} with what each got: counts by call and outcome (OK or the status
 * code), and per call the description of its latest refusal (URL-encoded).
 */
public final class AbuseAttackMain {
  /** Leaves room under --max-shares-per-tenant (4096) for the holds attacker's own token. */
  static final int MAX_TOKENS = 2048;
  private static final long KIB = 1024;

  private final Map<String, Object> result = new LinkedHashMap<>();
  private final Map<String, Long> outcomes = new TreeMap<>();
  /** Per kind of call, the description of its latest refusal. */
  private final Map<String, String> lastRefusal = new TreeMap<>();

  private AbuseAttackMain() {}

  public static void main(String[] args) throws Exception {
    String mode = args[0];
    String target = args[1];
    long millis = TimeUnit.SECONDS.toMillis(Long.parseLong(args[2]));
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    AbuseAttackMain attacker = new AbuseAttackMain();
    attacker.result.put("mode", mode);
    switch (mode) {
      case "sessions" -> attacker.outcomes.putAll(LocalAttacks.sessionFlood(target, 8, millis));
      case "idle-tcp" -> {
        LocalAttacks.Idle idle = LocalAttacks.idleConnections(target, 3000, millis);
        attacker.result.put("opened", idle.opened());
        attacker.result.put("keptOpen", idle.keptOpen());
      }
      case "slowloris" -> {
        LocalAttacks.Slowloris slow = LocalAttacks.slowloris(Integer.parseInt(target), 40, millis);
        attacker.result.put("scrapesOk", slow.scrapesOk());
        attacker.result.put("maxScrapeMs", Math.round(slow.maxScrapeMs()));
        attacker.result.put("scrapesFailed", slow.scrapesFailed());
      }
      case "holds", "tokens", "allowance" -> {
        try (Channels.Connection connection = Channels.open(target)) {
          switch (mode) {
            case "holds" -> attacker.holds(connection, deadline);
            case "tokens" -> attacker.tokens(connection, deadline);
            default -> attacker.allowance(connection, deadline);
          }
        }
      }
      default -> throw new IllegalArgumentException("mode: " + mode
          + " (expected: sessions, idle-tcp, slowloris, holds, tokens or allowance)");
    }
    System.out.println(attacker.result());
  }

  private void holds(Channels.Connection connection, long deadline) throws InterruptedException {
    AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(connection.channel());
    List<RawKeepAlive> streams = new ArrayList<>();
    String owner = session(connection, allocator, "holds-owner", null, deadline, streams);
    String lease = lease(allocator, owner, 4 * KIB);
    String token = null;
    while (token == null && System.nanoTime() < deadline) {
      token = call("share", () -> allocator.withDeadlineAfter(5, TimeUnit.SECONDS).share(ShareRequest.newBuilder()
          .setSessionId(owner).setLeaseId(lease).setExpiresAfterSeconds(86_400).build()).getToken());
    }
    long holds = 0;
    long refusedFresh = 0;
    int sessions = 0;
    while (token != null && System.nanoTime() < deadline) {
      String s = session(connection, allocator, "holds", null, deadline, streams);
      if (s == null) {
        break;
      }
      sessions++;
      long onThis = 0;
      String t = token;
      while (System.nanoTime() < deadline && call("attach", () -> allocator.withDeadlineAfter(5, TimeUnit.SECONDS)
          .attach(AttachRequest.newBuilder().setSessionId(s).setToken(t).build())) != null) {
        onThis++;
      }
      holds += onThis;
      if (onThis == 0) {
        // A bound over the tenant's sessions, not this session's.
        refusedFresh++;
        result.put("freshRefusal", URLEncoder.encode(lastRefusal.getOrDefault("attach", ""), StandardCharsets.UTF_8));
        Thread.sleep(200);
      }
    }
    if (token != null) {
      String t = token;
      call("revoke", () -> allocator.withDeadlineAfter(5, TimeUnit.SECONDS).revokeShare(RevokeShareRequest.newBuilder()
          .setSessionId(owner).setToken(t).build()));
    }
    result.put("holds", holds);
    result.put("holdSessions", sessions);
    result.put("refusedOnFreshSession", refusedFresh);
    streams.forEach(s -> s.cancel("the attacker is done"));
  }

  private void tokens(Channels.Connection connection, long deadline) throws InterruptedException {
    AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(connection.channel());
    List<RawKeepAlive> streams = new ArrayList<>();
    String opened = session(connection, allocator, "tokens", null, deadline, streams);
    long tokens = 0;
    long longest = 0;
    while (opened != null && tokens < MAX_TOKENS && System.nanoTime() < deadline) {
      String s = opened;
      String lease = lease(allocator, s, 4 * KIB);
      if (lease == null && lastRefusal.getOrDefault("lease", "").contains("not found")) {
        // The session's 2 s TTL can pass before its stream attaches on a machine this loaded (all
        // attacks at once): every lease was then NOT_FOUND. A new session, as a client would.
        Thread.sleep(200);
        opened = session(connection, allocator, "tokens", null, deadline, streams);
        continue;
      }
      Integer granted = lease == null ? null : call("share", () -> allocator.withDeadlineAfter(5, TimeUnit.SECONDS)
          .share(ShareRequest.newBuilder().setSessionId(s).setLeaseId(lease).setExpiresAfterSeconds(86_400).build())
          .getExpiresAfterSeconds());
      if (lease != null) {
        call("release", () -> allocator.withDeadlineAfter(5, TimeUnit.SECONDS).release(ReleaseRequest.newBuilder()
            .setSessionId(s).setLeaseId(lease).build()));
      }
      if (granted == null) {
        Thread.sleep(200);
        continue;
      }
      tokens++;
      longest = Math.max(longest, granted);
    }
    result.put("tokens", tokens);
    result.put("longestSeconds", longest);
    streams.forEach(st -> st.cancel("the attacker is done"));
  }

  private void allowance(Channels.Connection connection, long deadline) throws InterruptedException {
    AllocatorGrpc.AllocatorBlockingStub allocator = AllocatorGrpc.newBlockingStub(connection.channel());
    AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(connection.channel());
    List<RawKeepAlive> streams = new ArrayList<>();
    String s = session(connection, allocator, "allowance", 4 * KIB, deadline, streams);
    if (s == null) {
      return;
    }
    RawKeepAlive stream = streams.get(0);
    KeepAliveRequest.Builder cache = KeepAliveRequest.newBuilder();
    KeepAliveRequest.Builder reuse = KeepAliveRequest.newBuilder();
    for (int i = 0; i < 8; i++) {
      String lease = lease(allocator, s, 1024 * KIB);
      if (lease != null) {
        cache.addCacheNotices(CacheNotice.newBuilder().setLeaseId(lease).setReused(false));
        reuse.addCacheNotices(CacheNotice.newBuilder().setLeaseId(lease).setReused(true));
      }
    }
    long rounds = 0;
    long allowance = -1;
    long mostCached = 0;
    while (System.nanoTime() < deadline && stream.closedWith() == null) {
      stream.send(cache.build());
      Thread.sleep(100);
      // Not every round: the listing pages through every session of this tenant, floods included.
      for (SessionInfo info : rounds % 10 == 0 ? AdminQueries.sessions(admin) : List.<SessionInfo>of()) {
        if (info.getSessionId().equals(s)) {
          allowance = info.getClientCacheAllowanceBytes();
          mostCached = Math.max(mostCached, info.getClientCachedBytes());
        }
      }
      stream.send(reuse.build());
      Thread.sleep(100);
      rounds++;
    }
    result.put("rounds", rounds);
    result.put("allowance", allowance);
    result.put("mostClientCached", mostCached);
    result.put("noticesRefused", stream.events(SessionEvent.EventCase.RELEASE_FAILED));
    streams.forEach(st -> st.cancel("the attacker is done"));
  }

  /** Opens a session and its KeepAlive stream (read as it comes), or returns null when none could be opened. */
  private String session(Channels.Connection connection, AllocatorGrpc.AllocatorBlockingStub allocator, String name,
      Long cacheBytes, long deadline, List<RawKeepAlive> streams) throws InterruptedException {
    String s = KeepAliveFloodMain.openSession(allocator, name, 0, cacheBytes, deadline);
    if (s != null) {
      RawKeepAlive stream = new RawKeepAlive(connection.channel());
      stream.startReading();
      stream.send(KeepAliveRequest.newBuilder().setSessionId(s).build());
      streams.add(stream);
    }
    return s;
  }

  private String lease(AllocatorGrpc.AllocatorBlockingStub allocator, String session, long bytes) {
    return session == null ? null : call("lease", () -> allocator.withDeadlineAfter(5, TimeUnit.SECONDS)
        .lease(LeaseRequest.newBuilder().setSessionId(session).setDevice(0).setSizeBytes(bytes).build()).getLeaseId());
  }

  /** Runs one call, counting its outcome under {@code what}; null when it was refused. */
  private <T> T call(String what, java.util.function.Supplier<T> call) {
    try {
      T value = call.get();
      outcomes.merge(what + ":OK", 1L, Long::sum);
      return value;
    } catch (StatusRuntimeException e) {
      outcomes.merge(what + ":" + e.getStatus().getCode(), 1L, Long::sum);
      lastRefusal.put(what, String.valueOf(e.getStatus().getDescription()));
      return null;
    }
  }

  private String result() {
    StringBuilder line = new StringBuilder("RESULT");
    result.forEach((k, v) -> line.append(' ').append(k).append('=').append(v));
    line.append(" outcomes=").append(outcomes.isEmpty() ? "-" : String.join(",", outcomes.entrySet().stream()
        .map(e -> e.getKey() + ":" + e.getValue()).toList()));
    lastRefusal.forEach((what, why) -> line.append(" refusal.").append(what).append('=')
        .append(URLEncoder.encode(why, StandardCharsets.UTF_8)));
    return line.toString();
  }
}
