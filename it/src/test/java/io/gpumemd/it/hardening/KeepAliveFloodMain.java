package io.gpumemd.it.hardening;

import io.gpumemd.client.Channels;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.CacheNotice;
import io.gpumemd.proto.v1.ClientCacheCounters;
import io.gpumemd.proto.v1.KeepAliveRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.gpumemd.proto.v1.SessionEvent;
import io.gpumemd.proto.v1.StreamLease;
import io.gpumemd.proto.v1.StreamRelease;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A hostile tenant on its KeepAlive stream, written with the raw generated stubs (the client
 * library behaves; this does not). Run by {@link ReplyFloodTest} and {@link AbuseSoakTest} as
 * uid 65534. Usage: {@code KeepAliveFloodMain target mode seconds patienceMs}, modes:
 *
 * <ul>
 *   <li>{@code release}, {@code notice}, {@code lease}: the reply floods of issue 22. In rounds
 *       until {@code seconds} have passed: open a session, open its stream, then send messages
 *       of {@value #ENTRIES} entries as fast as the transport takes them (empty StreamReleases,
 *       each answered by a ReleaseFailed; CacheNotices for a lease that does not exist; or
 *       StreamLeases of size 0) and never read the stream. A round ends once the transport has
 *       taken nothing for {@code patienceMs} (so a daemon that cuts the stream off after a
 *       shorter stall has done so); only then does the attacker read what is queued, to the
 *       stream's status, for at most {@value #READ_MILLIS} ms, and cancel it if still open.</li>
 *   <li>{@code huge}: one message of {@value #HUGE_ENTRIES} empty StreamReleases (about 800 KB,
 *       under the default --max-message-bytes) after the binding message; then reads.</li>
 *   <li>{@code counters}: from two sessions, ClientCacheCounters of Long.MAX_VALUE hits and
 *       returns for devices 0 and 1, every 20 ms for {@code seconds}.</li>
 * </ul>
 *
 * <p>Prints {@code RESULT} with: rounds, sent (messages), sentPerRound, sessions, statuses (per
 * round: the status code, OPEN when the stream was still open after the read, NONE when no
 * session could be opened), message (the first round's status description, URL-encoded),
 * stalls (rounds in which the transport took nothing for a whole second), sentBeforeStall (in
 * the first round), readBeforeAsked (events delivered before the attacker asked: 0, or it was
 * not an attack that never reads), eventsRead, releaseFailed, leaseReplies.
 */
public final class KeepAliveFloodMain {
  /** Entries per flood message: the most the daemon accepts in one KeepAlive message. */
  static final int ENTRIES = 8192;
  static final int HUGE_ENTRIES = 400_000;
  static final long READ_MILLIS = 5000;
  private static final String UNKNOWN_LEASE = "deadbeef".repeat(4);
  /**
   * The TTL a flooding session asks for: it matters only until its stream binds (then the grace
   * period does), and a cold attacker JVM among ten starting at once on a small machine can take
   * seconds to get there; the soak's short default TTL (2 s) then expired the first round's
   * session before its stream bound (NOT_FOUND instead of the cut-off). The daemon grants at
   * most its --max-session-ttl-seconds (5 in the soak); 30 is its default elsewhere.
   */
  private static final int STREAM_SESSION_TTL_SECONDS = 30;

  private final AllocatorGrpc.AllocatorBlockingStub allocator;
  private final Channels.Connection connection;
  private final List<String> sessions = new ArrayList<>();
  private final List<String> statuses = new ArrayList<>();
  private final List<Long> sentPerRound = new ArrayList<>();
  private String firstMessage = "-";
  private long stalls;
  private long sentBeforeStall = -1;
  private long readBeforeAsked;
  private long eventsRead;
  private long releaseFailed;
  private long leaseReplies;

  private KeepAliveFloodMain(Channels.Connection connection) {
    this.connection = connection;
    this.allocator = AllocatorGrpc.newBlockingStub(connection.channel());
  }

  public static void main(String[] args) throws Exception {
    String target = args[0];
    String mode = args[1];
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[2]));
    long patienceMs = Long.parseLong(args[3]);
    try (Channels.Connection connection = Channels.open(target)) {
      KeepAliveFloodMain attacker = new KeepAliveFloodMain(connection);
      switch (mode) {
        case "release", "notice", "lease" -> {
          KeepAliveRequest flood = floodMessage(mode, ENTRIES);
          do {
            attacker.floodRound(flood, deadline, patienceMs);
          } while (System.nanoTime() < deadline);
        }
        case "huge" -> attacker.oneMessage(floodMessage("release", HUGE_ENTRIES));
        case "counters" -> attacker.counters(deadline);
        default -> throw new IllegalArgumentException("mode: " + mode
            + " (expected: release, notice, lease, huge or counters)");
      }
      System.out.println(attacker.result(mode));
    }
  }

  static KeepAliveRequest floodMessage(String mode, int entries) {
    KeepAliveRequest.Builder m = KeepAliveRequest.newBuilder();
    for (int i = 0; i < entries; i++) {
      switch (mode) {
        case "release" -> m.addReleases(StreamRelease.getDefaultInstance());
        case "notice" -> m.addCacheNotices(CacheNotice.newBuilder().setLeaseId(UNKNOWN_LEASE));
        case "lease" -> m.addLeases(StreamLease.newBuilder().setRequestId(i).setDevice(0).setSizeBytes(0));
        default -> throw new IllegalArgumentException(mode);
      }
    }
    return m.build();
  }

  /** Opens a session, retrying while the daemon refuses (its open rate, the tenant's session bound). */
  static String openSession(AllocatorGrpc.AllocatorBlockingStub allocator, String name, int ttlSeconds, Long cacheBytes,
      long deadline) throws InterruptedException {
    OpenSessionRequest.Builder request = OpenSessionRequest.newBuilder().setClientName(name).setTtlSeconds(ttlSeconds);
    if (cacheBytes != null) {
      request.setClientCacheBytes(cacheBytes);
    }
    // A little past the deadline: a round that starts just before it still gets its session.
    long giveUp = deadline + TimeUnit.SECONDS.toNanos(5);
    while (true) {
      try {
        return allocator.withDeadlineAfter(5, TimeUnit.SECONDS).openSession(request.build()).getSessionId();
      } catch (StatusRuntimeException e) {
        if (System.nanoTime() > giveUp) {
          return null;
        }
        Thread.sleep(50);
      }
    }
  }

  private void floodRound(KeepAliveRequest flood, long deadline, long patienceMs) throws InterruptedException {
    String session = openSession(allocator, "reply-flood", STREAM_SESSION_TTL_SECONDS, null, deadline);
    if (session == null) {
      statuses.add("NONE");
      sentPerRound.add(0L);
      return;
    }
    sessions.add(session);
    RawKeepAlive stream = new RawKeepAlive(connection.channel());
    stream.send(KeepAliveRequest.newBuilder().setSessionId(session).build());
    long sent = 0;
    long lastSend = System.nanoTime();
    boolean stalled = false;
    // A round that began just before the deadline floods on until its first stall (or 10 s more), so
    // that every round's stream has had replies left unread.
    long hardStop = deadline + TimeUnit.SECONDS.toNanos(10);
    while (System.nanoTime() - lastSend < TimeUnit.MILLISECONDS.toNanos(patienceMs) && stream.closedWith() == null) {
      long now = System.nanoTime();
      if (now >= deadline && (stalled || now >= hardStop)) {
        Thread.sleep(50); // time is up: no more sends, but the round waits out its patience
      } else if (stream.ready()) {
        stream.send(flood);
        sent++;
        lastSend = System.nanoTime();
      } else if (!stream.awaitReady(1000) && !stalled) {
        stalled = true;
        stalls++;
        if (sentBeforeStall < 0) {
          sentBeforeStall = sent;
        }
      }
    }
    sentPerRound.add(sent);
    finish(stream);
  }

  private void oneMessage(KeepAliveRequest message) throws InterruptedException {
    String session = openSession(allocator, "huge-message", STREAM_SESSION_TTL_SECONDS, null, System.nanoTime());
    if (session == null) {
      statuses.add("NONE");
      return;
    }
    sessions.add(session);
    RawKeepAlive stream = new RawKeepAlive(connection.channel());
    stream.send(KeepAliveRequest.newBuilder().setSessionId(session).build());
    stream.send(message);
    sentPerRound.add(1L);
    finish(stream);
  }

  /** Two sessions, so that the daemon's sums overflow even where one session's figure alone would not. */
  private void counters(long deadline) throws InterruptedException {
    List<RawKeepAlive> streams = new ArrayList<>();
    List<KeepAliveRequest> messages = new ArrayList<>();
    for (int i = 0; i < 2; i++) {
      String session = openSession(allocator, "counters", STREAM_SESSION_TTL_SECONDS, null, deadline);
      if (session == null) {
        statuses.add("NONE");
        continue;
      }
      sessions.add(session);
      KeepAliveRequest.Builder m = KeepAliveRequest.newBuilder().setSessionId(session);
      for (int device = 0; device < 2; device++) {
        m.addClientCounters(ClientCacheCounters.newBuilder().setDevice(device).setHits(Long.MAX_VALUE)
            .setReturns(Long.MAX_VALUE));
      }
      messages.add(m.build());
      streams.add(new RawKeepAlive(connection.channel()));
    }
    long sent = 0;
    while (System.nanoTime() < deadline && streams.stream().allMatch(s -> s.closedWith() == null)) {
      for (int i = 0; i < streams.size(); i++) {
        streams.get(i).send(messages.get(i));
        sent++;
      }
      Thread.sleep(20);
    }
    sentPerRound.add(sent);
    for (RawKeepAlive stream : streams) {
      finish(stream, 500); // nothing is queued: its only reply is the binding's
    }
  }

  /** Reads what the daemon queued, to the stream's status (or gives up and cancels), and records it. */
  private void finish(RawKeepAlive stream) throws InterruptedException {
    finish(stream, READ_MILLIS);
  }

  private void finish(RawKeepAlive stream, long readMillis) throws InterruptedException {
    readBeforeAsked += stream.readBeforeAsked();
    Status status = stream.readToEnd(readMillis);
    if (status == null) {
      stream.cancel("the attacker is done");
    }
    statuses.add(status == null ? "OPEN" : status.getCode().name());
    if (statuses.size() == 1 && status != null && status.getDescription() != null) {
      firstMessage = URLEncoder.encode(status.getDescription(), StandardCharsets.UTF_8);
    }
    eventsRead += stream.eventsRead();
    releaseFailed += stream.events(SessionEvent.EventCase.RELEASE_FAILED);
    leaseReplies += stream.events(SessionEvent.EventCase.LEASE_REPLY);
  }

  private String result(String mode) {
    Map<String, Object> r = new LinkedHashMap<>();
    r.put("mode", mode);
    r.put("rounds", statuses.size());
    r.put("sent", sentPerRound.stream().mapToLong(Long::longValue).sum());
    r.put("sentPerRound", join(sentPerRound));
    r.put("sessions", sessions.isEmpty() ? "-" : String.join(",", sessions));
    r.put("statuses", join(statuses));
    r.put("message", firstMessage);
    r.put("stalls", stalls);
    r.put("sentBeforeStall", sentBeforeStall);
    r.put("readBeforeAsked", readBeforeAsked);
    r.put("eventsRead", eventsRead);
    r.put("releaseFailed", releaseFailed);
    r.put("leaseReplies", leaseReplies);
    StringBuilder line = new StringBuilder("RESULT");
    r.forEach((k, v) -> line.append(' ').append(k).append('=').append(v));
    return line.toString();
  }

  private static String join(List<?> values) {
    return values.isEmpty() ? "-" : String.join(",", values.stream().map(String::valueOf).toList());
  }
}
