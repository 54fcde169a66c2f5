package io.gpumemd.server.backend;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/**
 * A descriptor number that native code opened (as {@code cuMemExportToShareableHandle} does),
 * owned by a {@link SegmentFd}: closed once, by it, whatever else asks. A pipe stands in
 * for the export, since it too is a bare number no Java object owns.
 */
class SegmentFdTest {
  @Test
  void ofNative_closesTheNumberOnce() throws Exception {
    Epoll.ensureAvailability(); // loads the natives the pipe needs
    FileDescriptor[] pipe = FileDescriptor.pipe();
    int number = pipe[0].intValue();
    try {
      SegmentFd descriptor = SegmentFd.ofNative(number, true);
      assertEquals(number, descriptor.number());
      assertTrue(descriptor.readOnly());
      assertTrue(Files.exists(Path.of("/proc/self/fd/" + number)));

      descriptor.close();

      assertFalse(Files.exists(Path.of("/proc/self/fd/" + number)), "the descriptor is closed");
      assertDoesNotThrow(descriptor::close, "a second close closes nothing (the number may be another file's now)");
    } finally {
      pipe[1].close();
    }
  }

  @Test
  void ofNative_refusesANegativeNumber() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> SegmentFd.ofNative(-1, false));
    assertEquals("descriptor: -1 (expected: >= 0)", e.getMessage());
  }
}
