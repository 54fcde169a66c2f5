package io.gpumemd.it.sleep;

import com.sun.jna.Native;
import com.sun.jna.Pointer;
import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.GpuMemException;
import io.gpumemd.client.Lease;
import io.gpumemd.client.SleepResult;
import io.gpumemd.client.WakeResult;
import io.grpc.Status;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A client process that sleeps and wakes when told: leases {@code count} blocks of {@code size}
 * bytes on device 0, fills each with its own pattern and prints {@code LEASED <session id>};
 * on the line {@code sleep} it pauses its work (it has none), sleeps at {@code level} and prints
 * {@code SLEPT <leases> <freed bytes> <host bytes>}; on {@code wake} it wakes and checks every
 * buffer it was handed before the sleep: the same address, and its pattern (level 1) or zeros
 * (level 2), then prints {@code RESULT woken=N sameAddresses=B contents=kept|zero|differ},
 * gives everything back and exits. Its stdin closing ends it abruptly, leases held.
 *
 * <p>Usage: {@code SleeperMain target count size level}
 */
public final class SleeperMain {
  private SleeperMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    int count = Integer.parseInt(args[1]);
    long size = Long.parseLong(args[2]);
    int level = Integer.parseInt(args[3]);
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    GpuMemClient client = GpuMemClient.builder(target).clientName("sleeper").connect();
    List<Lease> leases = new ArrayList<>();
    List<ByteBuffer> buffers = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      Lease lease = client.lease(0, size, false, "weights");
      leases.add(lease);
      buffers.add(lease.buffer());
      fill(buffers.get(i), i);
    }
    List<Long> addresses = addresses(leases);
    System.out.println("LEASED " + client.sessionId());
    expect(in, "sleep");
    SleepResult slept = client.sleep(level);
    System.out.println("SLEPT " + slept.leaseIds().size() + " " + slept.freedBytes() + " " + slept.hostBytes());
    expect(in, "wake");
    WakeResult woken = wake(client);
    String contents = level == 1 ? (patterned(buffers) ? "kept" : "differ") : (zeros(buffers) ? "zero" : "differ");
    System.out.println("RESULT woken=" + woken.leaseIds().size() + " sameAddresses="
        + addresses.equals(addresses(leases)) + " contents=" + contents);
    leases.forEach(Lease::close);
    client.close();
  }

  /**
   * Wakes, trying again for up to 5 s while the daemon answers RESOURCE_EXHAUSTED (the wake's
   * documented "try again"): memory another process just gave back comes free once the daemon
   * has seen that process's mappings go, which its exit does not wait for.
   */
  private static WakeResult wake(GpuMemClient client) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (true) {
      try {
        return client.wake();
      } catch (GpuMemException e) {
        if (e.code() != Status.Code.RESOURCE_EXHAUSTED || System.nanoTime() > deadline) {
          throw e;
        }
        Thread.sleep(20);
      }
    }
  }

  /** Waits for {@code word} on stdin; stdin closing ends the process at once, leases held. */
  private static void expect(BufferedReader in, String word) throws Exception {
    String line;
    while ((line = in.readLine()) != null) {
      if (line.trim().equals(word)) {
        return;
      }
    }
    Runtime.getRuntime().halt(3);
  }

  static List<Long> addresses(List<Lease> leases) {
    return leases.stream().map(l -> Pointer.nativeValue(Native.getDirectBufferPointer(l.buffer()))).toList();
  }

  private static byte pattern(int buffer, int i) {
    return (byte) (buffer * 31 + i * 7 + 1);
  }

  static void fill(ByteBuffer buffer, int n) {
    for (int i = 0; i < buffer.capacity(); i++) {
      buffer.put(i, pattern(n, i));
    }
  }

  static boolean patterned(List<ByteBuffer> buffers) {
    for (int n = 0; n < buffers.size(); n++) {
      ByteBuffer b = buffers.get(n);
      for (int i = 0; i < b.capacity(); i++) {
        if (b.get(i) != pattern(n, i)) {
          return false;
        }
      }
    }
    return true;
  }

  private static boolean zeros(List<ByteBuffer> buffers) {
    for (ByteBuffer b : buffers) {
      for (int i = 0; i < b.capacity(); i++) {
        if (b.get(i) != 0) {
          return false;
        }
      }
    }
    return true;
  }
}
