package io.gpumemd.server.backend;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.unix.FileDescriptor;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
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
      Path link = Path.of("/proc/self/fd/" + number);
      Path pipeRead = Files.readSymbolicLink(link);

      descriptor.close();

      // Another thread of this JVM may open a file and get the freed number at once: the number
      // must no longer name this pipe, whatever it names now.
      assertFalse(pipeRead.equals(target(link)), "the descriptor is closed: " + number + " still names " + pipeRead);
      assertDoesNotThrow(descriptor::close, "a second close closes nothing (the number may be another file's now)");
    } finally {
      pipe[1].close();
    }
  }

  /** What a descriptor's /proc link names, or null for a closed number. */
  private static Path target(Path link) throws IOException {
    try {
      return Files.readSymbolicLink(link);
    } catch (NoSuchFileException e) {
      return null;
    }
  }

  @Test
  void ofNative_refusesANegativeNumber() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> SegmentFd.ofNative(-1, false));
    assertEquals("descriptor: -1 (expected: >= 0)", e.getMessage());
  }
}
