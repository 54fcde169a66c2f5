package io.gpumemd.it.sleep;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.SleepHandler;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A client process that an admin puts to sleep and wakes (gpumemctl sleep/wake): leases {@code
 * count} blocks of {@code size} bytes, fills each with its own pattern, registers a {@link
 * SleepHandler} and prints {@code LEASED <session id>}. Its pause prints {@code PAUSED <level>
 * <tags>} (or, with {@code refuse}, refuses); its resume prints {@code RESUMED}. Once resumed it
 * checks every buffer it was handed before: the same address, and its pattern, then prints
 * {@code RESULT pauses=N resumes=N sameAddresses=B contents=kept|differ asleep=N}, gives
 * everything back and exits. It gives up after 60 s.
 *
 * <p>Usage: {@code AskedSleeperMain target count size accept|refuse}
 */
public final class AskedSleeperMain {
  private AskedSleeperMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    int count = Integer.parseInt(args[1]);
    long size = Long.parseLong(args[2]);
    boolean refuse = args[3].equals("refuse");
    GpuMemClient client = GpuMemClient.builder(target).clientName("asked-sleeper").connect();
    List<Lease> leases = new ArrayList<>();
    List<ByteBuffer> buffers = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      Lease lease = client.lease(0, size, false, "weights");
      leases.add(lease);
      buffers.add(lease.buffer());
      SleeperMain.fill(buffers.get(i), i);
    }
    List<Long> addresses = SleeperMain.addresses(leases);
    AtomicInteger pauses = new AtomicInteger();
    AtomicInteger resumes = new AtomicInteger();
    CountDownLatch resumed = new CountDownLatch(1);
    client.onSleepAsked(new SleepHandler() {
      @Override
      public void pause(int level, List<String> tags) {
        if (refuse) {
          System.out.println("REFUSING");
          throw new IllegalStateException("a batch is running");
        }
        pauses.incrementAndGet();
        // The work would stop here; from now on the buffers are not touched until resume.
        System.out.println("PAUSED " + level + " " + tags);
      }

      @Override
      public void resume() {
        resumes.incrementAndGet();
        System.out.println("RESUMED");
        resumed.countDown();
      }
    });
    System.out.println("LEASED " + client.sessionId());
    if (!resumed.await(60, TimeUnit.SECONDS)) {
      System.out.println("RESULT never-resumed");
      Runtime.getRuntime().halt(3);
    }
    boolean kept = SleeperMain.patterned(buffers);
    System.out.println("RESULT pauses=" + pauses.get() + " resumes=" + resumes.get() + " sameAddresses="
        + addresses.equals(SleeperMain.addresses(leases)) + " contents=" + (kept ? "kept" : "differ") + " asleep="
        + client.sleepingSegments());
    leases.forEach(Lease::close);
    client.close();
  }
}
