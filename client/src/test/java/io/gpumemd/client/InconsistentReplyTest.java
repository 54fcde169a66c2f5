package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.proto.v1.LeaseResponse;
import io.grpc.Status;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;
import org.junit.jupiter.api.io.TempDir;

/**
 * The Java client against a daemon whose replies are wrong ({@link CraftedDaemon}: a real gRPC
 * server and a real fd channel sending real memfds): every inconsistency fails INTERNAL with
 * "the daemon's reply is inconsistent" and the field, before anything is mapped (no segment
 * mapped, no file grown, no descriptor fetched for a reply refused before); the refused lease or
 * hold is released; and the same daemon's consistent replies still work.
 */
class InconsistentReplyTest {
  private static final long MIB2 = 2 << 20;

  @TempDir Path dir;
  private CraftedDaemon daemon;
  private GpuMemClient client;
  private Path segmentFile;

  @BeforeEach
  void start() throws Exception {
    daemon = new CraftedDaemon(dir);
    segmentFile = dir.resolve("segment-7");
    try (RandomAccessFile f = new RandomAccessFile(segmentFile.toFile(), "rw")) {
      f.setLength(MIB2);
    }
    client = GpuMemClient.connect(daemon.target());
  }

  @AfterEach
  void stop() throws Exception {
    try {
      client.close();
    } finally {
      daemon.close();
    }
  }

  /** A consistent reply on the 2 MiB path segment: 4096 bytes asked, a 4096-byte block at 8192. */
  private LeaseResponse.Builder pathLease(String id) {
    LeaseResponse.Builder b = CraftedDaemon.lease(id, 0, 4096, 4096, 7, MIB2, 8192);
    b.getHandleBuilder().setHostShmPath(segmentFile.toString());
    return b;
  }

  /** The same on a segment passed by descriptor through the crafted fd channel. */
  private LeaseResponse.Builder fdLease(String id) {
    LeaseResponse.Builder b = CraftedDaemon.lease(id, 0, 4096, 4096, 9, MIB2, 8192);
    b.getHandleBuilder().getFdSegmentBuilder().setFdSocket(daemon.fdSocket.toString());
    return b;
  }

  /** Asserts the INTERNAL inconsistency naming {@code field}, the lease released, nothing mapped. */
  private void assertRefused(String leaseId, String field, Executable call) throws InterruptedException {
    GpuMemException e = assertThrows(GpuMemException.class, call);
    assertEquals(Status.Code.INTERNAL, e.code(), e.getMessage());
    assertTrue(e.serverMessage().startsWith("the daemon's reply is inconsistent: "), e.getMessage());
    assertTrue(e.serverMessage().contains(field), field + " in: " + e.getMessage());
    assertEquals(0, client.mappedSegments(), "nothing mapped");
    assertTrue(daemon.awaitReleased(leaseId), "the refused lease is given back");
  }

  private void refusesLease(String field, UnaryOperator<LeaseResponse.Builder> edit) throws InterruptedException {
    daemon.replyWith(pathLease("bad"), edit);
    assertRefused("bad", field, () -> client.lease(0, 4096));
    assertEquals(0, client.mapsOpened(), "no mapping was ever opened");
    assertEquals(MIB2, segmentFile.toFile().length(), "the segment file is untouched");
  }

  @Test
  void blockRunningPastTheSegment_isInternal() throws Exception {
    refusesLease("offset + block_bytes = 2093056 + 8192 runs past segment_bytes 2097152",
        b -> b.setBlockBytes(8192).setSizeBytes(4096).setHandle(b.getHandle().toBuilder().setOffset(MIB2 - 4096)));
  }

  @Test
  void offsetPlusBlockThatOverflows_isInternal() throws Exception {
    refusesLease("runs past segment_bytes",
        b -> b.setHandle(b.getHandle().toBuilder().setOffset(Long.MAX_VALUE - 100).setSegmentBytes(Long.MAX_VALUE)));
  }

  @Test
  void blockSmallerThanAsked_isInternal() throws Exception {
    refusesLease("block_bytes 2048 is smaller than size_bytes 4096", b -> b.setBlockBytes(2048));
  }

  @Test
  void sizeOtherThanAsked_isInternal() throws Exception {
    refusesLease("size_bytes 8192 (expected: 4096, the size asked)", b -> b.setSizeBytes(8192).setBlockBytes(8192));
  }

  @Test
  void leaseOnAnotherDeviceThanAsked_isInternal() throws Exception {
    refusesLease("device 1 (expected: 0, the device asked)", b -> b.setDevice(1));
  }

  @Test
  void negativeOffset_isInternal() throws Exception {
    refusesLease("offset -4096 (expected: >= 0)", b -> b.setHandle(b.getHandle().toBuilder().setOffset(-4096)));
  }

  @Test
  void emptySegment_isInternal() throws Exception {
    refusesLease("segment_bytes 0 (expected: > 0)",
        b -> b.setHandle(b.getHandle().toBuilder().setSegmentBytes(0).setOffset(0)));
  }

  @Test
  void unaryLeasePath_checksToo() throws Exception {
    client.close();
    client = GpuMemClient.builder(daemon.target()).unaryCalls(true).connect();
    refusesLease("runs past segment_bytes", b -> b.setHandle(b.getHandle().toBuilder().setOffset(MIB2)));
  }

  @Test
  void asyncLease_checksToo() throws Exception {
    daemon.replyWith(pathLease("bad"), b -> b.setBlockBytes(1024));
    assertRefused("bad", "block_bytes 1024 is smaller than size_bytes 4096",
        () -> {
          try {
            client.leaseAsync(0, 4096, false, "").join();
          } catch (java.util.concurrent.CompletionException e) {
            throw e.getCause();
          }
        });
  }

  @Test
  void holdPastTheSegment_isInternal_andTheHoldReleased() throws Exception {
    daemon.replyWith(pathLease("hold"), b -> b.setHandle(b.getHandle().toBuilder().setOffset(MIB2 - 1024)));
    assertRefused("hold", "hold hold (segment 7): offset + block_bytes", () -> client.attach("0123456789abcdef0123456789abcdef"));
    assertRefused("hold", "offset + block_bytes", () -> client.lookup("weights"));
  }

  @Test
  void segmentFileSmallerThanTheReplySays_isInternal_andTheFileIsNotGrown() throws Exception {
    Path small = dir.resolve("small");
    Files.write(small, new byte[4096]);
    daemon.replyWith(pathLease("bad"), b -> b.setHandle(b.getHandle().toBuilder().setHostShmPath(small.toString())));
    assertRefused("bad", "host segment file " + small + " is 4096 bytes, the lease's reply says segment_bytes 2097152",
        () -> client.lease(0, 4096));
    assertEquals(4096, Files.size(small), "a writable map of more than the file would have grown it");
  }

  @Test
  void descriptorSmallerThanItsGrant_isInternal_beforeMapping() throws Exception {
    daemon.grantBytes = MIB2;
    daemon.fileBytes = 4096; // the block at 8192 would be past the end of the file: SIGBUS
    daemon.replyWith(fdLease("bad"), b -> b);
    assertRefused("bad", "the descriptor of segment 9 (fstat) is 4096 bytes, the fd channel's grant says "
        + "segment_bytes 2097152", () -> client.lease(0, 4096));
    assertEquals(List.of(4096L), daemon.sentFiles, "a real descriptor came, and was refused");
  }

  @Test
  void descriptorLargerThanItsGrant_isInternal() throws Exception {
    daemon.grantBytes = MIB2;
    daemon.fileBytes = 2 * MIB2;
    daemon.replyWith(fdLease("bad"), b -> b);
    assertRefused("bad", "(fstat) is 4194304 bytes", () -> client.lease(0, 4096));
  }

  @Test
  void grantOtherThanTheLeaseReply_isInternal() throws Exception {
    daemon.grantBytes = 4 * MIB2;
    daemon.fileBytes = 4 * MIB2;
    daemon.replyWith(fdLease("bad"), b -> b);
    assertRefused("bad", "segment 9: the fd channel's grant says segment_bytes 8388608, the lease's reply 2097152",
        () -> client.lease(0, 4096));
  }

  @Test
  void aMappedSegmentClaimedLarger_isInternal() throws Exception {
    daemon.replyWith(pathLease("good"), b -> b);
    try (Lease good = client.lease(0, 4096)) {
      // the next reply says the same segment is 4 MiB, and places the block beyond the 2 MiB mapped
      daemon.replyWith(pathLease("bad"), b -> b.setHandle(b.getHandle().toBuilder().setSegmentBytes(2 * MIB2)
          .setOffset(MIB2 + 4096)));
      GpuMemException e = assertThrows(GpuMemException.class, () -> client.lease(0, 4096));
      assertEquals(Status.Code.INTERNAL, e.code());
      assertTrue(e.serverMessage().contains("segment 7 is mapped here with segment_bytes 2097152, this reply says "
          + "4194304"), e.getMessage());
      assertTrue(daemon.awaitReleased("bad"));
      assertEquals(1, client.mappedSegments(), "the good lease's mapping stays");
      good.buffer().putInt(0, 42);
      assertEquals(42, good.buffer().getInt(0));
    }
  }

  @Test
  void consistentReplies_stillWork_byPathAndByDescriptor() throws Exception {
    daemon.replyWith(pathLease("path"), b -> b);
    try (Lease lease = client.lease(0, 4096)) {
      ByteBuffer buffer = lease.buffer();
      buffer.putLong(0, 0x1122334455667788L);
      assertEquals(4096, buffer.capacity());
      assertEquals(0x1122334455667788L, lease.buffer().getLong(0));
    }
    daemon.grantBytes = MIB2;
    daemon.fileBytes = MIB2;
    daemon.replyWith(fdLease("fd"), b -> b);
    try (Lease lease = client.lease(0, 4096)) {
      lease.buffer().putLong(4088, 7);
      assertEquals(7, lease.buffer().getLong(4088));
    }
    // a hold may name the size of the lease it holds, which no one asked here
    daemon.replyWith(pathLease("hold"), b -> b.setSizeBytes(3000));
    try (Lease hold = client.attach("0123456789abcdef0123456789abcdef")) {
      assertEquals(3000, hold.buffer().capacity());
    }
  }

  @Test
  void aReadOnlyGrantForAWritableAsk_neverFillsTheWritableSlot() throws Exception {
    daemon.grantBytes = MIB2;
    daemon.fileBytes = MIB2;
    daemon.grantReadOnly = true; // the daemon grants less than asked
    daemon.replyWith(fdLease("lease-ro"), b -> b);
    Lease first = client.lease(0, 4096);
    assertTrue(first.buffer().isReadOnly(), "mapped as granted: read-only");

    daemon.grantReadOnly = false;
    daemon.replyWith(fdLease("lease-rw"), b -> b);
    Lease second = client.lease(0, 4096);

    assertFalse(second.buffer().isReadOnly(), "a writable lease on the segment got the read-only mapping");
    second.buffer().putInt(0, 42); // would fault on a read-only mapping
    assertEquals(42, second.buffer().getInt(0));
    assertEquals(2, daemon.sentFiles.size(), "the writable mapping was fetched on its own");
    first.close();
    second.close();
  }
}
