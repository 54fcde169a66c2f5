package io.gpumemd.server.backend;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;


import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The contract every {@link MemoryBackend} keeps, run against each real backend by a subclass
 * ({@code HostShmBackendTest}, {@code JCudaBackendTest}). A subclass creates the backend and
 * gives the test a way to read and write a segment's bytes from outside the backend (the host
 * one through the file, the CUDA one with {@code cuMemcpyHtoD}/{@code cuMemcpyDtoH}), so that
 * "zero really zeroes" is checked on the memory itself.
 *
 * <p>Each test gets a fresh backend, closed afterwards; segments a test allocates and does not
 * free are left to {@code close()}, which must free them.
 */
public abstract class MemoryBackendContractTest {
  protected static final long MiB = 1L << 20;

  protected MemoryBackend backend;
  private final List<SegmentMemory> allocated = new ArrayList<>();

  /** A new backend with at least one device of at least 64 MiB. */
  protected abstract MemoryBackend createBackend() throws Exception;

  /** Reads {@code length} bytes of a segment at {@code offset}, bypassing the backend. */
  protected abstract byte[] read(SegmentMemory segment, long offset, int length) throws Exception;

  /** Writes bytes into a segment at {@code offset}, bypassing the backend. */
  protected abstract void write(SegmentMemory segment, long offset, byte[] bytes) throws Exception;

  /** Asserts that the memory of segments the backend freed is really gone. */
  protected abstract void assertReleased(List<SegmentMemory> segments) throws Exception;

  @BeforeEach
  void openBackend() throws Exception {
    backend = createBackend();
  }

  @AfterEach
  void closeBackend() {
    if (backend != null) {
      backend.close();
    }
  }

  /** Allocates for the daemon and remembers the segment for the close test. */
  protected SegmentMemory allocate(int device, long bytes) {
    return allocate(device, bytes, SegmentOwner.DAEMON);
  }

  /** Allocates for an owner and remembers the segment for the close test. */
  protected SegmentMemory allocate(int device, long bytes, SegmentOwner owner) {
    SegmentMemory segment = backend.allocate(device, bytes, owner);
    allocated.add(segment);
    return segment;
  }

  private static byte[] pattern(int length, int seed) {
    byte[] bytes = new byte[length];
    for (int i = 0; i < length; i++) {
      bytes[i] = (byte) (i * 31 + seed);
    }
    return bytes;
  }

  private static byte[] filled(int length, byte value) {
    byte[] bytes = new byte[length];
    java.util.Arrays.fill(bytes, value);
    return bytes;
  }

  // ------------------------------------------------------------------------------- devices

  @Test
  protected void devices_areNumberedFromZeroAndDescribed() {
    List<DeviceInfo> devices = backend.devices();
    assertFalse(devices.isEmpty());
    Set<String> uuids = new HashSet<>();
    for (int d = 0; d < devices.size(); d++) {
      DeviceInfo info = devices.get(d);
      assertEquals(d, info.ordinal());
      assertEquals(backend.name(), info.backend());
      assertTrue(info.capacityBytes() >= 64 * MiB, info.toString());
      assertTrue(info.freeBytesAtStart() <= info.capacityBytes(), info.toString());
      assertFalse(info.name().isBlank(), info.toString());
      assertTrue(uuids.add(info.uuid()), "uuid repeated: " + info);
    }
  }

  // ---------------------------------------------------------------------------- allocation

  @Test
  protected void allocate_returnsASegmentOfExactlyTheBytesWithOneKindOfHandle() {
    SegmentMemory segment = allocate(0, 2 * MiB);

    assertEquals(0, segment.device());
    assertEquals(2 * MiB, segment.bytes());
    IpcHandle handle = segment.handle();
    if (handle instanceof IpcHandle.CudaIpc cuda) {
      assertEquals(64, cuda.bytes().length);
    } else if (handle instanceof IpcHandle.HostFd fd) {
      assertFalse(fd.fdSocket().isEmpty(), "a descriptor handle names the fd channel");
      assertTrue(segment instanceof FdPassedSegment, "a descriptor handle's segment opens descriptors");
    } else if (handle instanceof IpcHandle.CudaVmm vmm) {
      assertFalse(vmm.fdSocket().isEmpty(), "a VMM handle names the fd channel");
      assertTrue(segment instanceof FdPassedSegment, "a VMM segment exports descriptors");
    } else {
      assertFalse(((IpcHandle.HostShm) handle).path().isEmpty(), "a host handle names its file");
    }
  }

  @Test
  protected void allocate_onEveryDevice_reportsThatDevice() {
    for (DeviceInfo device : backend.devices()) {
      SegmentMemory segment = allocate(device.ordinal(), 2 * MiB);
      assertEquals(device.ordinal(), segment.device());
    }
  }

  /**
   * What a client maps the segment by, as text: the handle's bytes or path. A backend whose
   * handles only say where to fetch a descriptor names what the descriptor opens instead.
   */
  protected String mappedBy(SegmentMemory segment) throws Exception {
    return segment.handle() instanceof IpcHandle.CudaIpc cuda
        ? java.util.HexFormat.of().formatHex(cuda.bytes())
        : ((IpcHandle.HostShm) segment.handle()).path();
  }

  @Test
  protected void allocate_givesEverySegmentItsOwnHandle() throws Exception {
    Set<String> handles = new HashSet<>();
    for (int i = 0; i < 4; i++) {
      SegmentMemory segment = allocate(0, 2 * MiB);
      String handle = mappedBy(segment);
      assertTrue(handles.add(handle), "handle repeated: " + handle);
    }
  }

  @Test
  protected void allocate_largerThanTheDevice_isOutOfMemory() {
    long capacity = backend.devices().get(0).capacityBytes();

    assertThrows(BackendOutOfMemoryException.class, () -> backend.allocate(0, capacity + 2 * MiB, SegmentOwner.DAEMON));

    // ... and leaves the device usable.
    assertNotNull(allocate(0, 2 * MiB));
  }

  @Test
  protected void allocate_afterClose_fails() {
    backend.close();
    assertThrows(BackendException.class, () -> backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON));
  }

  // ------------------------------------------------------------------------------- contents

  @Test
  protected void segment_bytesWrittenFromOutside_readBackTheSame() throws Exception {
    SegmentMemory segment = allocate(0, 2 * MiB);
    byte[] bytes = pattern(64 * 1024, 7);

    write(segment, MiB, bytes);

    assertArrayEquals(bytes, read(segment, MiB, bytes.length));
  }

  @Test
  protected void segment_whenFreshAndTheBackendSaysSo_readsAsZeros() throws Exception {
    assumeTrue(backend.freshSegmentsAreZeroed(), backend.name() + " makes no promise about fresh memory");
    SegmentMemory segment = allocate(0, 2 * MiB);

    assertArrayEquals(new byte[4096], read(segment, 0, 4096));
    assertArrayEquals(new byte[4096], read(segment, 2 * MiB - 4096, 4096));
  }

  @Test
  protected void zero_writesZerosOverTheRangeAndOnlyThere() throws Exception {
    SegmentMemory segment = allocate(0, 2 * MiB);
    write(segment, 0, filled(64 * 1024, (byte) 0x5a));

    backend.zero(segment, 4096, 8192);

    byte[] after = read(segment, 0, 64 * 1024);
    for (int i = 0; i < after.length; i++) {
      byte expected = i >= 4096 && i < 4096 + 8192 ? 0 : (byte) 0x5a;
      assertEquals(expected, after[i], "byte " + i);
    }
  }

  @Test
  protected void zero_ofAWholeLargeSegment_zeroesEveryByte() throws Exception {
    SegmentMemory segment = allocate(0, 6 * MiB);
    write(segment, 0, filled(4096, (byte) 1));
    write(segment, 3 * MiB, filled(4096, (byte) 2));
    write(segment, 6 * MiB - 4096, filled(4096, (byte) 3));

    backend.zero(segment, 0, 6 * MiB);

    assertArrayEquals(new byte[4096], read(segment, 0, 4096));
    assertArrayEquals(new byte[4096], read(segment, 3 * MiB, 4096));
    assertArrayEquals(new byte[4096], read(segment, 6 * MiB - 4096, 4096));
  }

  // ------------------------------------------------------------------ host buffers (parking)

  @Test
  protected void copyToHost_survivesTheSegmentsZeroing_andCopyFromHostPutsItWhereAsked() throws Exception {
    SegmentMemory segment = allocate(0, 4 * MiB);
    byte[] bytes = pattern((int) MiB + 4096, 11);
    write(segment, MiB, bytes);
    HostBuffer host = backend.allocateHost(3 * MiB);
    try {
      backend.copyToHost(segment, MiB, host, 8192, bytes.length);
      backend.zero(segment, 0, 4 * MiB);

      backend.copyFromHost(host, 8192, segment, 2 * MiB, bytes.length);

      assertArrayEquals(bytes, read(segment, 2 * MiB, bytes.length), "the parked bytes, at the new offset");
      assertArrayEquals(new byte[8192], read(segment, 2 * MiB - 8192, 8192), "nothing written before it");
      assertArrayEquals(new byte[4096], read(segment, MiB, 4096), "nor at the old offset");
    } finally {
      host.free();
      host.free(); // idempotent
    }
  }

  @Test
  protected void copies_outsideTheHostBuffer_areRefused_andWriteNothing() throws Exception {
    SegmentMemory segment = allocate(0, 2 * MiB);
    write(segment, 0, filled(8192, (byte) 0x3c));
    HostBuffer host = backend.allocateHost(4096);
    try {
      assertThrows(BackendException.class, () -> backend.copyToHost(segment, 0, host, 0, 8192));
      assertThrows(BackendException.class, () -> backend.copyFromHost(host, 4096, segment, 0, 1));
      assertThrows(BackendException.class, () -> backend.copyFromHost(host, -1, segment, 0, 1));

      assertArrayEquals(filled(8192, (byte) 0x3c), read(segment, 0, 8192));
    } finally {
      host.free();
    }
  }

  @Test
  protected void aFreedHostBuffer_isRefused() {
    SegmentMemory segment = allocate(0, 2 * MiB);
    HostBuffer host = backend.allocateHost(4096);
    host.free();

    assertThrows(BackendException.class, () -> backend.copyToHost(segment, 0, host, 0, 4096));
  }

  // ---------------------------------------------------------------------------------- free

  @Test
  protected void free_releasesTheMemory_andATwiceFreedSegmentDoesNotThrow() throws Exception {
    SegmentMemory segment = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);

    backend.free(segment);

    assertReleased(List.of(segment));
    assertDoesNotThrow(() -> backend.free(segment), "free never throws for our own segment");
  }

  @Test
  protected void close_freesEverySegmentStillAllocated_andIsIdempotent() throws Exception {
    for (DeviceInfo device : backend.devices()) {
      allocate(device.ordinal(), 2 * MiB);
      allocate(device.ordinal(), 4 * MiB);
    }

    backend.close();
    backend.close();

    assertReleased(allocated);
  }

  // -------------------------------------------------------------------------------- events

  @Test
  protected void openEvent_withAHandleThatIsNoEvent_isAnInvalidRequest() {
    InvalidEventHandleException e = assertThrows(InvalidEventHandleException.class, () -> backend.openEvent(0, new byte[64]));
    assertTrue(e.getMessage().startsWith("cuda_ipc_event_handle: "), e.getMessage());
  }

  // ------------------------------------------------------------------------- thread-safety

  @Test
  protected void allocateZeroAndFree_fromSeveralThreads_keepSegmentsApart() throws Exception {
    ExecutorService threads = Executors.newFixedThreadPool(4);
    try {
      List<Future<?>> futures = new ArrayList<>();
      for (int t = 0; t < 4; t++) {
        int seed = t;
        futures.add(threads.submit(() -> {
          for (int i = 0; i < 10; i++) {
            SegmentMemory segment = backend.allocate(0, 2 * MiB, SegmentOwner.DAEMON);
            byte[] mine = pattern(4096, seed * 100 + i);
            write(segment, 0, mine);
            backend.zero(segment, 4096, 4096);
            assertArrayEquals(mine, read(segment, 0, 4096), "another thread wrote into my segment");
            backend.free(segment);
          }
          return null;
        }));
      }
      for (Future<?> f : futures) {
        f.get(60, TimeUnit.SECONDS);
      }
    } finally {
      threads.shutdownNow();
    }
  }
}
