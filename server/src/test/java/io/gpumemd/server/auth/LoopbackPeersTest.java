package io.gpumemd.server.auth;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ProtocolFamily;
import java.net.StandardProtocolFamily;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import org.junit.jupiter.api.Test;

/**
 * Loopback TCP peers are found in the kernel's socket tables with their owner's uid, whether
 * the sockets are IPv4-only ({@code /proc/net/tcp}) or dual-stack IPv6 ({@code tcp6}, with an
 * IPv4-mapped address); a peer with no socket here is not found.
 */
class LoopbackPeersTest {
  private static final int MY_UID = IdentityPolicy.currentUid();

  private static int ownerOfAConnection(ProtocolFamily family) throws Exception {
    try (ServerSocketChannel server = ServerSocketChannel.open(family)) {
      server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
      try (SocketChannel client = SocketChannel.open(family)) {
        client.connect(server.getLocalAddress());
        try (SocketChannel accepted = server.accept()) {
          // As the daemon sees it: the remote end is the client, the local end is us.
          return LoopbackPeers.ownerOf((InetSocketAddress) accepted.getRemoteAddress(),
              (InetSocketAddress) accepted.getLocalAddress());
        }
      }
    }
  }

  @Test
  void ipv4Sockets_areFoundInTcp() throws Exception {
    assertEquals(MY_UID, ownerOfAConnection(StandardProtocolFamily.INET));
  }

  @Test
  void dualStackSockets_areFoundInTcp6AsMappedAddresses() throws Exception {
    assertEquals(MY_UID, ownerOfAConnection(StandardProtocolFamily.INET6));
  }

  @Test
  void aPeerWithNoSocketHere_isNotFound() throws Exception {
    try (ServerSocketChannel server = ServerSocketChannel.open()) {
      server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
      InetSocketAddress self = (InetSocketAddress) server.getLocalAddress();
      assertEquals(-1, LoopbackPeers.ownerOf(new InetSocketAddress("127.0.0.1", 1), self));
    }
  }

  @Test
  void encoding_matchesTheKernelsFormat() {
    assertEquals("0100007F:1F90", LoopbackPeers.encode(new InetSocketAddress("127.0.0.1", 8080), false));
    assertEquals("0000000000000000FFFF00000100007F:1F90",
        LoopbackPeers.encode(new InetSocketAddress("127.0.0.1", 8080), true));
  }
}
