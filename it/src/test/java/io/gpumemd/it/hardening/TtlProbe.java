package io.gpumemd.it.hardening;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.grpc.Channel;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;

/**
 * Checks that the session reaper keeps running: again and again, opens a session with a 1 s TTL
 * and no keep-alive, leases 4 KiB on it, and measures how long after that last call the session
 * and its lease are gone from the listings (the reaper runs every 100 ms, so about 1.1 s on a
 * healthy daemon; never, once the reaper has died). A probe whose session outlives {@value
 * #GIVE_UP_MS} ms, or whose calls fail, is recorded as a failure. Thread-safe: one thread of its
 * own probes; any thread reads.
 */
final class TtlProbe implements AutoCloseable {
  private static final long GIVE_UP_MS = 10_000;

  private final AllocatorGrpc.AllocatorBlockingStub allocator;
  private final AdminGrpc.AdminBlockingStub admin;
  private final List<Long> expiryMillis = Collections.synchronizedList(new ArrayList<>());
  private final List<String> failures = Collections.synchronizedList(new ArrayList<>());
  private final Thread thread;
  private volatile boolean running = true;

  TtlProbe(Channel channel) {
    allocator = AllocatorGrpc.newBlockingStub(channel);
    admin = AdminGrpc.newBlockingStub(channel);
    thread = new Thread(this::run, "ttl-probe");
    thread.setDaemon(true);
    thread.start();
  }

  private void run() {
    while (running) {
      try {
        probeOnce();
        Thread.sleep(500);
      } catch (InterruptedException e) {
        return;
      } catch (RuntimeException e) {
        if (running) {
          failures.add(e.toString());
        }
      }
    }
  }

  private void probeOnce() throws InterruptedException {
    String session = allocator.withDeadlineAfter(5, TimeUnit.SECONDS).openSession(OpenSessionRequest.newBuilder()
        .setClientName("ttl-probe").setTtlSeconds(1).build()).getSessionId();
    allocator.withDeadlineAfter(5, TimeUnit.SECONDS).lease(LeaseRequest.newBuilder().setSessionId(session)
        .setDevice(0).setSizeBytes(4096).setTag("ttl-probe").build());
    long touched = System.nanoTime();
    Set<String> live = AdminQueries.awaitEnded(admin, Set.of(session), GIVE_UP_MS);
    long took = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - touched);
    if (!live.isEmpty()) {
      failures.add("a session with a 1 s TTL still live after " + took + " ms");
      return;
    }
    int leases = admin.withDeadlineAfter(5, TimeUnit.SECONDS).listLeases(ListLeasesRequest.newBuilder()
        .setSessionId(session).build()).getLeasesCount();
    if (leases != 0) {
      failures.add("the expired session's lease is still listed");
    }
    expiryMillis.add(took);
  }

  /** How long each probe's session took to end after its last call, in milliseconds. */
  List<Long> expiryMillis() {
    synchronized (expiryMillis) {
      return List.copyOf(expiryMillis);
    }
  }

  List<String> failures() {
    synchronized (failures) {
      return List.copyOf(failures);
    }
  }

  @Override
  public void close() throws InterruptedException {
    running = false;
    thread.join(GIVE_UP_MS + 10_000);
  }
}
