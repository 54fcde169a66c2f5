package io.gpumemd.it.sharing;

import io.gpumemd.client.GpuMemClient;
import io.gpumemd.client.Lease;
import io.gpumemd.client.Share;
import io.gpumemd.client.ShareOptions;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.ReadOnlyBufferException;
import java.nio.charset.StandardCharsets;

/**
 * A client process for the sharing tests. Two kinds of run:
 *
 * <ul>
 *   <li>Producers, which run to completion and print one {@code RESULT key=value ...} line:
 *       {@code share TARGET SIZE SEED MAX_ATTACHES} leases a block on device 0, writes the
 *       pattern of {@code SEED}, shares it and prints {@code token=... lease=... segment=...
 *       offset=... block=...}; {@code publish TARGET SIZE SEED NAME READ_ONLY} publishes it
 *       instead. Both then exit, closing their client: the lease goes, the token or name stays.
 *   <li>Holders: {@code attach TARGET TOKEN SEED} or {@code lookup TARGET NAME SEED} take a
 *       hold, print {@code READY id=... intact=... ro=... segment=... offset=... writeFails=...}
 *       and then obey lines on stdin: {@code check} prints {@code CHECK intact=<bool>};
 *       {@code release} closes the hold and prints {@code RELEASED}; {@code write SEED} writes a
 *       new pattern and prints {@code WROTE}; {@code exit} closes the client and exits 0. When
 *       stdin closes they halt without releasing anything (like a crash).
 * </ul>
 *
 * <p>The pattern: byte {@code i} is {@code i * 31 + seed}, over the whole requested size.
 */
public final class SharingClientMain {
  private SharingClientMain() {}

  public static void main(String[] args) throws Exception {
    String mode = args[0];
    String target = args[1];
    switch (mode) {
      case "share", "publish" -> produce(mode, target, args);
      case "attach", "lookup" -> hold(mode, target, args[2], Integer.parseInt(args[3]));
      default -> throw new IllegalArgumentException("mode: " + mode);
    }
  }

  private static void produce(String mode, String target, String[] args) {
    long size = Long.parseLong(args[2]);
    int seed = Integer.parseInt(args[3]);
    try (GpuMemClient client = GpuMemClient.builder(target).clientName("producer-" + ProcessHandle.current().pid())
        .connect()) {
      Lease lease = client.lease(0, size, false, "produced");
      fill(lease.buffer(), seed);
      String extra;
      if (mode.equals("share")) {
        Share share = lease.share(ShareOptions.DEFAULT.withMaxAttaches(Integer.parseInt(args[4])));
        extra = " token=" + share.token() + " expires=" + share.expiresAfterSeconds();
        // The share is deliberately not closed: the token outlives this process.
      } else {
        client.publish(lease, args[4], Boolean.parseBoolean(args[5]));
        extra = " name=" + args[4];
      }
      System.out.println("RESULT lease=" + lease.id() + " segment=" + lease.segmentId() + " offset=" + lease.offset()
          + " block=" + lease.blockBytes() + extra);
      lease.close();
    }
  }

  private static void hold(String mode, String target, String key, int seed) throws Exception {
    GpuMemClient client = GpuMemClient.builder(target).clientName(mode + "-" + ProcessHandle.current().pid()).connect();
    Lease hold = mode.equals("attach") ? client.attach(key, "consumer") : client.lookup(key, "consumer");
    String writeFails = "none";
    if (hold.readOnly()) {
      try {
        hold.buffer().put(0, (byte) 0);
      } catch (ReadOnlyBufferException e) {
        writeFails = e.getClass().getSimpleName();
      }
    }
    System.out.println("READY id=" + hold.id() + " intact=" + intact(hold.buffer(), seed) + " ro=" + hold.readOnly()
        + " attached=" + hold.attached() + " segment=" + hold.segmentId() + " offset=" + hold.offset()
        + " writeFails=" + writeFails);
    System.out.flush();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      String[] words = line.trim().split(" ");
      switch (words[0]) {
        case "check" -> System.out.println("CHECK intact=" + intact(hold.buffer(), seed));
        case "write" -> {
          seed = Integer.parseInt(words[1]);
          fill(hold.buffer(), seed);
          System.out.println("WROTE");
        }
        case "release" -> {
          hold.close();
          System.out.println("RELEASED");
        }
        case "exit" -> {
          client.close();
          System.out.println("EXITING");
          System.out.flush();
          System.exit(0);
        }
        default -> System.out.println("UNKNOWN " + line);
      }
      System.out.flush();
    }
    Runtime.getRuntime().halt(3); // stdin closed: the test is gone; end without releasing
  }

  static void fill(ByteBuffer buffer, int seed) {
    for (int i = 0; i < buffer.capacity(); i++) {
      buffer.put(i, (byte) (i * 31 + seed));
    }
  }

  static boolean intact(ByteBuffer buffer, int seed) {
    for (int i = 0; i < buffer.capacity(); i++) {
      if (buffer.get(i) != (byte) (i * 31 + seed)) {
        return false;
      }
    }
    return true;
  }
}
