package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.common.unix.Descriptors;
import io.gpumemd.common.unix.MessageBuffer;
import io.gpumemd.common.unix.UnixSockets;
import io.gpumemd.proto.v1.FdGrant;
import io.gpumemd.proto.v1.FdRefusal;
import io.gpumemd.proto.v1.FdReply;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The client's reading of fd-channel replies on a real socket pair: as few receives as the
 * kernel allows, what follows a reply kept for the next read, and a descriptor anywhere but on
 * the byte after a grant refused.
 */
class FdFramesTest {
  @TempDir Path dir;
  private int listening = -1;
  private int daemon = -1;
  private int client = -1;
  private int file = -1;
  private final List<Integer> received = new ArrayList<>();
  private final FdFrames frames = new FdFrames();
  private MessageBuffer buffer;

  @BeforeEach
  void connect() throws Exception {
    String path = dir.resolve("s.sock").toString();
    listening = UnixSockets.listen(path);
    client = UnixSockets.connect(path, 5_000);
    daemon = UnixSockets.accept(listening);
    buffer = new MessageBuffer(1024, 1);
    Path p = dir.resolve("segment");
    Files.write(p, new byte[4096]);
    file = Descriptors.open(p.toString(), true);
  }

  @AfterEach
  void close() {
    frames.reset();
    buffer.close();
    received.forEach(Descriptors::closeQuietly);
    for (int fd : new int[] {file, client, daemon, listening}) {
      Descriptors.closeQuietly(fd);
    }
  }

  private static byte[] frame(FdReply reply) {
    byte[] bytes = reply.toByteArray();
    return ByteBuffer.allocate(4 + bytes.length).putInt(bytes.length).put(bytes).array();
  }

  private static FdReply granted(long requestId, long segment) {
    return FdReply.newBuilder().setRequestId(requestId).setPushed(true)
        .setGranted(FdGrant.newBuilder().setSegmentId(segment).setSegmentBytes(4096)).build();
  }

  private static FdReply refused(long requestId) {
    return FdReply.newBuilder().setRequestId(requestId)
        .setRefused(FdRefusal.newBuilder().setCode(5).setMessage("segment 9 not found")).build();
  }

  private FdFrames.Frame read() throws IOException {
    FdFrames.Frame frame = frames.read(client, buffer);
    if (frame.fd() >= 0) {
      received.add(frame.fd());
    }
    return frame;
  }

  @Test
  void repliesThatCameTogether_areReadOneByOne_eachGrantWithItsDescriptor() throws Exception {
    byte[] refusal = frame(refused(1));
    byte[] grant = frame(granted(2, 7));
    byte[] both = ByteBuffer.allocate(refusal.length + grant.length).put(refusal).put(grant).array();
    try (MessageBuffer send = new MessageBuffer(1024, 1)) {
      send.sendWithDescriptorAfter(daemon, both, 0, both.length, file);
      send.sendWithDescriptorAfter(daemon, frame(granted(3, 8)), 0, frame(granted(3, 8)).length, file);
    }

    FdFrames.Frame first = read();
    assertEquals(1, first.reply().getRequestId());
    assertEquals(-1, first.fd(), "a refusal carries none");
    assertTrue(frames.buffered(), "the grant that came with it waits here");
    FdFrames.Frame second = read();
    assertEquals(7, second.reply().getGranted().getSegmentId());
    assertEquals(4096, Descriptors.size(second.fd()), "the segment's file");
    assertFalse(frames.buffered(), "the descriptor's byte ended the receive");
    assertTrue(UnixSockets.readable(client) > 0, "the next push is still in the socket");
    FdFrames.Frame third = read();
    assertEquals(8, third.reply().getGranted().getSegmentId());
    assertTrue(third.fd() >= 0 && third.fd() != second.fd());
  }

  @Test
  void aDescriptorOnAByteOfAFrame_failsTheRead() throws Exception {
    byte[] refusal = frame(refused(1));
    UnixSockets.send(daemon, refusal, List.of(file)); // the descriptor on the frame's first byte
    IOException e = assertThrows(IOException.class, this::read);
    assertTrue(e.getMessage().contains("a descriptor came where the protocol has none"), e.getMessage());
  }

  @Test
  void aGrantWithoutItsDescriptor_failsTheRead() throws Exception {
    byte[] grant = frame(granted(2, 7));
    UnixSockets.send(daemon, java.util.Arrays.copyOf(grant, grant.length + 1), List.of());
    IOException e = assertThrows(IOException.class, this::read);
    assertTrue(e.getMessage().contains("without its descriptor"), e.getMessage());
  }
}
