package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/**
 * The hand-over gate: closing it waits for the work in progress (and the work it started) and
 * lets no new work in; a wait that runs out says how much is left; opening it again lets work in.
 */
class HandOverGateTest {
  @Test
  void close_waitsForWorkInProgress_andRefusesNewWork() throws Exception {
    HandOverGate gate = new HandOverGate();
    assertTrue(gate.enter());
    gate.join(); // a lease the message started, answered later
    CompletableFuture<Integer> closed = CompletableFuture.supplyAsync(() -> {
      try {
        return gate.close(10_000);
      } catch (InterruptedException e) {
        throw new IllegalStateException(e);
      }
    });
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!gate.closed() && System.nanoTime() < deadline) {
      Thread.sleep(1);
    }
    assertTrue(gate.closed());
    assertFalse(gate.enter(), "new work refused while closed");
    gate.exit(); // the message is done, its lease is not
    Thread.sleep(50);
    assertFalse(closed.isDone(), "the close returned with a lease in progress");
    gate.exit();
    assertEquals(0, closed.get(10, TimeUnit.SECONDS));
    gate.open();
    assertTrue(gate.enter(), "work let in again once the hand-over did not happen");
    gate.exit();
  }

  @Test
  void close_thatRunsOut_saysHowMuchIsLeft() throws Exception {
    HandOverGate gate = new HandOverGate();
    assertTrue(gate.enter());
    assertTrue(gate.enter());
    assertEquals(2, gate.close(50));
    assertTrue(gate.closed());
    gate.open();
    gate.exit();
    gate.exit();
    assertEquals(0, gate.close(0));
  }

  @Test
  void close_withNothingInProgress_isQuiescent_whileRefusedRequestsKeepComing() throws Exception {
    HandOverGate gate = new HandOverGate();
    assertEquals(0, gate.close(0));
    // Requests refused at the closed gate count and take it back (enter): none of them is work
    // in progress, and the close must not report one.
    AtomicBoolean stop = new AtomicBoolean();
    AtomicLong refused = new AtomicLong();
    Thread knocking = new Thread(() -> {
      while (!stop.get()) {
        if (!gate.enter()) {
          refused.incrementAndGet();
        }
      }
    });
    knocking.start();
    // At least 2,000 closes, and on until the knocking thread has been refused 1,000 times: on a
    // loaded machine the closes could all run before that thread got a core (then nothing raced).
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    try {
      for (int i = 0; i < 2_000 || (refused.get() < 1_000 && System.nanoTime() < deadline); i++) {
        assertEquals(0, gate.close(1_000), "close " + i + " reported work in progress with none");
      }
    } finally {
      stop.set(true);
      knocking.join(10_000);
    }
    assertTrue(refused.get() > 0, "the requests were refused at the closed gate");
  }
}
