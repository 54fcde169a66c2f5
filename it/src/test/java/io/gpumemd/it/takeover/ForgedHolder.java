package io.gpumemd.it.takeover;

import io.gpumemd.proto.takeover.v1.State;
import io.gpumemd.proto.takeover.v1.TakeOverFrame;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;

/**
 * A squatter on a take-over path ({@code ForgedHolder PATH}), run by the tests as another user:
 * listens where no daemon does, and answers the first Hello with a forged, empty state. Prints
 * {@code LISTENING}, then {@code HELLO <pid>} if a taker spoke to it, and {@code CLOSED} when the
 * taker left.
 */
public final class ForgedHolder {
  private ForgedHolder() {}

  public static void main(String[] args) throws Exception {
    Path path = Path.of(args[0]);
    try (ServerSocketChannel server = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
      server.bind(UnixDomainSocketAddress.of(path));
      Files.setPosixFilePermissions(path, PosixFilePermissions.fromString("rwxrwxrwx"));
      System.out.println("LISTENING");
      System.out.flush();
      SocketChannel connection = server.accept();
      try (TakeOverPeer taker = TakeOverPeer.of(connection)) {
        TakeOverFrame hello = taker.receive();
        if (hello != null) {
          System.out.println("HELLO " + hello.getHello().getPid());
          System.out.flush();
          taker.send(TakeOverFrame.newBuilder().setState(State.newBuilder().setPid((int) ProcessHandle.current().pid())
              .setVersion("forged")).build());
          while (taker.receive() != null) {
            // read what the taker says until it leaves
          }
        }
      }
      System.out.println("CLOSED");
    } finally {
      Files.deleteIfExists(path);
    }
  }
}
