package io.gpumemd.common.unix;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.EOFException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The Unix-socket layer on a real socket pair in this process: bytes, descriptors, credentials. */
class UnixSocketsTest {
  @TempDir Path dir;
  private int listening = -1;
  private int near = -1;
  private int far = -1;
  private final List<Integer> opened = new ArrayList<>();

  @BeforeEach
  void connect() throws Exception {
    String path = dir.resolve("s.sock").toString();
    listening = UnixSockets.listen(path);
    near = UnixSockets.connect(path, 5_000);
    far = UnixSockets.accept(listening);
  }

  @AfterEach
  void close() {
    opened.forEach(Descriptors::closeQuietly);
    UnixSockets.closeQuietly(near);
    UnixSockets.closeQuietly(far);
    UnixSockets.closeQuietly(listening);
  }

  private int file(String name, int bytes) throws Exception {
    Path p = dir.resolve(name);
    Files.write(p, new byte[bytes]);
    int fd = Descriptors.open(p.toString(), true);
    opened.add(fd);
    return fd;
  }

  private static Path target(int fd) throws Exception {
    return Files.readSymbolicLink(Path.of("/proc/self/fd/" + fd));
  }

  @Test
  void send_withDescriptors_receivesTheBytesAndNewNumbersOfTheSameFiles() throws Exception {
    int a = file("a", 10);
    int b = file("b", 20);
    byte[] bytes = "hello".getBytes(StandardCharsets.UTF_8);

    UnixSockets.send(near, bytes, List.of(a, b));
    byte[] out = new byte[bytes.length];
    ArrayDeque<Integer> fds = new ArrayDeque<>();
    UnixSockets.receive(far, out, 0, out.length, fds);
    fds.forEach(opened::add);

    assertArrayEquals(bytes, out);
    assertEquals(2, fds.size());
    int ra = fds.poll();
    int rb = fds.poll();
    assertEquals(target(a), target(ra));
    assertEquals(target(b), target(rb));
    assertEquals(10, Descriptors.size(ra));
    assertEquals(20, Descriptors.size(rb));
  }

  @Test
  void messageBuffer_readsAFrameAndTheDescriptorAfterIt_inOneReceive() throws Exception {
    int a = file("a", 7);
    try (MessageBuffer send = new MessageBuffer(64, 1); MessageBuffer receive = new MessageBuffer(64, 1)) {
      send.sendAll(near, new byte[] {1, 2, 3}, 0, 3, List.of(), null);
      send.sendAll(near, new byte[] {9}, 0, 1, List.of(a), null);
      byte[] out = new byte[64];
      List<Integer> fds = new ArrayList<>();
      int got = 0;
      while (got < 4) {
        got += receive.receive(far, out, got, 64 - got, fds::add);
      }
      fds.forEach(opened::add);
      assertEquals(4, got);
      assertArrayEquals(new byte[] {1, 2, 3, 9}, java.util.Arrays.copyOf(out, 4));
      assertEquals(1, fds.size());
      assertEquals(target(a), target(fds.get(0)));
    }
  }

  @Test
  void sendWithDescriptorAfter_sendsTheBytes_thenTheDescriptorOnAByteOfItsOwn() throws Exception {
    int a = file("a", 7);
    try (MessageBuffer send = new MessageBuffer(64, 1); MessageBuffer receive = new MessageBuffer(64, 1)) {
      send.sendWithDescriptorAfter(near, new byte[] {5, 1, 2, 3}, 1, 3, a);
      send.sendWithDescriptorAfter(near, new byte[] {4}, 0, 1, a);
      assertEquals(6, UnixSockets.readable(far), "both messages and their bytes of 0");
      byte[] out = new byte[64];
      List<Integer> fds = new ArrayList<>();
      assertEquals(3, receive.receive(far, out, 0, 3, fds::add), "the bytes alone");
      assertEquals(List.of(), fds, "the descriptor is not on them");
      int got = receive.receive(far, out, 3, 61, fds::add);
      fds.forEach(opened::add);
      assertEquals(1, got, "the kernel ends a receive with the byte that carried a descriptor");
      assertArrayEquals(new byte[] {1, 2, 3, 0}, java.util.Arrays.copyOf(out, 4));
      assertEquals(1, fds.size());
      assertEquals(target(a), target(fds.get(0)));
      assertEquals(2, receive.receive(far, out, 0, 64, fds::add), "the second message and its byte");
      fds.forEach(opened::add);
      assertEquals(2, fds.size());
    }
  }

  @Test
  void reopen_isANewDescriptionOfTheSameFile_withAModeOfItsOwn() throws Exception {
    Path p = dir.resolve("r");
    Files.write(p, new byte[3]);
    int readWrite = Descriptors.open(p.toString(), false);
    opened.add(readWrite);
    int readOnly = Descriptors.reopen(readWrite, true);
    opened.add(readOnly);
    int again = Descriptors.reopen(readWrite, false);
    opened.add(again);
    assertEquals(target(readWrite), target(readOnly));
    assertEquals(target(readWrite), target(again));
    assertEquals(0, accessMode(readOnly), "O_RDONLY");
    assertEquals(2, accessMode(again), "O_RDWR");
    Descriptors.size(readOnly); // moves its offset to the end: not the other descriptions'
    assertEquals("0", flag(readWrite, "pos:"));
    assertEquals(ErrnoCalls.ErrnoException.class, assertThrows(java.io.IOException.class,
        () -> Descriptors.reopen(Integer.MAX_VALUE, true)).getClass(), "no such descriptor");
  }

  private static int accessMode(int fd) throws Exception {
    return Integer.parseInt(flag(fd, "flags:"), 8) & 3;
  }

  private static String flag(int fd, String name) throws Exception {
    for (String line : Files.readAllLines(Path.of("/proc/self/fdinfo/" + fd))) {
      if (line.startsWith(name)) {
        return line.substring(name.length()).trim();
      }
    }
    throw new AssertionError(name + " not in fdinfo of " + fd);
  }

  @Test
  void peerCredentials_areThisProcess() throws Exception {
    int[] credentials = UnixSockets.peerCredentials(far);
    assertEquals(ProcessHandle.current().pid(), credentials[0]);
    assertEquals(credentials[1], UnixSockets.peerCredentials(near)[1], "same uid both ways");
  }

  @Test
  void queuedForPeer_isZeroOnlyOnceThePeerReadEverything() throws Exception {
    assertEquals(0, UnixSockets.queuedForPeer(near));
    UnixSockets.send(near, new byte[5], List.of());
    assertTrue(UnixSockets.queuedForPeer(near) > 0, "5 bytes wait unread");
    UnixSockets.receive(far, new byte[5], 0, 5, new ArrayDeque<>());
    assertEquals(0, UnixSockets.queuedForPeer(near));
  }

  @Test
  void receive_afterThePeerClosed_isEof() throws Exception {
    UnixSockets.closeQuietly(near);
    near = -1;
    assertThrows(EOFException.class, () -> UnixSockets.receive(far, new byte[1], 0, 1, new ArrayDeque<>()));
  }

  @Test
  void receive_pastItsTimeout_isATimeout() throws Exception {
    UnixSockets.timeouts(far, 50);
    ErrnoCalls.ErrnoException e = assertThrows(ErrnoCalls.ErrnoException.class,
        () -> UnixSockets.receive(far, new byte[1], 0, 1, new ArrayDeque<>()));
    assertTrue(e.timedOut(), e.getMessage());
  }

  @Test
  void close_releasesTheNumber() throws Exception {
    int a = Descriptors.open(dir.toString(), true); // a directory opens read-only too
    assertTrue(Files.exists(Path.of("/proc/self/fd/" + a), LinkOption.NOFOLLOW_LINKS));
    Descriptors.close(a);
    assertFalse(Files.exists(Path.of("/proc/self/fd/" + a), LinkOption.NOFOLLOW_LINKS));
  }
}
