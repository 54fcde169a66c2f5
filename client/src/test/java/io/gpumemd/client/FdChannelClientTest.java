package io.gpumemd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.gpumemd.server.testing.TestDaemon;
import io.grpc.Status;
import java.nio.ByteBuffer;
import java.nio.ReadOnlyBufferException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The Java client on a daemon that passes host segments as descriptors ({@code --host-segments
 * fd}): {@link FdChannelClient} itself (a descriptor of the very segment, the daemon's refusals
 * with their codes, a connection found again after the daemon closed it, nothing after close),
 * and leases mapped through it, read-write and read-only.
 */
class FdChannelClientTest {
  private static final String UNKNOWN_SESSION = "0123456789abcdef0123456789abcdef";

  private TestDaemon daemon;
  private GpuMemClient client;

  @AfterEach
  void stop() {
    try {
      if (client != null) {
        client.close();
      }
    } finally {
      if (daemon != null) {
        daemon.close();
      }
    }
  }

  private GpuMemClient start(String... flags) {
    daemon = TestDaemon.start(flags);
    client = GpuMemClient.connect(daemon.unixTarget());
    return client;
  }

  @Test
  void lease_isMappedByDescriptor_andAFetchedDescriptorMapsTheSameBytes() throws Exception {
    start("--host-segments", "fd");
    try (Lease lease = client.lease(0, 4096)) {
      assertNull(lease.hostShmPath(), "a segment passed by descriptor has no path");
      ByteBuffer buffer = lease.buffer();
      buffer.putLong(0, 0x1122334455667788L);
      assertEquals(1, client.fdChannel().fetched(), "one descriptor for the lease's mapping");

      Path link;
      try (ReceivedDescriptor d = client.fdChannel().fetch(client.sessionId(), lease.segmentId(), false)) {
        assertTrue(d.number() >= 0);
        assertEquals(lease.segmentBytes(), d.segmentBytes());
        assertFalse(d.readOnly());
        link = Path.of("/proc/self/fd/" + d.number());
        String target = Files.readSymbolicLink(link).toString();
        HostMapping again = d.mapHost();
        // (the daemon in this JVM may reuse the number at once, for something else: no fetch runs)
        assertTrue(!Files.exists(link, LinkOption.NOFOLLOW_LINKS) || !Files.readSymbolicLink(link).toString().equals(target),
            "the descriptor is closed after mapping");
        assertThrows(IllegalStateException.class, d::number, "mapHost closes the descriptor");
        try {
          assertEquals(0x1122334455667788L, again.slice(lease.offset(), 8).getLong(0));
        } finally {
          again.close();
        }
      }
    }
  }

  @Test
  void readOnlyFetch_mapsReadOnly_andWritesThrow() {
    start("--host-segments", "fd");
    try (Lease lease = client.lease(0, 4096)) {
      lease.buffer().put(0, (byte) 42);
      try (ReceivedDescriptor d = client.fdChannel().fetch(client.sessionId(), lease.segmentId(), true)) {
        assertTrue(d.readOnly(), "asked read-only, granted read-only");
        HostMapping mapping = d.mapHost();
        try {
          ByteBuffer view = mapping.slice(lease.offset(), 16);
          assertTrue(view.isReadOnly());
          assertEquals(42, view.get(0));
          assertThrows(ReadOnlyBufferException.class, () -> view.put(0, (byte) 1));
        } finally {
          mapping.close();
        }
      }
    }
  }

  @Test
  void refusals_carryTheDaemonsCodeAndMessage_andTheConnectionStaysUsable() throws Exception {
    start("--host-segments", "fd");
    try (Lease lease = client.lease(0, 4096)) {
      lease.buffer(); // maps: the connection is open
      long fetched = client.fdChannel().fetched();
      GpuMemException unknown = assertThrows(GpuMemException.class,
          () -> client.fdChannel().fetch(UNKNOWN_SESSION, lease.segmentId(), false));
      assertEquals(Status.Code.NOT_FOUND, unknown.code());
      assertTrue(unknown.serverMessage().contains("not found"), unknown.getMessage());
      GpuMemException notHeld = assertThrows(GpuMemException.class,
          () -> client.fdChannel().fetch(client.sessionId(), lease.segmentId() + 1000, false));
      assertEquals(Status.Code.NOT_FOUND, notHeld.code());
      GpuMemException malformed = assertThrows(GpuMemException.class,
          () -> client.fdChannel().fetch("not-a-session", lease.segmentId(), false));
      assertEquals(Status.Code.INVALID_ARGUMENT, malformed.code(), malformed.getMessage());
      assertEquals(fetched, client.fdChannel().fetched(), "no descriptor came with a refusal");
      try (ReceivedDescriptor d = client.fdChannel().fetch(client.sessionId(), lease.segmentId(), false)) {
        assertEquals(lease.segmentBytes(), d.segmentBytes(), "the same connection still grants");
      }
    }
  }

  @Test
  void pathSegments_areMappedByPath_withoutTheFdChannel() {
    start("--host-segments", "path");
    try (Lease lease = client.lease(0, 4096)) {
      assertTrue(lease.hostShmPath() != null && !lease.hostShmPath().isEmpty());
      lease.buffer().put(0, (byte) 7);
      assertEquals(0, client.fdChannel().fetched());
      assertFalse(client.fdChannel().connected());
    }
  }

  @Test
  void aBrokenConnection_isOpenedAgain_andCloseEndsTheChannel() {
    start("--host-segments", "fd");
    try (Lease lease = client.lease(0, 4096)) {
      lease.buffer();
      assertTrue(client.fdChannel().connected());
      // A connection that broke under the client (as when the daemon closes it or restarts):
      // the next fetch finds that out and connects again.
      FdChannelClient channel = client.fdChannel();
      channel.breakForTest();
      try (ReceivedDescriptor d = channel.fetch(client.sessionId(), lease.segmentId(), false)) {
        assertNotEquals(-1, d.number());
      }
      channel.close();
      assertFalse(channel.connected());
      GpuMemException closed = assertThrows(GpuMemException.class,
          () -> channel.fetch(client.sessionId(), lease.segmentId(), false));
      assertEquals(Status.Code.CANCELLED, closed.code());
    }
  }

  @Test
  void aSocketBoundAnewOnThePath_isConnectedAgain_theOldConnectionLeft() throws Exception {
    start("--host-segments", "fd");
    try (Lease lease = client.lease(0, 4096);
         TestDaemon other = TestDaemon.start("--host-segments", "fd")) {
      lease.buffer();
      Path path = daemon.server().fdSocketPath();
      // Another daemon's socket now on the path (as after a restart), while the old daemon still
      // answers on the old connection: only the new one does not know this session.
      Files.move(other.server().fdSocketPath(), path, StandardCopyOption.REPLACE_EXISTING,
          StandardCopyOption.ATOMIC_MOVE);
      GpuMemException e = assertThrows(GpuMemException.class,
          () -> client.fdChannel().fetch(path.toString(), client.sessionId(), lease.segmentId(), false));
      assertEquals(Status.Code.NOT_FOUND, e.code(), "asked the daemon now on the path: " + e.getMessage());
    }
  }

  @Test
  void aTokenTenantsLease_onFdSegments_failsSayingItNeedsPaths_andIsReleased() throws Exception {
    Path dir = Files.createTempDirectory(Path.of("/tmp"), "fd-token-");
    try {
      Path tokens = Files.writeString(dir.resolve("tokens"), "team-a-token-0123456789abc team-a\n");
      Files.setPosixFilePermissions(tokens, PosixFilePermissions.fromString("rw-------"));
      start("--host-segments", "fd", "--tokens-file", tokens.toString());
      try (GpuMemClient team = GpuMemClient.builder(daemon.unixTarget()).bearerToken("team-a-token-0123456789abc")
          .connect()) {
        GpuMemException e = assertThrows(GpuMemException.class, () -> team.lease(0, 4096));
        assertEquals(Status.Code.FAILED_PRECONDITION, e.code(), e.getMessage());
        assertTrue(e.getMessage().contains("--host-segments path"), e.getMessage());
        assertEquals(0, daemon.server().registry().liveLeases(), "the lease it could not map is released");
      }
    } finally {
      try (Stream<Path> files = Files.walk(dir)) {
        files.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }

  @Test
  void aMissingChannel_isUnavailable_withThePathInTheMessage() {
    start("--host-segments", "path");
    FdChannelClient channel = new FdChannelClient(daemon.unixTarget(), 2000);
    try {
      GpuMemException e = assertThrows(GpuMemException.class, () -> channel.fetch(client.sessionId(), 1, false));
      assertEquals(Status.Code.UNAVAILABLE, e.code());
      assertTrue(e.getMessage().contains(".fd"), e.getMessage());
    } finally {
      channel.close();
    }
  }

  @Test
  void socketPath_isTheNamedOne_orItsNameNextToTheOwnSocket() throws Exception {
    Path dir = Files.createTempDirectory("fd-path");
    try {
      Path own = dir.resolve("gpumemd.sock");
      Path named = dir.resolve("named.fd");
      assertEquals("/elsewhere/gpumemd.sock.fd",
          FdChannelClient.socketPath("/elsewhere/gpumemd.sock", "/run/daemon/gpumemd.sock.fd"));
      assertEquals(dir.resolve("gpumemd.sock.fd").toString(),
          FdChannelClient.socketPath(own.toString(), "/run/nowhere/gpumemd.sock.fd"));
      Files.createFile(named);
      assertEquals(named.toString(), FdChannelClient.socketPath("/elsewhere/x.sock", named.toString()),
          "a path that exists is used as named");
      assertEquals("/run/x.fd", FdChannelClient.socketPath(null, "/run/x.fd"), "a TCP client has no own socket");
    } finally {
      Files.deleteIfExists(dir.resolve("named.fd"));
      Files.delete(dir);
    }
  }

  // ------------------------------------------------------------------------- pushed descriptors

  /** Leases {@code n} blocks of 2 MiB, each a segment of its own, writing {@code n} into each. */
  private static java.util.List<Lease> leaseNewSegments(GpuMemClient c, int n) {
    java.util.List<Lease> leases = new java.util.ArrayList<>();
    for (int i = 0; i < n; i++) {
      Lease lease = c.lease(0, 2 << 20);
      lease.buffer().putInt(0, 1000 + i);
      leases.add(lease);
    }
    assertEquals(n, leases.stream().mapToLong(Lease::segmentId).distinct().count(), "each lease a new segment");
    return leases;
  }

  @Test
  void newSegmentsAfterTheFirst_comePushedBeforeTheirReplies_andMapTheSegmentsBytes() {
    daemon = TestDaemon.start("--host-segments", "fd");
    client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect();
    java.util.List<Lease> leases = leaseNewSegments(client, 6);
    try (GpuMemClient reader = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect()) {
      assertEquals(6, client.fdChannel().fetched(), "one descriptor per mapping");
      assertEquals(5, client.fdChannel().pushed(), "the first asked for (and the session bound), the rest pushed");
      assertEquals(0, client.fdChannel().pushedKept(), "every push taken by its lease");
      for (int i = 0; i < leases.size(); i++) {
        // the same bytes through a descriptor asked for by another client
        try (ReceivedDescriptor d = reader.fdChannel().fetch(client.sessionId(), leases.get(i).segmentId(), true)) {
          HostMapping again = d.mapHost();
          try {
            assertEquals(1000 + i, again.slice(leases.get(i).offset(), 4).getInt(0));
          } finally {
            again.close();
          }
        }
      }
    }
    // a segment the session was sent already is not pushed again: a second lease there asks nothing
    long before = client.fdChannel().fetched();
    leases.forEach(Lease::close);
    leaseNewSegments(client, 3).forEach(Lease::close);
    assertEquals(before, client.fdChannel().fetched(), "the segments are mapped here already");
    assertEquals(0, client.fdChannel().pushedKept(), "and nothing was pushed for them");
  }

  @Test
  void aClientWithPushesOff_asksForEverySegment_asBefore() {
    daemon = TestDaemon.start("--host-segments", "fd");
    System.setProperty(FdChannelClient.PUSH_PROPERTY, "false");
    try {
      client = GpuMemClient.builder(daemon.unixTarget()).clientCacheBytes(0).connect();
    } finally {
      System.clearProperty(FdChannelClient.PUSH_PROPERTY);
    }
    leaseNewSegments(client, 4).forEach(Lease::close);
    assertEquals(4, client.fdChannel().fetched());
    assertEquals(0, client.fdChannel().pushed(), "a client that never binds is never pushed a descriptor");
  }
}
