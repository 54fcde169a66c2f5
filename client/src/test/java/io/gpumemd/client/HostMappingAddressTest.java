package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.jna.Native;
import io.gpumemd.server.testing.DaemonProcess;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ReadOnlyBufferException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Issue 35 item 1, host side: a host mapping sits in a reserved address range, so that its
 * segment can be vacated and a segment of the same size mapped again at the same address, with
 * every buffer made from it still valid. Real shared-memory segments of a real daemon ({@code
 * --host-segments path}: their files are what the mappings are refilled from); the fault of a
 * vacated range is shown in a child process, whose JVM it ends.
 */
class HostMappingAddressTest {
  private static final long SIZE = 4L << 20; // a large request: a segment of its own
  private static DaemonProcess daemon;
  private static GpuMemClient client;
  private static Lease first;
  private static Lease second;

  @BeforeAll
  static void start() {
    daemon = DaemonProcess.start("--host-segments", "path");
    client = GpuMemClient.connect(daemon.unixTarget());
    first = client.lease(0, SIZE);
    second = client.lease(0, SIZE);
    assertNotEquals(first.segmentId(), second.segmentId(), "two large leases, two segments");
    fill(first.buffer(), (byte) 0x11);
    fill(second.buffer(), (byte) 0x22);
  }

  @AfterAll
  static void stop() {
    client.close();
    daemon.close();
  }

  @Test
  void leaseBuffer_keepsItsAddress_throughVacateAndRefill() throws IOException {
    HostMapping mapping = (HostMapping) first.mapping();
    ByteBuffer buffer = first.buffer();
    long address = pointer(buffer);
    String firstFile = mappedFile(mapping.address());
    String secondFile = mappedFile(((HostMapping) second.mapping()).address());
    assertEquals(mapping.address() + first.offset(), address, "the lease's buffer lies in the mapping");

    mapping.vacate();
    assertTrue(mapping.vacated());
    assertEquals("---p", permissions(mapping.address()), "vacated: the inaccessible reservation");
    assertFalse(maps().contains(firstFile), "the segment is no longer mapped here");

    mapping.refill(firstFile);
    assertEquals(address, pointer(first.buffer()), "a new buffer after refilling: the same address");
    assertEquals(0x11, buffer.get(0), "the buffer made before vacating sees the segment's bytes again");
    assertEquals(0x11, buffer.get((int) SIZE - 1));

    mapping.refill(secondFile); // another segment of the same size at the same address
    assertEquals(0x22, buffer.get(0), "the other segment's bytes");
    buffer.put(1, (byte) 0x33);
    assertEquals(0x33, second.buffer().get(1), "shared: written through the refilled range, seen in the segment");
    second.buffer().put(1, (byte) 0x22);

    mapping.vacate();
    mapping.refill(firstFile); // as it was, for the client's own close
    assertEquals(0x11, buffer.get(1));
    assertEquals(address, pointer(first.buffer()));
  }

  @Test
  void closeAfterVacate_leavesNothingMapped() throws IOException {
    String file = mappedFile(((HostMapping) first.mapping()).address());
    HostMapping mapping = new HostMapping(file, SIZE, false);
    long address = mapping.address();
    assertEquals(file, mappedFileOrNull(address));
    mapping.vacate();
    mapping.close();
    assertEquals(null, rangeAt(address), "nothing mapped at the range after close");
    assertThrows(IllegalStateException.class, () -> mapping.refill(file));
    assertThrows(IllegalStateException.class, mapping::vacate);
  }

  @Test
  void readOnlyMapping_staysReadOnly_afterRefill() throws IOException {
    String file = mappedFile(((HostMapping) first.mapping()).address());
    HostMapping mapping = new HostMapping(file, SIZE, true);
    try {
      ByteBuffer before = mapping.slice(0, 16);
      mapping.vacate();
      mapping.refill(file);
      assertEquals("r--s", permissions(mapping.address()), "mapped PROT_READ again");
      assertEquals(0x11, before.get(0));
      assertTrue(mapping.slice(0, 16).isReadOnly());
      assertThrows(ReadOnlyBufferException.class, () -> before.put(0, (byte) 1));
    } finally {
      mapping.close();
    }
  }

  @Test
  void refill_withASegmentOfAnotherSize_isRefused_andChangesNothing(@TempDir Path dir) throws IOException {
    String file = mappedFile(((HostMapping) first.mapping()).address());
    Path small = dir.resolve("small");
    Files.write(small, new byte[4096]);
    HostMapping mapping = new HostMapping(file, SIZE, false);
    try {
      mapping.vacate();
      GpuMemException e = assertThrows(GpuMemException.class, () -> mapping.refill(small.toString()));
      assertTrue(e.getMessage().contains("4096 bytes"), e.getMessage());
      assertEquals("---p", permissions(mapping.address()), "still vacated");
      mapping.refill(file);
      assertEquals(0x11, mapping.slice(0, 1).get(0));
    } finally {
      mapping.close();
    }
  }

  @Test
  void touchingAVacatedRange_faults() throws Exception {
    String file = mappedFile(((HostMapping) first.mapping()).address());
    List<String> command = DaemonProcess.javaCommand(HostMappingFaultMain.class.getName());
    // The crash report and core dump of the expected fault are not wanted.
    command.addAll(1, List.of("-XX:ErrorFile=/dev/null", "-XX:-CreateCoredumpOnCrash"));
    command.addAll(List.of(file, Long.toString(SIZE)));
    Process child = new ProcessBuilder(command).redirectErrorStream(true).start();
    String output = new String(child.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(child.waitFor(60, TimeUnit.SECONDS));
    assertTrue(output.contains("read 17") && output.contains("vacated"), output);
    assertFalse(output.contains("read after vacate"), output);
    assertTrue(output.contains("SIGSEGV"), "the JVM died of the fault:\n" + output);
    assertNotEquals(0, child.exitValue(), output);
  }

  @Test
  void descriptorMapping_refilledFromDescriptors_keepsItsAddress() {
    try (DaemonProcess fdDaemon = DaemonProcess.start("--host-segments", "fd");
        GpuMemClient fdClient = GpuMemClient.connect(fdDaemon.unixTarget());
        FdChannelClient channel = new FdChannelClient(fdDaemon.unixTarget(), 5000)) {
      Lease a = fdClient.lease(0, SIZE);
      Lease b = fdClient.lease(0, SIZE);
      fill(a.buffer(), (byte) 0x44);
      fill(b.buffer(), (byte) 0x55);
      HostMapping mapping = (HostMapping) a.mapping();
      ByteBuffer buffer = a.buffer();
      long address = pointer(buffer);
      mapping.vacate();
      try (ReceivedDescriptor other = channel.fetch(fdClient.sessionId(), b.segmentId(), false)) {
        mapping.refill(other);
      }
      assertEquals(0x55, buffer.get(0), "the other segment's bytes");
      mapping.vacate();
      try (ReceivedDescriptor readOnly = channel.fetch(fdClient.sessionId(), a.segmentId(), true)) {
        GpuMemException e = assertThrows(GpuMemException.class, () -> mapping.refill(readOnly));
        assertTrue(e.getMessage().contains("read-only"), e.getMessage());
      }
      assertTrue(mapping.vacated(), "a refused refill leaves it vacated");
      try (ReceivedDescriptor own = channel.fetch(fdClient.sessionId(), a.segmentId(), false)) {
        mapping.refill(own);
      }
      assertEquals(0x44, buffer.get((int) SIZE - 1));
      assertEquals(address, pointer(a.buffer()));
      a.close();
      b.close();
    }
  }

  private static void fill(ByteBuffer buffer, byte value) {
    for (int i = 0; i < buffer.capacity(); i++) {
      buffer.put(i, value);
    }
  }

  private static long pointer(ByteBuffer buffer) {
    return com.sun.jna.Pointer.nativeValue(Native.getDirectBufferPointer(buffer));
  }

  private static String maps() throws IOException {
    return Files.readString(Path.of("/proc/self/maps"));
  }

  /**
   * The /proc/self/maps line of the mapping that holds {@code address}, or null (an anonymous
   * reservation may show merged with a neighbour of the same protection: the line holds it).
   */
  private static String[] rangeAt(long address) throws IOException {
    for (String line : maps().split("\n")) {
      String[] fields = line.trim().split("\\s+", 6);
      int dash = fields[0].indexOf('-');
      long start = Long.parseUnsignedLong(fields[0].substring(0, dash), 16);
      long end = Long.parseUnsignedLong(fields[0].substring(dash + 1), 16);
      if (Long.compareUnsigned(start, address) <= 0 && Long.compareUnsigned(address, end) < 0) {
        return fields;
      }
    }
    return null;
  }

  private static String permissions(long address) throws IOException {
    String[] fields = rangeAt(address);
    return fields == null ? null : fields[1];
  }

  private static String mappedFileOrNull(long address) throws IOException {
    String[] fields = rangeAt(address);
    return fields == null || fields.length < 6 ? null : fields[5];
  }

  private static String mappedFile(long address) throws IOException {
    String file = mappedFileOrNull(address);
    assertTrue(file != null && file.startsWith("/"), "a file mapped at 0x" + Long.toHexString(address) + ": " + file);
    return file;
  }
}
