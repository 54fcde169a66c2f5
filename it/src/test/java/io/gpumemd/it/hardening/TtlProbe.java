package io.gpumemd.it.hardening;

import io.gpumemd.proto.v1.AdminGrpc;
import io.gpumemd.proto.v1.AllocatorGrpc;
import io.gpumemd.proto.v1.LeaseRequest;
import io.gpumemd.proto.v1.ListLeasesRequest;
import io.gpumemd.proto.v1.OpenSessionRequest;
import io.grpc.Channel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Checks that the session reaper keeps running: again and again, opens a session with a 1 s TTL
 * and no keep-alive, leases 4 KiB on it, and measures how long after that last call the session
 * and its lease are gone from the listings (the reaper runs every 100 ms, so about 1.1 s on a
 * healthy daemon; never, once the reaper has died). A probe whose session outlives {@value
 * #GIVE_UP_MS} ms, or whose calls fail, is recorded as a failure.
 *
 * <p>Its lease refused NOT_FOUND is a failure only when it came back within the TTL of sending
 * the OpenSession: then the session ended early. Later, the TTL may truly have passed between
 * the two calls (this probe, or the daemon's handling of its lease, starved of CPU for a second
 * by the attackers on a small machine): the reaper did its job, and the probe is counted as
 * {@link #late()}, not measured. Thread-safe: one thread of its own probes; any thread reads.
 */
final class TtlProbe implements AutoCloseable {
  private static final long GIVE_UP_MS = 10_000;
  private static final int TTL_SECONDS = 1;

  private final AllocatorGrpc.AllocatorBlockingStub allocator;
  private final AdminGrpc.AdminBlockingStub admin;
  private final List<Long> expiryMillis = Collections.synchronizedList(new ArrayList<>());
  private final List<String> failures = Collections.synchronizedList(new ArrayList<>());
  private final AtomicInteger late = new AtomicInteger();
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
    long opening = System.nanoTime();
    String session = allocator.withDeadlineAfter(5, TimeUnit.SECONDS).openSession(OpenSessionRequest.newBuilder()
        .setClientName("ttl-probe").setTtlSeconds(TTL_SECONDS).build()).getSessionId();
    try {
      allocator.withDeadlineAfter(5, TimeUnit.SECONDS).lease(LeaseRequest.newBuilder().setSessionId(session)
          .setDevice(0).setSizeBytes(4096).setTag("ttl-probe").build());
    } catch (StatusRuntimeException e) {
      long sinceOpening = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - opening);
      if (e.getStatus().getCode() == Status.Code.NOT_FOUND && sinceOpening > TTL_SECONDS * 1000L) {
        late.incrementAndGet(); // the TTL passed before the lease was served: expired as it should
        return;
      }
      throw e;
    }
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

  /** Probes whose lease was served only after their session's TTL had passed (see the class notes). */
  int late() {
    return late.get();
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
