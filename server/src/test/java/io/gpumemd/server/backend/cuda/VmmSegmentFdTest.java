package io.gpumemd.server.backend.cuda;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.jna.Function;
import com.sun.jna.NativeLibrary;
import io.gpumemd.server.backend.SegmentFd;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/**
 * The exported descriptor of a VMM segment between the export and its owner (issue 33 item 6):
 * whatever fails there, the number is closed, never leaked. No GPU needed: a descriptor of
 * {@code /dev/null} opened by native code stands for the export.
 */
class VmmSegmentFdTest {
  private static final Function OPEN = NativeLibrary.getInstance("c").getFunction("open");

  private static int nativeDescriptor() {
    int fd = OPEN.invokeInt(new Object[] {"/dev/null", 0});
    assertTrue(fd >= 0, "open(/dev/null)");
    return fd;
  }

  private static boolean isOpen(int fd) {
    return Files.exists(Path.of("/proc/self/fd/" + fd), java.nio.file.LinkOption.NOFOLLOW_LINKS);
  }

  @Test
  void own_whenWrappingThrowsIOException_closesTheNumber() {
    int fd = nativeDescriptor();
    IOException thrown = new IOException("cannot own descriptor: no epoll");
    IOException e = assertThrows(IOException.class, () -> VmmSegment.own(fd, false, (n, ro) -> {
      throw thrown;
    }));
    assertSame(thrown, e);
    assertFalse(isOpen(fd), "descriptor " + fd + " leaked");
  }

  @Test
  void own_whenWrappingThrowsRuntimeException_closesTheNumber() {
    int fd = nativeDescriptor();
    assertThrows(IllegalStateException.class, () -> VmmSegment.own(fd, true, (n, ro) -> {
      throw new IllegalStateException("boom");
    }));
    assertFalse(isOpen(fd), "descriptor " + fd + " leaked");
  }

  @Test
  void own_whenWrapped_leavesTheNumberToItsOwner() throws Exception {
    int fd = nativeDescriptor();
    SegmentFd d = VmmSegment.own(fd, true, SegmentFd::ofNative);
    assertEquals(fd, d.number());
    assertTrue(d.readOnly());
    assertTrue(isOpen(fd));
    d.close();
    assertFalse(isOpen(fd));
  }

  @Test
  void canOpenDescriptor_isTrueWithDescriptorsLeft() {
    assertTrue(VmmSegment.canOpenDescriptor());
  }
}
