package io.gpumemd.it.e2e;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.grpc.Status;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A worker process for {@link RestartSoakTest}: one long-lived client that, per iteration,
 * leases a block (every fourth one zeroed, and checked to read as zeros), writes the
 * iteration's pattern over all of it, holds it a while, checks the pattern and releases it. An
 * iteration that meets a daemon restart (UNAVAILABLE, or its lease seen lost) is retried (after
 * 50 ms when the daemon said it is shutting down); any other failure ends the process with exit
 * 1.
 *
 * <p>The test paces it: a line on stdin with a number allows iterations up to that number, so
 * that the worker cannot run ahead of the restarts. Each finished iteration prints
 * {@code ITER n session=<id> lease=<id>}; the end prints {@code RESULT iterations=N
 * corruptions=C retries=R draining=D} (D: refusals from a draining daemon, not in R) and exits 0 when all iterations were done.
 *
 * <p>Usage: {@code RestartWorkerMain target clientName iterations holdMs}
 */
public final class RestartWorkerMain {
  private static final long RUN_LIMIT_MS = 120_000;

  private RestartWorkerMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    String name = args[1];
    int iterations = Integer.parseInt(args[2]);
    long holdMs = Long.parseLong(args[3]);
    AtomicInteger allowed = new AtomicInteger();
    Thread gate = new Thread(() -> {
      try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
        String line;
        while ((line = in.readLine()) != null) {
          allowed.set(Integer.parseInt(line.trim()));
        }
      } catch (Exception e) {
        // stdin gone: no more iterations are allowed
      }
    }, "gate");
    gate.setDaemon(true);
    gate.start();

    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RUN_LIMIT_MS);
    long corruptions = 0;
    long retries = 0;
    long draining = 0;
    try (GpuMemClient client = GpuMemClient.builder(target).clientName(name).connect()) {
      for (int i = 1; i <= iterations; i++) {
        while (allowed.get() < i) {
          if (System.nanoTime() > deadline) {
            fail("not allowed past iteration " + (i - 1) + " within " + RUN_LIMIT_MS + " ms");
          }
          Thread.sleep(5);
        }
        long size = 64 * 1024 + (i % 7) * 40_000L + 8;
        boolean zero = i % 4 == 0;
        long pattern = 0x5EED_0000_0000_0000L | ((long) i << 16) | (i % 251);
        while (true) {
          if (System.nanoTime() > deadline) {
            fail("iteration " + i + " did not complete within the run limit (" + retries + " retries)");
          }
          Lease lease;
          ByteBuffer memory;
          try {
            lease = client.lease(i % 2, size, zero, "restart-" + i);
            memory = lease.buffer();
          } catch (GpuMemException e) {
            if (e.code() != Status.Code.UNAVAILABLE) {
              throw e;
            }
            if (String.valueOf(e.getMessage()).contains("shutting down")) {
              // The daemon drains before it exits: refusals until it is gone. Wait a little.
              draining++;
              Thread.sleep(50);
              continue;
            }
            retries++;
            System.out.println("RETRY " + i + " lease: " + e.getMessage());
            continue;
          } catch (IllegalStateException e) {
            if (!String.valueOf(e.getMessage()).contains("session lost")) {
              throw e;
            }
            retries++;
            System.out.println("RETRY " + i + " buffer: " + e.getMessage());
            continue;
          }
          String session = client.sessionId();
          // The buffer stays readable even if the session is lost meanwhile: the client never
          // unmaps a host segment of a dead lease, and no daemon truncates its file. So any byte
          // that differs below is a corruption, restart or not.
          if (zero && !zeros(memory)) {
            corruptions++;
            System.out.println("CORRUPT " + i + " zero lease " + lease.id() + " holds non-zero bytes");
          }
          fill(memory, pattern);
          Thread.sleep(holdMs);
          if (!holds(memory, pattern)) {
            corruptions++;
            System.out.println("CORRUPT " + i + " lease " + lease.id() + " lost its pattern");
          }
          boolean lost = lease.isLost();
          lease.close();
          if (lost) {
            // The daemon went away while we held it: the iteration did not complete on a live
            // session; do it again on the next one.
            retries++;
            System.out.println("RETRY " + i + " lost while held: " + lease.id());
            continue;
          }
          System.out.println("ITER " + i + " session=" + session + " lease=" + lease.id());
          break;
        }
      }
    } catch (RuntimeException e) {
      e.printStackTrace(System.out);
      fail("unexpected failure: " + e);
    }
    System.out.println("RESULT iterations=" + iterations + " corruptions=" + corruptions + " retries=" + retries
        + " draining=" + draining);
    System.out.flush();
    System.exit(0);
  }

  private static void fail(String why) {
    System.out.println("FAILED " + why);
    System.out.flush();
    System.exit(1);
  }

  private static void fill(ByteBuffer b, long pattern) {
    int i = 0;
    for (; i + 8 <= b.capacity(); i += 8) {
      b.putLong(i, pattern ^ i);
    }
    for (; i < b.capacity(); i++) {
      b.put(i, (byte) pattern);
    }
  }

  private static boolean holds(ByteBuffer b, long pattern) {
    int i = 0;
    for (; i + 8 <= b.capacity(); i += 8) {
      if (b.getLong(i) != (pattern ^ i)) {
        return false;
      }
    }
    for (; i < b.capacity(); i++) {
      if (b.get(i) != (byte) pattern) {
        return false;
      }
    }
    return true;
  }

  private static boolean zeros(ByteBuffer b) {
    for (int i = 0; i < b.capacity(); i++) {
      if (b.get(i) != 0) {
        return false;
      }
    }
    return true;
  }
}
