package io.gpumemd.it.e2e;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * A client process for {@link MixedWorkloadSoakTest}: for a given time, a random mix of leases
 * (512 B to 4 MiB, log-uniform, on either device; some zeroed and checked to read as zeros; some
 * asked for with {@code leaseAsync}), a pattern written into each, checks of the patterns of
 * the blocks held (up to 12 at once), releases (some with {@code closeAsync}), and now and then
 * closing the client and opening a new one, each with its own options: the Unix socket or TCP,
 * the session stream or the unary calls, with or without the client cache tier.
 *
 * <p>A pattern is a per-lease 64-bit value XORed with the offset, written every 64 bytes, and
 * its complement in the last 8 bytes: a block leased to two holders at once, or handed out with another's bytes, or
 * read through the wrong mapping, shows. Every mismatch prints {@code CORRUPT ...} at once (the
 * parent reads them even from a process it kills); the end prints {@code RESULT ops=N ...} and
 * exits 0. RESOURCE_EXHAUSTED is counted, not a failure; any other error exits 1.
 *
 * <p>Usage: {@code MixedWorkloadMain unixTarget tcpTarget name seed millis}
 */
public final class MixedWorkloadMain {
  private static final int MAX_HELD = 12;
  private static final long MAX_SIZE = 4L << 20;
  private static final int STRIDE = 64;

  private final String unixTarget;
  private final String tcpTarget;
  private final String name;
  private final SplittableRandom random;
  private final List<Held> held = new ArrayList<>();
  private GpuMemClient client;
  private long counter;
  private long ops;
  private long leases;
  private long zeroLeases;
  private long asyncLeases;
  private long unaryLeases;
  private long streamLeases;
  private long exhausted;
  private long reopens;
  private long checks;
  private long corruptions;
  private boolean unary;

  private record Held(Lease lease, ByteBuffer memory, long pattern) {}

  private MixedWorkloadMain(String unixTarget, String tcpTarget, String name, long seed) {
    this.unixTarget = unixTarget;
    this.tcpTarget = tcpTarget;
    this.name = name;
    this.random = new SplittableRandom(seed);
  }

  public static void main(String[] args) throws Exception {
    MixedWorkloadMain main = new MixedWorkloadMain(args[0], args[1], args[2], Long.parseLong(args[3]));
    long millis = Long.parseLong(args[4]);
    try {
      main.run(millis);
    } catch (Throwable t) {
      System.out.println("FAILED " + t);
      t.printStackTrace(System.out);
      System.out.flush();
      System.exit(1);
    }
    System.out.println(main.result());
    System.out.flush();
    System.exit(0);
  }

  /** Works for {@code millis} from the first connect (a JVM on a busy machine starts slowly). */
  private void run(long millis) throws Exception {
    open();
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
    boolean started = false;
    while (System.nanoTime() < deadline) {
      int op = random.nextInt(100);
      if (held.isEmpty() || (op < 40 && held.size() < MAX_HELD)) {
        lease();
        if (!started && !held.isEmpty()) {
          System.out.println("STARTED");
          System.out.flush();
          started = true;
        }
      } else if (op < 72) {
        release(held.remove(random.nextInt(held.size())));
      } else if (op < 88) {
        for (Held h : held) {
          check(h);
        }
      } else if (op < 90) {
        reopen();
      } else {
        check(held.get(random.nextInt(held.size())));
      }
      ops++;
    }
    for (Held h : held) {
      check(h);
    }
    held.clear();
    client.close(); // CloseSession takes back what is still held
  }

  private void open() {
    boolean tcp = random.nextInt(4) == 0;
    unary = random.nextInt(3) == 0;
    GpuMemClient.Builder builder = GpuMemClient.builder(tcp ? tcpTarget : unixTarget).clientName(name).unaryCalls(unary);
    if (random.nextInt(4) == 0) {
      builder.clientCacheBytes(0);
    }
    client = builder.connect();
  }

  /** Checks what is held, closes the client (its session takes back the rest) and opens another. */
  private void reopen() {
    for (Held h : held) {
      check(h);
    }
    held.clear();
    client.close();
    reopens++;
    open();
  }

  private void lease() throws InterruptedException {
    int exp = random.nextInt(14); // 512 B << 13 = 4 MiB
    long size = Math.min(MAX_SIZE, (512L << exp) + random.nextLong(512L << exp));
    boolean zero = random.nextInt(6) == 0;
    boolean async = random.nextInt(5) == 0;
    int device = random.nextInt(2);
    Lease lease;
    try {
      if (async) {
        lease = client.leaseAsync(device, size, zero, "mixed").get(30, TimeUnit.SECONDS);
        asyncLeases++;
      } else {
        lease = client.lease(device, size, zero, "mixed");
      }
    } catch (GpuMemException e) {
      exhaustedOrThrow(e);
      return;
    } catch (ExecutionException e) {
      if (e.getCause() instanceof GpuMemException g) {
        exhaustedOrThrow(g);
        return;
      }
      throw new IllegalStateException(e.getCause());
    } catch (java.util.concurrent.TimeoutException e) {
      throw new IllegalStateException("leaseAsync did not complete in 30 s", e);
    }
    leases++;
    if (unary) {
      unaryLeases++;
    } else {
      streamLeases++;
    }
    ByteBuffer memory = lease.buffer();
    if (lease.sizeBytes() != size || memory.capacity() != size) {
      corrupt("lease " + lease.id() + " of " + size + " bytes came with " + lease.sizeBytes() + " / " + memory.capacity());
    }
    if (zero) {
      zeroLeases++;
      int i = 0;
      for (; i + 8 <= memory.capacity(); i += 8) {
        if (memory.getLong(i) != 0) {
          corrupt("zeroed lease " + lease.id() + " (" + size + " bytes) holds " + Long.toHexString(memory.getLong(i))
              + " at " + i);
          break;
        }
      }
      for (; i < memory.capacity(); i++) {
        if (memory.get(i) != 0) {
          corrupt("zeroed lease " + lease.id() + " holds a non-zero byte at " + i);
          break;
        }
      }
    }
    long pattern = ((long) name.hashCode() << 32) ^ (++counter * 0x9E3779B97F4A7C15L);
    fill(memory, pattern);
    held.add(new Held(lease, memory, pattern));
  }

  private void exhaustedOrThrow(GpuMemException e) {
    if (e.code() != Status.Code.RESOURCE_EXHAUSTED) {
      throw e;
    }
    exhausted++;
  }

  private void release(Held h) throws Exception {
    check(h);
    if (random.nextInt(4) == 0) {
      h.lease().closeAsync().get(30, TimeUnit.SECONDS);
    } else {
      h.lease().close();
    }
  }

  private void check(Held h) {
    checks++;
    ByteBuffer b = h.memory();
    int cap = b.capacity();
    for (int i = 0; i + 16 <= cap; i += STRIDE) { // clear of the last 8 bytes
      if (b.getLong(i) != (h.pattern() ^ i)) {
        corrupt("lease " + h.lease().id() + " (" + cap + " bytes) at " + i + ": " + Long.toHexString(b.getLong(i)));
        return;
      }
    }
    if (cap >= 8 && b.getLong(cap - 8) != ~h.pattern()) {
      corrupt("lease " + h.lease().id() + " (" + cap + " bytes): its last 8 bytes " + Long.toHexString(b.getLong(cap - 8)));
    }
  }

  private static void fill(ByteBuffer b, long pattern) {
    int cap = b.capacity();
    for (int i = 0; i + 16 <= cap; i += STRIDE) { // clear of the last 8 bytes
      b.putLong(i, pattern ^ i);
    }
    if (cap >= 8) {
      b.putLong(cap - 8, ~pattern);
    }
  }

  private void corrupt(String what) {
    corruptions++;
    System.out.println("CORRUPT " + name + ": " + what);
    System.out.flush();
  }

  private String result() {
    return "RESULT ops=" + ops + " leases=" + leases + " zero=" + zeroLeases + " async=" + asyncLeases + " unary="
        + unaryLeases + " stream=" + streamLeases + " exhausted=" + exhausted + " reopens=" + reopens + " checks=" + checks
        + " corruptions=" + corruptions;
  }
}
