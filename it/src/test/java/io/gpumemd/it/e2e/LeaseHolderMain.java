package io.gpumemd.it.e2e;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;

/**
 * A client process for end-to-end tests: leases {@code count} blocks of {@code size} bytes,
 * fills each with its pattern, prints {@code READY <lease ids>} and then holds them until it is
 * killed (or its stdin closes, when it exits without releasing anything).
 *
 * <p>Usage: {@code LeaseHolderMain target clientName count size}
 */
public final class LeaseHolderMain {
  private LeaseHolderMain() {}

  public static void main(String[] args) throws Exception {
    String target = args[0];
    int count = Integer.parseInt(args[2]);
    long size = Long.parseLong(args[3]);
    GpuMemClient client = GpuMemClient.builder(target).clientName(args[1]).connect();
    List<Lease> leases = new ArrayList<>();
    StringBuilder ids = new StringBuilder();
    for (int i = 0; i < count; i++) {
      Lease lease = client.lease(i % 2, size, false, "holder-" + i);
      fill(lease.buffer(), (byte) (0x40 + i));
      leases.add(lease);
      ids.append(' ').append(lease.id());
    }
    System.out.println("READY" + ids);
    System.out.flush();
    // Hold until killed; stdin closing (the test ending) also ends us, abruptly.
    while (System.in.read() >= 0) {
      // keep holding
    }
    Runtime.getRuntime().halt(3);
  }

  static void fill(ByteBuffer buffer, byte value) {
    for (int i = 0; i < buffer.capacity(); i += 512) {
      buffer.put(i, value);
    }
  }

  static boolean holds(ByteBuffer buffer, byte value) {
    for (int i = 0; i < buffer.capacity(); i += 512) {
      if (buffer.get(i) != value) {
        return false;
      }
    }
    return true;
  }
}
