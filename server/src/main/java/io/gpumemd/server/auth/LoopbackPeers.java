package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.Grpc;
import io.grpc.ServerTransportFilter;
import java.net.Inet4Address;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.file.Path;
import java.util.List;
import java.util.Locale;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Identifies TCP peers on this host the way identd does: the client's end of a connection to
 * this daemon is a socket in the same network namespace, and the kernel lists its owner's uid
 * in {@code /proc/net/tcp} (or {@code tcp6}). Such a peer becomes a {@link Caller} exactly like
 * a Unix-socket peer of that uid (without a pid). A peer not found there is on another host and
 * stays unidentified unless it presents a token or a client certificate.
 *
 * <p>Runs once per accepted connection, on its event loop; the lookup reads one small file.
 * Thread-safe (stateless apart from the immutable policy).
 */
public final class LoopbackPeers extends ServerTransportFilter {
  private static final Logger log = LoggerFactory.getLogger(LoopbackPeers.class);

  private final IdentityPolicy policy;

  public LoopbackPeers(IdentityPolicy policy) {
    this.policy = policy;
  }

  @Override
  public Attributes transportReady(Attributes attributes) {
    if (attributes.get(Callers.PEER) != null) {
      return attributes; // a Unix-socket peer, already identified
    }
    SocketAddress remote = attributes.get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR);
    SocketAddress local = attributes.get(Grpc.TRANSPORT_ATTR_LOCAL_ADDR);
    if (!(remote instanceof InetSocketAddress peer) || !(local instanceof InetSocketAddress self)) {
      return attributes;
    }
    int uid = ownerOf(peer, self);
    if (uid < 0) {
      return attributes;
    }
    Caller caller = policy.loopbackPeer(uid, hostPort(peer));
    log.debug("TCP connection from {}", caller);
    return attributes.toBuilder().set(Callers.PEER, caller).build();
  }

  static String hostPort(InetSocketAddress address) {
    return address.getAddress().getHostAddress() + ":" + address.getPort();
  }

  /**
   * The uid that owns the socket {@code peer -> self} in this network namespace, or -1 when
   * there is none (the peer is on another host). An IPv4 connection is listed in {@code tcp},
   * or, when either end uses a dual-stack IPv6 socket (Netty's epoll transport does), in {@code
   * tcp6} as an IPv4-mapped address.
   */
  static int ownerOf(InetSocketAddress peer, InetSocketAddress self) {
    if (peer.getAddress() instanceof Inet4Address) {
      int uid = find(Path.of("/proc/net/tcp"), encode(peer, false), encode(self, false));
      return uid >= 0 ? uid : find(Path.of("/proc/net/tcp6"), encode(peer, true), encode(self, true));
    }
    return find(Path.of("/proc/net/tcp6"), encode(peer, false), encode(self, false));
  }

  private static int find(Path table, String wantLocal, String wantRemote) {
    List<String> lines = IdentityPolicy.lines(table);
    String pair = wantLocal + " " + wantRemote;
    for (int i = 1; i < lines.size(); i++) {
      // The table has a line per socket of the namespace: only the one line that names this
      // connection is split, not every line of a busy host.
      if (!lines.get(i).contains(pair)) {
        continue;
      }
      String[] f = lines.get(i).trim().split("\\s+");
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
      if (f.length > 7 && f[1].equals(wantLocal) && f[2].equals(wantRemote)) {
        try {
          return Integer.parseInt(f[7]);
        } catch (NumberFormatException e) {
          return -1;
        }
      }
    }
    return -1;
  }

  /**
   * An address as {@code /proc/net/tcp} prints it: the address as 32-bit words in host byte
   * order (little-endian on every platform this runs on), then the port in hex; {@code mapped}
   * writes an IPv4 address as {@code ::ffff:a.b.c.d}, as {@code tcp6} lists it.
   */
  static String encode(InetSocketAddress address, boolean mapped) {
    byte[] bytes = address.getAddress().getAddress();
    if (mapped) {
      byte[] v6 = new byte[16];
      v6[10] = (byte) 0xff;
      v6[11] = (byte) 0xff;
      System.arraycopy(bytes, 0, v6, 12, 4);
      bytes = v6;
    }
    StringBuilder out = new StringBuilder();
    for (int word = 0; word < bytes.length; word += 4) {
      for (int b = 3; b >= 0; b--) {
        out.append(String.format(Locale.ROOT, "%02X", bytes[word + b] & 0xff));
      }
    }
    return out.append(String.format(Locale.ROOT, ":%04X", address.getPort())).toString();
  }
}
