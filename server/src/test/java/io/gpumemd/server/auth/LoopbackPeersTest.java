package io.gpumemd.server.auth;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import org.junit.jupiter.api.Test;

/** The socket-owner lookup in /proc/net/tcp and tcp6. */
class LoopbackPeersTest {
  @Test
  void v4MappedAddress_isEncodedAsTcp6ListsIt() {
    InetSocketAddress a = new InetSocketAddress(InetAddress.getLoopbackAddress(), 80);
    assertEquals("0100007F:0050", LoopbackPeers.encode(a));
    assertEquals("0000000000000000FFFF00000100007F:0050", LoopbackPeers.encode(LoopbackPeers.v4Mapped(a)));
  }

  @Test
  void loopbackConnection_isOwnedByThisProcessesUid() throws Exception {
    // the JDK opens dual-stack sockets, listed in tcp6 with v4-mapped addresses, as Netty's epoll does
    try (ServerSocket server = new ServerSocket(0, 1, InetAddress.getByName("127.0.0.1"));
         Socket client = new Socket(InetAddress.getByName("127.0.0.1"), server.getLocalPort());
         Socket accepted = server.accept()) {
      InetSocketAddress peer = (InetSocketAddress) accepted.getRemoteSocketAddress();
      InetSocketAddress self = (InetSocketAddress) accepted.getLocalSocketAddress();
      assertEquals(IdentityPolicy.currentUid(), LoopbackPeers.ownerOf(peer, self));
    }
  }
}
