package io.gpumemd.server.auth;

import io.grpc.Attributes;
import io.grpc.Grpc;
import io.grpc.ServerTransportFilter;
import java.net.Inet4Address;
import java.net.Inet6Address;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.UnknownHostException;
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
   * there is none (the peer is on another host). An IPv4 peer's socket may be an IPv6 one
   * (Netty's epoll transport opens dual-stack sockets): it is then listed in {@code tcp6} with
   * v4-mapped addresses ({@code ::ffff:127.0.0.1}), so both tables are searched.
   */
  static int ownerOf(InetSocketAddress peer, InetSocketAddress self) {
    if (peer.getAddress() instanceof Inet4Address && self.getAddress() instanceof Inet4Address) {
      int uid = ownerIn("/proc/net/tcp", encode(peer), encode(self));
      return uid >= 0 ? uid : ownerIn("/proc/net/tcp6", encode(v4Mapped(peer)), encode(v4Mapped(self)));
    }
    return ownerIn("/proc/net/tcp6", encode(peer), encode(self));
  }

  private static int ownerIn(String table, String wantLocal, String wantRemote) {
    List<String> lines = IdentityPolicy.lines(Path.of(table));
    for (int i = 1; i < lines.size(); i++) {
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

  /** {@code ::ffff:a.b.c.d} for an IPv4 address, as a dual-stack socket reports it. */
  static InetSocketAddress v4Mapped(InetSocketAddress v4) {
    byte[] mapped = new byte[16];
    mapped[10] = (byte) 0xff;
    mapped[11] = (byte) 0xff;
    System.arraycopy(v4.getAddress().getAddress(), 0, mapped, 12, 4);
    try {
      // getByAddress would turn a v4-mapped address back into an Inet4Address
      return new InetSocketAddress(Inet6Address.getByAddress(null, mapped, -1), v4.getPort());
    } catch (UnknownHostException e) {
      throw new IllegalStateException("16 bytes are an IPv6 address", e);
    }
  }

  /**
   * An address as {@code /proc/net/tcp} prints it: the address as 32-bit words in host byte
   * order (little-endian on every platform this runs on), then the port in hex.
   */
  static String encode(InetSocketAddress address) {
    InetAddress ip = address.getAddress();
    byte[] bytes = ip.getAddress();
    StringBuilder out = new StringBuilder();
    for (int word = 0; word < bytes.length; word += 4) {
      for (int b = 3; b >= 0; b--) {
        out.append(String.format(Locale.ROOT, "%02X", bytes[word + b] & 0xff));
      }
    }
    return out.append(String.format(Locale.ROOT, ":%04X", address.getPort())).toString();
  }
}
