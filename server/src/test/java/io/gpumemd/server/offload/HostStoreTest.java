package io.gpumemd.server.offload;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.backend.IpcHandle;
import io.gpumemd.server.backend.SegmentMemory;
import io.gpumemd.server.backend.SegmentOwner;
import io.gpumemd.server.backend.host.HostShmBackend;
import io.gpumemd.server.error.ExhaustedException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The host store on the host backend (real shared-memory segments, read and written through
 * their files as a client would): parked bytes come back after the segment was zeroed, the
 * bound refuses without changing anything, and concurrent claims never hold more than it.
 */
class HostStoreTest {
  private static final long MiB = 1L << 20;

  @TempDir
  Path tmp;

  private HostShmBackend backend;
  private SegmentMemory segment;

  @BeforeEach
  void open() {
    backend = new HostShmBackend(tmp.resolve("shm"), 1, 64 * MiB, null);
    segment = backend.allocate(0, 8 * MiB, SegmentOwner.DAEMON);
  }

  @AfterEach
  void close() {
    backend.close();
  }

  @Test
  void parkedBytes_comeBackAfterTheSegmentWasZeroed_andDropGivesTheirBoundBack() throws Exception {
    HostStore store = new HostStore(backend, 4 * MiB);
    byte[] bytes = pattern((int) (3 * MiB), 5);
    write(MiB, bytes);

    ParkedRange parked;
    try (HostStore.Claim claim = store.claim(3 * MiB, "session s1")) {
      parked = claim.park(segment, MiB, 3 * MiB);
    }
    assertEquals(3 * MiB, store.heldBytes());
    backend.zero(segment, 0, 8 * MiB);
    assertArrayEquals(new byte[4096], read(MiB, 4096), "the device range really was zeroed");

    parked.restoreInto(segment, 4 * MiB);

    assertArrayEquals(bytes, read(4 * MiB, bytes.length));
    assertEquals(1, store.parks());
    assertEquals(1, store.restores());
    parked.drop();
    parked.drop();
    assertEquals(0, store.heldBytes(), "dropped once, given back once");
    assertEquals(3 * MiB, store.spareBytes(), "kept once");
    assertThrows(IllegalStateException.class, () -> parked.restoreInto(segment, 0));
  }

  @Test
  void droppedContents_leaveASpareForTheNextParkOfTheirLength_withinTheBound() throws Exception {
    HostStore store = new HostStore(backend, 4 * MiB);
    ParkedRange first;
    try (HostStore.Claim claim = store.claim(3 * MiB, "session s1")) {
      first = claim.park(segment, 0, 3 * MiB);
    }
    first.drop();
    assertEquals(0, store.heldBytes());
    assertEquals(3 * MiB, store.spareBytes(), "kept for the next sleep");

    byte[] bytes = pattern((int) (3 * MiB), 11);
    write(0, bytes);
    ParkedRange second;
    try (HostStore.Claim claim = store.claim(3 * MiB, "session s1")) {
      second = claim.park(segment, 0, 3 * MiB);
    }
    assertEquals(0, store.spareBytes(), "the spare was taken");
    assertEquals(3 * MiB, store.heldBytes(), "counted once, not twice");
    backend.zero(segment, 0, 8 * MiB);
    second.restoreInto(segment, 0);
    assertArrayEquals(bytes, read(0, bytes.length), "the spare holds the new contents");
    second.drop();

    // A claim that needs the spare's room frees it; the bound holds parked and spare together.
    try (HostStore.Claim claim = store.claim(2 * MiB, "session s2")) {
      assertEquals(0, store.spareBytes());
      assertEquals(2 * MiB, store.heldBytes());
    }
    ParkedRange third;
    try (HostStore.Claim claim = store.claim(MiB, "session s3")) {
      third = claim.park(segment, 0, MiB);
    }
    third.drop();
    assertEquals(MiB, store.spareBytes());
    assertEquals(0, store.trimSpares(), "used just now: kept");
    assertEquals(MiB, store.trimSpares(0), "unused past the idle time: freed");
    assertEquals(0, store.spareBytes());
    assertEquals(0, store.heldBytes());
  }

  @Test
  void aClaimBeyondTheBound_isRefusedNamingTheFlag_andChangesNothing() throws Exception {
    HostStore store = new HostStore(backend, 4 * MiB);
    write(0, pattern(4096, 9));
    HostStore.Claim first = store.claim(3 * MiB, "session s1");

    ExhaustedException refused = assertThrows(ExhaustedException.class, () -> store.claim(2 * MiB, "session s2"));

    assertTrue(refused.getMessage().contains("--offload-max-bytes"), refused.getMessage());
    assertTrue(refused.getMessage().contains("session s2"), refused.getMessage());
    assertEquals(3 * MiB, store.heldBytes());
    assertEquals(0, store.parks());
    assertArrayEquals(pattern(4096, 9), read(0, 4096));
    store.claim(MiB, "session s3").close(); // what fits still fits
    first.close();
    assertEquals(0, store.heldBytes());
  }

  @Test
  void aClaim_givesBackWhatItDidNotPark_andRefusesToParkMoreThanItHolds() {
    HostStore store = new HostStore(backend, 8 * MiB);
    ParkedRange parked;
    try (HostStore.Claim claim = store.claim(4 * MiB, "object weights")) {
      parked = claim.park(segment, 0, MiB);
      assertThrows(IllegalStateException.class, () -> claim.park(segment, MiB, 4 * MiB));
      assertEquals(3 * MiB, claim.unusedBytes());
    }
    assertEquals(MiB, store.heldBytes());
    parked.drop();
    assertEquals(0, store.heldBytes());
  }

  @Test
  void concurrentClaims_neverHoldMoreThanTheBound() throws Exception {
    long max = 10 * MiB;
    HostStore store = new HostStore(backend, max);
    AtomicLong granted = new AtomicLong();
    AtomicLong refused = new AtomicLong();
    ExecutorService threads = Executors.newFixedThreadPool(8);
    try {
      List<Future<?>> done = new ArrayList<>();
      for (int t = 0; t < 8; t++) {
        done.add(threads.submit(() -> {
          for (int i = 0; i < 2_000; i++) {
            long bytes = ThreadLocalRandom.current().nextLong(1, 4 * MiB);
            try (HostStore.Claim claim = store.claim(bytes, "t")) {
              granted.incrementAndGet();
              long held = store.heldBytes();
              if (held > max) {
                throw new AssertionError(held + " held over a bound of " + max);
              }
            } catch (ExhaustedException e) {
              refused.incrementAndGet();
            }
          }
          return null;
        }));
      }
      for (Future<?> f : done) {
        f.get(60, TimeUnit.SECONDS);
      }
    } finally {
      threads.shutdownNow();
    }
    assertEquals(16_000, granted.get() + refused.get());
    assertTrue(granted.get() > 0, "some claims fit");
    assertEquals(0, store.heldBytes());
  }

  private Path path() {
    return Path.of(((IpcHandle.HostShm) segment.handle()).path());
  }

  private byte[] read(long offset, int length) throws Exception {
    try (FileChannel channel = FileChannel.open(path(), StandardOpenOption.READ)) {
      ByteBuffer buffer = ByteBuffer.allocate(length);
      while (buffer.hasRemaining()) {
        channel.read(buffer, offset + buffer.position());
      }
      return buffer.array();
    }
  }

  private void write(long offset, byte[] bytes) throws Exception {
    try (FileChannel channel = FileChannel.open(path(), StandardOpenOption.WRITE)) {
      ByteBuffer buffer = ByteBuffer.wrap(bytes);
      while (buffer.hasRemaining()) {
        channel.write(buffer, offset + buffer.position());
      }
    }
  }

  private static byte[] pattern(int length, int seed) {
    byte[] bytes = new byte[length];
    for (int i = 0; i < length; i++) {
      bytes[i] = (byte) (i * 31 + seed);
    }
    return bytes;
  }
}
