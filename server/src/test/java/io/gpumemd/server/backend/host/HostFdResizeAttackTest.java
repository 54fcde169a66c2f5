package io.gpumemd.server.backend.host;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.gpumemd.proto.v1.FdReply;
import io.gpumemd.proto.v1.FdRequest;
import io.gpumemd.server.auth.Caller;
import io.gpumemd.server.auth.IdentityPolicy;
import io.gpumemd.server.backend.FdPassedSegment;
import io.gpumemd.server.backend.SegmentFd;
import io.gpumemd.server.books.LeaseRecord;
import io.gpumemd.server.session.SessionRegistry;
import io.gpumemd.server.testing.OtherUser;
import io.gpumemd.server.testing.TestDaemon;
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A tenant's process that holds a writable descriptor of its own segment tries to resize it, as
 * an attacker would: a real process under uid 65534 (started with {@code setpriv}; the test runs
 * as root) fetches descriptors from a real daemon's fd channel for a lease of its tenant, then
 * grows the segment ({@code ftruncate}, {@code posix_fallocate}, {@code fallocate} with {@code
 * FALLOC_FL_KEEP_SIZE}), shrinks it, and tries to seal it against the daemon's writes. Each must
 * fail with EPERM and leave the segment's size as it was, while writing into it still works for
 * the client and the daemon alike.
 */
class HostFdResizeAttackTest {
  private static final int NOBODY = OtherUser.NOBODY;
  private static final long SEGMENT = 2L << 20;

  /**
   * The attacker: speaks the fd channel's frames (bytes made by the test, so it needs no
   * protobuf), receives the descriptors, attacks, and prints one {@code key=value} line per try
   * (the errno's name, or {@code ok}).
   */
  private static final String ATTACKER = String.join("\n",
      "import ctypes, errno, fcntl, os, socket, struct, sys",
      "def out(key, value): print('%s=%s' % (key, value), flush=True)",
      "def exactly(sock, n):",
      "    data = b''",
      "    while len(data) < n:",
      "        chunk = sock.recv(n - len(data))",
      "        if not chunk: raise OSError('the daemon closed the fd channel')",
      "        data += chunk",
      "    return data",
      "def fetch(sock, frame):",
      "    sock.sendall(bytes.fromhex(frame))",
      "    (length,) = struct.unpack('>I', exactly(sock, 4))",
      "    reply = exactly(sock, length)",
      "    out('reply', reply.hex())",
      "    data, fds, flags, _ = socket.recv_fds(sock, 1, 1)",
      "    return fds[0]",
      "def attempt(key, call):",
      "    try:",
      "        call()",
      "        out(key, 'ok')",
      "    except OSError as e:",
      "        out(key, errno.errorcode.get(e.errno, e.errno))",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]",
      "def fallocate_keep_size(fd, offset, length):",
      "    if libc.fallocate(fd, 1, offset, length) != 0:",  // FALLOC_FL_KEEP_SIZE
      "        raise OSError(ctypes.get_errno(), 'fallocate')",
      "sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)",
      "sock.settimeout(30)",
      "sock.connect(sys.argv[1])",
      "fd = fetch(sock, sys.argv[2])",
      "size = os.fstat(fd).st_size",
      "out('uid', os.getuid())",
      "out('size_before', size)",
      "attempt('ftruncate_grow', lambda: os.ftruncate(fd, 1 << 30))",
      "attempt('ftruncate_shrink', lambda: os.ftruncate(fd, size // 2))",
      "attempt('posix_fallocate_beyond', lambda: os.posix_fallocate(fd, size, 1 << 20))",
      "attempt('fallocate_keep_size_beyond', lambda: fallocate_keep_size(fd, size, 1 << 20))",
      "attempt('add_write_seal', lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE))",
      "attempt('pwrite_inside', lambda: os.pwrite(fd, b'attacker', 0))",
      "out('size_after', os.fstat(fd).st_size)",
      "ro = fetch(sock, sys.argv[3])",
      "attempt('reopen_read_only_read_write', lambda: os.close(os.open('/proc/self/fd/%d' % ro, os.O_RDWR)))",
      "");

  private TestDaemon daemon;

  @AfterEach
  void stop() {
    if (daemon != null) {
      daemon.close();
    }
  }

  private static String frame(long id, String session, long segment, boolean readOnly) {
    byte[] body = FdRequest.newBuilder().setRequestId(id).setSessionId(session).setSegmentId(segment)
        .setReadOnly(readOnly).build().toByteArray();
    return HexFormat.of().formatHex(ByteBuffer.allocate(4 + body.length).putInt(body.length).put(body).array());
  }

  /** Runs the attacker as uid 65534; its {@code key=value} lines. */
  private static Map<String, String> attackAs(int uid, Path fdSocket, String writable, String readOnly)
      throws Exception {
    Process p = new ProcessBuilder("setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups",
        "/usr/bin/python3", "-c", ATTACKER, fdSocket.toString(), writable, readOnly)
        .directory(new File("/tmp")).redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
      throw new AssertionError("the attacker failed: " + out);
    }
    Map<String, String> result = new HashMap<>();
    for (String line : out.split("\n")) {
      int eq = line.indexOf('=');
      if (eq > 0) {
        result.put(line.substring(0, eq), line.substring(eq + 1));
      }
    }
    return result;
  }

  @Test
  void writableDescriptorOfAnotherUid_cannotGrowOrShrinkTheSegment_andWritesStillWork() throws Exception {
    assumeTrue(OtherUser.available(), "needs root and setpriv to run the attacker as another uid");
    daemon = TestDaemon.start("--host-segments", "fd", "--socket-mode", "0666");
    Path fdSocket = daemon.server().fdSocketPath();
    OtherUser.openUp(fdSocket.getParent());
    SessionRegistry registry = daemon.server().registry();
    Caller attacker = IdentityPolicy.defaults().unixPeer(NOBODY, NOBODY, 0);
    String session = registry.open(attacker, "attacker", 0, -1).id();
    LeaseRecord lease = registry.lease(attacker, session, 0, SEGMENT, false, "", false);
    long segment = lease.block().segmentId();
    assertEquals(SEGMENT, lease.block().segmentBytes());

    Map<String, String> seen = attackAs(NOBODY, fdSocket, frame(1, session, segment, false),
        frame(2, session, segment, true));

    String replies = FdReply.parseFrom(HexFormat.of().parseHex(seen.getOrDefault("reply", ""))).toString();
    assertEquals(Integer.toString(NOBODY), seen.get("uid"), seen + " " + replies);
    assertEquals(Long.toString(SEGMENT), seen.get("size_before"), seen.toString());
    assertEquals("EPERM", seen.get("ftruncate_grow"), seen.toString());
    assertEquals("EPERM", seen.get("ftruncate_shrink"), seen.toString());
    assertEquals("EPERM", seen.get("posix_fallocate_beyond"), seen.toString());
    assertEquals("EPERM", seen.get("fallocate_keep_size_beyond"), seen.toString());
    assertEquals("EPERM", seen.get("add_write_seal"), "F_SEAL_SEAL: nobody stops the daemon's writes " + seen);
    assertEquals("ok", seen.get("pwrite_inside"), "clients write: no write seal " + seen);
    assertEquals(Long.toString(SEGMENT), seen.get("size_after"), seen.toString());
    assertEquals("EACCES", seen.get("reopen_read_only_read_write"),
        "the memfd is the daemon's, mode 0600, not a memfd's 0777 " + seen);

    FdPassedSegment memory = (FdPassedSegment) lease.block().memory();
    try (SegmentFd held = memory.open(true)) {
      Path file = Path.of("/proc/self/fd/" + held.number());
      assertEquals(SEGMENT, Files.size(file), "the daemon's segment keeps its size");
      assertArrayEquals("attacker".getBytes(StandardCharsets.US_ASCII), read(file, 8), "the client's write landed");
      daemon.server().backend().zero(lease.block().memory(), 0, SEGMENT);
      assertArrayEquals(new byte[8], read(file, 8), "the daemon still writes (zeroes) the segment");
    }
  }

  private static byte[] read(Path file, int length) throws Exception {
    try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
      ByteBuffer buffer = ByteBuffer.allocate(length);
      while (buffer.hasRemaining() && channel.read(buffer, buffer.position()) >= 0) {
        // a short read goes on where it stopped
      }
      return buffer.array();
    }
  }
}
