package io.gpumemd.it.sharing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.client.SleepResult;
import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Sleep of a published block with real processes on the host backend (issue 35 item 4): a
 * holder process ({@link SharingClientMain}) maps the published weights; their owner sleeps,
 * which waits for that holder; the holder releases during the wait and the sleep completes; a
 * lookup meanwhile is refused naming the sleep; after the wake a new process looks the name up
 * and reads the bytes from the woken block.
 */
class SharedSleepProcessTest {
  private static final long MIB = 1 << 20;
  private static final int SEED = 71;

  @Test
  void holderReleasesDuringTheWait_theSleepCompletes_andANewProcessReadsTheWokenBytes() throws Exception {
    // A wait long enough that the holder's release surely comes within it on a loaded machine;
    // the sleep ends as soon as the release does.
    try (TestDaemon daemon = TestDaemon.start("--unmap-wait-ms", "120000");
         GpuMemClient owner = GpuMemClient.builder(daemon.unixTarget()).clientName("owner").connect();
         GpuMemClient probe = GpuMemClient.builder(daemon.unixTarget()).clientName("probe").connect()) {
      Lease weights = owner.lease(0, 2 * MIB, false, "weights");
      SharingClientMain.fill(weights.buffer(), SEED);
      long segmentBefore = weights.segmentId();
      owner.publish(weights, "model/sleepy", true);
      try (HolderProcess holder = HolderProcess.start("lookup", daemon.unixTarget(), "model/sleepy", SEED)) {
        assertEquals("true", holder.await("READY").get("intact"), holder.output());

        CompletableFuture<SleepResult> sleep = CompletableFuture.supplyAsync(() -> owner.sleep(1));
        String refusal = awaitSleepRefusal(probe, sleep);
        assertTrue(refusal.contains("object 'model/sleepy' sleeps with"), refusal);
        assertFalse(sleep.isDone(), "the sleep waits for the holder");
        holder.ask("release", "RELEASED");
        SleepResult slept = sleep.get(60, TimeUnit.SECONDS);

        assertEquals(List.of(weights.id()), slept.leaseIds());
        assertTrue(weights.isAsleep());
        GpuMemException asleep = lookupRefused(probe);
        assertEquals(Status.Code.FAILED_PRECONDITION, asleep.code());
        assertTrue(asleep.getMessage().contains("comes back when that session wakes"), asleep.getMessage());
        holder.exit();
      }

      owner.wake();
      try (HolderProcess fresh = HolderProcess.start("lookup", daemon.unixTarget(), "model/sleepy", SEED)) {
        Map<String, String> ready = fresh.await("READY");
        assertEquals("true", ready.get("intact"), "the new process reads the woken bytes: " + fresh.output());
        assertNotEquals(Long.toString(segmentBefore), ready.get("segment"), "the woken block, in a new segment");
        assertEquals(Long.toString(weights.offset()), ready.get("offset"), "at the lease's old offset");
        fresh.ask("release", "RELEASED");
        fresh.exit();
      }
      assertFalse(owner.unpublish("model/sleepy"), "the owner's lease still holds the block");
      weights.close();
      daemon.verifyInvariants();
    }
  }

  /** Looks the name up until a sleep refuses it (the sleep has closed the block); its message. */
  private static String awaitSleepRefusal(GpuMemClient probe, CompletableFuture<SleepResult> sleep)
      throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
    while (System.nanoTime() < deadline) {
      try {
        probe.lookup("model/sleepy").close();
      } catch (GpuMemException e) {
        if (e.code() == Status.Code.FAILED_PRECONDITION) {
          return e.getMessage();
        }
        throw e;
      }
      if (sleep.isDone()) {
        throw new AssertionError("the sleep ended before the holder released: " + sleep.get());
      }
      Thread.sleep(5);
    }
    throw new AssertionError("no lookup was refused for the sleep within 60 s");
  }

  private static GpuMemException lookupRefused(GpuMemClient probe) {
    try {
      probe.lookup("model/sleepy").close();
    } catch (GpuMemException e) {
      return e;
    }
    throw new AssertionError("a lookup of a sleeping object was not refused");
  }
}
