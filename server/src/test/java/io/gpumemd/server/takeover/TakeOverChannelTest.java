package io.gpumemd.server.takeover;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.takeover.v1.DescriptorBatch;
import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.Taken;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The take-over socket's framing against a peer that breaks it: lengths beyond each direction's
 * bound refused before anything is allocated for them, descriptors where none belong, batches
 * that carry other than they announce. A connected pair of real Unix sockets in this JVM; the
 * raw side writes bytes as a hostile peer would.
 */
class TakeOverChannelTest {
  private Path dir;
  private int listening = -1;
  private TakeOverChannel near;
  private int far = -1;

  @BeforeEach
  void connect() throws IOException {
    dir = Files.createTempDirectory(Path.of("/tmp"), "gpumemd-channel-");
    String path = dir.resolve("s").toString();
    listening = UnixSockets.listen(path);
    near = TakeOverChannel.connect(path, 10_000);
    far = UnixSockets.accept(listening);
  }

  @AfterEach
  void close() throws IOException {
    near.close();
    UnixSockets.closeQuietly(far);
    UnixSockets.closeQuietly(listening);
    try (var walk = Files.walk(dir)) {
      walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }

  private void sendRaw(byte[] bytes, List<Integer> fds) throws IOException {
    UnixSockets.send(far, bytes, fds);
  }

  private static byte[] framed(TakeOverFrame frame) {
    byte[] body = frame.toByteArray();
    return ByteBuffer.allocate(4 + body.length).putInt(body.length).put(body).array();
  }

  private static byte[] header(int length) {
    return ByteBuffer.allocate(5).putInt(length).put((byte) 1).array();
  }

  @Test
  void takerAnnouncingMoreThanAControlFrame_isRefusedBeforeAllocating() throws IOException {
    sendRaw(header(1 << 30), List.of());
    IOException e = assertThrows(IOException.class, near::receiveFromTaker);
    assertEquals("take-over frame of 1073741824 bytes (expected: at most 65536)", e.getMessage());
  }

  @Test
  void holderAnnouncingMoreThanAState_isRefused() throws IOException {
    sendRaw(header(TakeOverChannel.MAX_STATE_BYTES + 1), List.of());
    IOException e = assertThrows(IOException.class, near::receiveFromHolder);
    assertEquals("take-over frame of 268435457 bytes (expected: at most 268435456)", e.getMessage());
  }

  /** 200 MiB announced, 1 byte sent: the reader holds a chunk, and sees the peer leave. */
  @Test
  void largeAnnouncedState_thenClose_isAnEndOfFile() throws IOException {
    sendRaw(header(200 << 20), List.of());
    UnixSockets.closeQuietly(far);
    far = -1;
    assertThrows(EOFException.class, near::receiveFromHolder);
  }

  /** A guard for the chunked read (the old whole-frame read passed it too). */
  @Test
  void stateOfSeveralChunks_arrivesWhole() throws Exception {
    State big = State.newBuilder().setVersion("x".repeat(3 * UnixSockets.MAX_CHUNK_BYTES + 17)).setPid(7).build();
    Thread sender = new Thread(() -> {
      try {
        sendRaw(framed(TakeOverFrame.newBuilder().setState(big).build()), List.of());
      } catch (IOException e) {
        throw new java.io.UncheckedIOException(e);
      }
    });
    sender.start();
    TakeOverFrame frame = near.receiveFromHolder();
    sender.join();
    assertEquals(big, frame.getState());
  }

  @Test
  void descriptorsFromATaker_areClosedAndRefused() throws IOException {
    int extra = UnixSockets.dupOf(far);
    try {
      sendRaw(framed(TakeOverFrame.newBuilder().setTaken(Taken.getDefaultInstance()).build()), List.of(extra));
    } finally {
      UnixSockets.closeQuietly(extra);
    }
    IOException e = assertThrows(IOException.class, near::receiveFromTaker);
    assertEquals("the taker sent 1 descriptor(s) (expected: none; only the holder sends them)", e.getMessage());
    assertTrue(near.takeFds().isEmpty(), "the descriptors should be closed, not kept");
  }

  @Test
  void batchCarryingOtherThanItAnnounces_isRefused() throws IOException {
    int extra = UnixSockets.dupOf(far);
    try {
      sendRaw(framed(TakeOverFrame.newBuilder().setDescriptors(DescriptorBatch.newBuilder().setCount(2)).build()),
          List.of(extra));
    } finally {
      UnixSockets.closeQuietly(extra);
    }
    IOException e = assertThrows(IOException.class, near::receiveFromHolder);
    assertEquals("a descriptor batch announced 2 descriptor(s) and carried 1 (expected: the same, at most 200)",
        e.getMessage());
  }
}
